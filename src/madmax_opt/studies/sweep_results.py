"""Sweep results: one problem solved into a row, the results log (JSON lines, fsync'd, repaired after a crash),
the CSV table and the manifest."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from madmax_opt.core.errors import InfeasibleError
from madmax_opt.io.limits import MAX_RESULTS_BYTES
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.yaml_files import read_input_bytes
from madmax_opt.model.plan_settings import degree_settings
from madmax_opt.studies.sweep_schema import is_row

# ------------------------------------------------------------------------------------------ one problem


def solve_one(
    key: str, label: dict[str, Any], problem: dict[str, Any], source: str, solver: dict[str, Any]
) -> dict[str, Any]:
    """Solve one combination; never raises: an infeasible or failing problem becomes a row with its error."""
    from madmax_opt.search.result import solve_result  # the solve JSON of `madmax-opt solve --json`

    t0 = time.perf_counter()
    row: dict[str, Any] = {"key": key, "combination": label, "status": "ok", "result": None, "error": None}
    try:
        p = problem_from_dict(problem, source=source)
        row["result"] = finite(solve_result(p, int(solver["top_k"]), float(solver["time_limit_s"]), 1))
    except InfeasibleError as exc:
        row["status"], row["error"] = "infeasible", {"type": "InfeasibleError", "message": _one_line(exc)}
    except (
        Exception
    ) as exc:  # recorded, never fatal: the sweep goes on (KeyboardInterrupt is not an Exception)
        row["status"], row["error"] = "error", {"type": type(exc).__name__, "message": _one_line(exc)}
    row["wall_s"] = time.perf_counter() - t0
    return row


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def finite(x: Any) -> Any:
    """JSON lines are strict JSON: NaN and infinities (e.g. an unknown solver bound) become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


TIMING_FIELDS = ("wall_s",)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A row without wall-clock times: what must be identical across backends and reruns."""
    out = {k: v for k, v in row.items() if k not in TIMING_FIELDS}
    if out.get("result"):
        out["result"] = dict(
            out["result"], solver={k: v for k, v in out["result"]["solver"].items() if "wall" not in k}
        )
    return out


# ------------------------------------------------------------------------------------------ results file


def read_rows(path: Path, *, repair: bool = False) -> dict[str, dict[str, Any]]:
    """Rows by key; a last line without its newline (cut by a crash) is ignored (cut off by ``repair``)."""
    if not path.exists() and not path.is_symlink():
        return {}
    data = read_input_bytes(path, what="sweep results", file=str(path), max_bytes=MAX_RESULTS_BYTES)
    end = data.rfind(b"\n") + 1  # everything after the last newline is a partial write
    rows: dict[str, dict[str, Any]] = {}
    bad = 0
    for line in data[:end].splitlines():
        try:
            row = json.loads(line)
            if not is_row(row):  # valid JSON of the wrong shape (a hand edit, another tool): solved again
                raise ValueError("not a result row")
            rows.setdefault(row["key"], row)
        except (ValueError, KeyError, TypeError, RecursionError):
            bad += 1
    if repair and (end < len(data) or bad or len(rows) != data[:end].count(b"\n")):
        if bad == 0 and data[:end].count(b"\n") == len(rows):
            os.truncate(path, end)  # only a torn tail: cut it in place
        else:
            rewrite_rows(path, rows.values())
    return rows


def rewrite_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Atomically replace the results file (temp file + fsync + rename)."""
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResultsLog:
    """Append-only JSON lines; each line is written, flushed and fsynced before its problem counts as done."""

    def __init__(self, path: Path) -> None:
        self._f: IO[str] = path.open("a")

    def append(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, sort_keys=True, allow_nan=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


CSV_COLUMNS = (
    "key",
    "model",
    "task",
    "system",
    "gpu",
    "gpus",
    "objective",
    "status",
    "error",
    *degree_settings(),  # the plan settings, from the plan-settings registry
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "cost_per_hour_usd",
    "usd_per_million_tokens",
    "memory_bytes_per_gpu",
    "time_to_train_h",
    "cost_to_train_usd",
    "energy_mwh",
    "tokens_per_joule",
    "baseline_tokens_per_s",
    "baseline_infeasible_reason",
    "speedup_vs_baseline",
)


def table_row(row: dict[str, Any]) -> dict[str, Any]:
    """Flat CSV columns of one result row (SI units, hours for time to train)."""
    c = row["combination"]
    out: dict[str, Any] = {k: c.get(k) for k in ("model", "task", "system", "gpu", "gpus", "objective")}
    out |= {"key": row["key"], "status": row["status"], "error": (row.get("error") or {}).get("message")}
    res = row.get("result")
    if res:
        best = res["best"]
        out |= {k: best["plan"].get(k) for k in degree_settings()}  # every training plan setting (ep included)
        out |= {
            k: best[k]
            for k in ("step_time_s", "tokens_per_s", "mfu", "cost_per_hour_usd", "usd_per_million_tokens")
        }
        out["tokens_per_s_per_gpu"] = best["tokens_per_s"] / c["gpus"]
        out["memory_bytes_per_gpu"] = best["memory_bytes_per_gpu"]["total"]
        out["tokens_per_joule"] = tokens_per_joule(best["tokens_per_s"], c["gpus"], c["power_w_per_gpu"])
        tt = best.get("time_to_train")
        if tt:
            out |= {
                "time_to_train_h": tt["hours"],
                "cost_to_train_usd": tt["cost_usd"],
                "energy_mwh": tt["energy_mwh"],
            }
        base = res.get("baseline")
        if base:
            out["baseline_tokens_per_s"] = base["tokens_per_s"] if base["feasible"] else None
            out["baseline_infeasible_reason"] = base["infeasible_reason"]
        out["speedup_vs_baseline"] = res.get("speedup_vs_baseline")
    return out


def tokens_per_joule(tokens_per_s: float, gpus: int, power_w_per_gpu: float) -> float:
    """tokens/J = (tokens/s) / (GPUs x W per GPU incl. host share)."""
    return tokens_per_s / (gpus * power_w_per_gpu)


def write_table(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow(table_row(row))
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
