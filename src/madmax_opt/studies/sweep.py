"""Batch optimisation: a sweep file -> one problem per combination -> OUTDIR/results.jsonl + results.csv.

A sweep names models, task(s), hardware entries (catalog systems, globs such as ``cloud-*`` or ``all``,
GPU names, inline systems) with cluster sizes, objectives and shared constraints. Every (model, task, system,
size, objective) is one single-option problem solved by the CP-SAT solver (one CP-SAT worker: deterministic).
With one hardware option per problem the plan that minimises the step time also minimises $ per token and time
to train, so the union of the per-problem optima holds the exact time-versus-cost Pareto front of the sweep.

Safety: the whole sweep is validated before any work starts; every finished problem is appended as one JSON
line (write + flush + fsync), so an interrupt loses only problems in flight; a rerun skips keys already in the
file (a truncated last line from a crash is dropped); a failing problem is recorded with its error and the
sweep goes on.
"""

from __future__ import annotations

import csv
import fcntl
import fnmatch
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import (
    Task as ProgressTask,
)
from rich.text import Text

from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.io import catalog
from madmax_opt.io.problem import check_space, problem_from_dict, resolve_model
from madmax_opt.io.problem_file import GpuRange, HFConfig, ModelRef, cluster_sizes
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.plan_settings import degree_settings
from madmax_opt.model.spec import Objective, Space, Stack, Strict, System, Task, TransformerModel

MAX_SWEEP_PROBLEMS = 100_000  # combinations one sweep file may expand to (the 500-problem benchmark: ~3 min)
KEY_VERSION = 1  # bump when the meaning of a combination changes; old rows then no longer match
RESULTS_FILE = "results.jsonl"
TABLE_FILE = "results.csv"
MANIFEST_FILE = "sweep.json"


# ------------------------------------------------------------------------------------------ sweep file


class SweepHardware(Strict):
    """Catalog system name or glob (``cloud-*``, ``all``), an inline system, or a GPU name."""

    system: str | System | None = Field(
        None, description="catalog name, glob pattern ('all' = every system), or inline"
    )
    gpu: str | None = Field(None, description="GPU name: its standard system (e.g. h100-sxm -> dgx-h100)")
    gpus: PositiveInt | Annotated[list[PositiveInt], Field(min_length=1)] | GpuRange = Field(
        description="cluster size(s) in GPUs: one, a list, or {start, stop, step}"
    )

    @model_validator(mode="after")
    def _one_of(self) -> SweepHardware:
        if (self.system is None) == (self.gpu is None):
            raise ValueError("give exactly one of 'system' or 'gpu'")
        return self

    def sizes(self) -> list[int]:
        return cluster_sizes(self.gpus)


class SweepConstraints(Strict):
    """Shared constraints; ``deadline_hours`` and ``budget_usd`` need ``task.train_tokens``."""

    max_gpus: PositiveInt | None = None
    max_cost_per_hour: PositiveFloat | None = Field(None, description="US$ per hour for the whole job")
    min_throughput: PositiveFloat | None = Field(None, description="tokens/s")
    deadline_hours: PositiveFloat | None = Field(
        None, description="train task.train_tokens within this many hours"
    )
    budget_usd: PositiveFloat | None = Field(
        None, description="train task.train_tokens for at most this many US$"
    )


class SolverSettings(Strict):
    top_k: PositiveInt = Field(1, description="plans kept per problem")
    time_limit_s: PositiveFloat = Field(60.0, description="CP-SAT time limit per problem")


class SweepFile(Strict):
    """The YAML sweep file (``madmax-opt sweep``)."""

    title: str = Field("", description="heading of the report (default: the sweep file's path)")
    description: str = Field("", description="free text copied to the top of the report")
    models: list[ModelRef] = Field(
        min_length=1, description="catalog names, {hf_config: path} or inline models"
    )
    task: Task | list[Task] = Field(
        description="one task or a list of tasks (each is crossed with every model)"
    )
    hardware: list[SweepHardware] = Field(min_length=1)
    objectives: list[Objective] = Field(["throughput"], min_length=1)
    space: Space = Space()
    stack: Stack = Stack()
    constraints: SweepConstraints = SweepConstraints()
    baseline: bool = Field(
        True, description="evaluate the MAD-Max baseline (FSDP over all GPUs) of every problem"
    )
    solver: SolverSettings = SolverSettings()
    calibration: str | None = Field(
        None, description="overlay file written by `madmax-opt calibrate` (relative to this file), for every problem"
    )

    @model_validator(mode="after")
    def _tasks_not_empty(self) -> SweepFile:
        if isinstance(self.task, list) and not self.task:
            raise ValueError("task: the list of tasks is empty")
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives: listed twice: {self.objectives}")
        return self

    def tasks(self) -> list[Task]:
        return self.task if isinstance(self.task, list) else [self.task]


# ------------------------------------------------------------------------------------------ combinations


@dataclass(frozen=True)
class Combination:
    """One problem of the sweep: the problem-file mapping, what it stands for, and its stable key."""

    key: str
    label: dict[str, Any]  # model, task, system, gpu, gpus, objective (+ node, price, power, train_tokens)
    problem: dict[str, Any]  # a problem-file mapping for ``problem_from_dict``


@dataclass(frozen=True)
class Sweep:
    path: str
    spec: SweepFile
    combinations: tuple[Combination, ...]
    validate_s: float = 0.0  # reading, expanding and checking every combination


def combination_key(problem: dict[str, Any], solver: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of problem mapping + solver settings: stable across runs and machines."""
    blob = json.dumps(
        {"v": KEY_VERSION, "problem": problem, "solver": solver}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def madmax_baseline(system: str, gpus: int) -> dict[str, Any]:
    """MAD-Max style baseline: FSDP (ZeRO-3) data parallel over all GPUs, no TP/PP, mbs 1, full recompute."""
    return {"dp": gpus, "tp": 1, "pp": 1, "cp": 1, "zero": 3, "mbs": 1, "recompute": "full", "system": system}


def min_throughput_tokens_per_s(
    cons: SweepConstraints, train_tokens: float | None, price_per_hour: float
) -> float | None:
    """Tightest of min_throughput, tokens / deadline_s, tokens * $/h / (3600 budget) (one hardware option)."""
    bounds = [cons.min_throughput] if cons.min_throughput is not None else []
    if cons.deadline_hours is not None and train_tokens is not None:
        bounds.append(train_tokens / (cons.deadline_hours * SECONDS_PER_HOUR))  # hours = tokens / tps / 3600
    if cons.budget_usd is not None and train_tokens is not None and price_per_hour > 0:
        bounds.append(train_tokens * price_per_hour / (SECONDS_PER_HOUR * cons.budget_usd))  # $ = hours x $/h
    return max(bounds) if bounds else None


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate the whole sweep (every combination resolved and checked) before any work starts."""
    t0 = time.perf_counter()
    file = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        keys = ", ".join(SweepFile.model_fields)
        raise ProblemError(f"expected a mapping with keys {{{keys}}}", file=file)
    spec: SweepFile = validate(SweepFile, data, file=file)
    check_space(spec.space, file=file)
    if spec.calibration is not None:  # every problem names the overlay by its absolute path
        spec = spec.model_copy(update={"calibration": str((Path(file).parent / spec.calibration).resolve())})
    combinations = tuple(expand(spec, file))
    return Sweep(path=file, spec=spec, combinations=combinations, validate_s=time.perf_counter() - t0)


def _model_entry(ref: str | HFConfig | TransformerModel) -> str | dict[str, Any]:
    if isinstance(ref, str):
        return ref
    return ref.model_dump(mode="json", exclude_defaults=True)


def _systems(entry: SweepHardware, *, file: str, field: str) -> list[System]:
    if isinstance(entry.system, System):
        return [entry.system]
    if entry.gpu is not None:
        return [catalog.standard_system(entry.gpu, file=file, field=f"{field}.gpu")]
    assert entry.system is not None
    pattern = "*" if entry.system == "all" else entry.system
    names = [n for n in catalog.systems() if fnmatch.fnmatchcase(n, pattern)]
    if not names:
        allowed = ", ".join(["all", *catalog.systems()])
        raise ProblemError(
            f"unknown system {entry.system!r}; allowed: {allowed} or a glob such as 'cloud-*'",
            file=file,
            field=f"{field}.system",
        )
    return [catalog.systems()[n] for n in names]


def expand(spec: SweepFile, file: str) -> Iterator[Combination]:
    """Cross models x tasks x hardware (system, size) x objectives; check each combination."""
    from madmax_opt.search.space import knob_values

    tasks = spec.tasks()
    solver = spec.solver.model_dump(mode="json")
    models = [_resolved(m, file, f"models[{i}]") for i, m in enumerate(spec.models)]
    names = [m.name for m in models]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ProblemError(
                f"model name {name!r} is used twice (also models[{names.index(name)}]); "
                "allowed: distinct models (give inline models distinct names)",
                file=file,
                field=f"models[{i}]",
            )
    for t, task in enumerate(tasks):
        if "time_to_train" in spec.objectives and task.train_tokens is None:
            where = f"task[{t}].train_tokens" if isinstance(spec.task, list) else "task.train_tokens"
            raise ProblemError(
                "missing; objective time_to_train needs the token budget", file=file, field=where
            )
        for cons in ("deadline_hours", "budget_usd"):
            if getattr(spec.constraints, cons) is not None and task.train_tokens is None:
                where = f"task[{t}].train_tokens" if isinstance(spec.task, list) else "task.train_tokens"
                raise ProblemError(
                    f"needs {where} (the token budget)", file=file, field=f"constraints.{cons}"
                )
    points = _hardware_points(spec, file)
    _check_count(len(models) * len(tasks) * len(points) * len(spec.objectives), file)
    for mi, (mref, model) in enumerate(zip(spec.models, models, strict=True)):
        for t, task in enumerate(tasks):
            for hfield, system, system_ref, n in points:
                for objective in spec.objectives:
                    c = _combination(spec, mref, model, t, task, system, system_ref, n, objective, solver)
                    problem = _checked_problem(c, file, f"{hfield} x models[{mi}]")
                    for option in problem.hardware:
                        knob_values(problem, option)  # space errors name the file and space.<knob>
                    yield c


HardwarePoint = tuple[str, System, "str | dict[str, Any]", int]  # field, system, its reference, GPUs


def _hardware_points(spec: SweepFile, file: str) -> list[HardwarePoint]:
    """Every (system, cluster size) of the hardware entries, each once, whole nodes only."""
    points: list[HardwarePoint] = []
    seen: dict[tuple[str, int], str] = {}
    for h, entry in enumerate(spec.hardware):
        hfield = f"hardware[{h}]"
        for system in _systems(entry, file=file, field=hfield):
            ref = system.model_dump(mode="json") if isinstance(entry.system, System) else system.name
            for n in entry.sizes():
                per_node = system.gpus_per_node
                if n % per_node and per_node % n:
                    raise ProblemError(
                        f"{n} GPUs is not a whole number of {system.name} nodes ({per_node} GPUs each); "
                        f"allowed: multiples or divisors of {per_node}",
                        file=file,
                        field=f"{hfield}.gpus",
                    )
                if (system.name, n) in seen:
                    raise ProblemError(
                        f"{system.name} at {n} GPUs is listed twice (also in {seen[(system.name, n)]}); "
                        "allowed: each system and size once",
                        file=file,
                        field=hfield,
                    )
                seen[(system.name, n)] = hfield
                points.append((hfield, system, ref, n))
                _check_count(len(points), file)
    return points


def _check_count(problems: int, file: str) -> None:
    if problems > MAX_SWEEP_PROBLEMS:
        raise ProblemError(f"{problems:,} problems or more (models x tasks x systems x sizes x objectives); "
                           f"allowed: at most {MAX_SWEEP_PROBLEMS:,} per sweep file (split it)", file=file)


def _combination(
    spec: SweepFile,
    mref: str | HFConfig | TransformerModel,
    model: TransformerModel,
    t: int,
    task: Task,
    system: System,
    system_ref: str | dict[str, Any],
    n: int,
    objective: str,
    solver: dict[str, Any],
) -> Combination:
    price_per_hour = system.price_per_gpu_hour * n
    constraints = spec.constraints.model_dump(mode="json", exclude_none=True)
    constraints.pop("deadline_hours", None)
    constraints.pop("budget_usd", None)
    floor = min_throughput_tokens_per_s(spec.constraints, task.train_tokens, price_per_hour)
    if floor is not None:
        constraints["min_throughput"] = floor
    problem: dict[str, Any] = {
        "model": _model_entry(mref),
        "hardware": {"system": system_ref, "gpus": n},
        "task": task.model_dump(mode="json", exclude_defaults=True),
        "space": spec.space.model_dump(mode="json", exclude_defaults=True),
        "stack": spec.stack.model_dump(mode="json", exclude_defaults=True),
        "objective": objective,
        "constraints": constraints,
    }
    if spec.baseline:
        problem["baseline"] = madmax_baseline(system.name, n)
    if spec.calibration is not None:
        problem["calibration"] = spec.calibration
    label = {
        "model": model.name,
        "task": t,
        "system": system.name,
        "gpu": system.gpu,
        "gpus": n,
        "objective": objective,
        "gpus_per_node": system.gpus_per_node,
        "price_per_gpu_hour": system.price_per_gpu_hour,
        "power_w_per_gpu": system.power_w_per_gpu,
        "train_tokens": task.train_tokens,
        "seq_len": task.seq_len,
        "global_batch": task.global_batch,
    }
    return Combination(key=combination_key(problem, solver), label=label, problem=problem)


def _bare(exc: ProblemError) -> str:
    """The message of a ProblemError without its 'file: field: ' prefix."""
    where = ": ".join(part for part in (exc.file, exc.field) if part)
    return str(exc).removeprefix(f"{where}: ") if where else str(exc)


def _resolved(ref: str | HFConfig | TransformerModel, file: str, field: str) -> TransformerModel:
    from madmax_opt.io.dlrm_problem import dlrm_models

    if isinstance(ref, str) and ref in dlrm_models():
        raise ProblemError(f"{ref!r} is a recommender; sweep files cover transformer training problems (solve "
                           "each DLRM problem file instead); allowed: a transformer catalog name or an inline "
                           "model", file=file, field=field)
    try:
        return resolve_model(ref, file=file)
    except ProblemError as exc:
        raise ProblemError(_bare(exc), file=file, field=field) from None


def _checked_problem(c: Combination, file: str, where: str) -> Any:
    try:
        return problem_from_dict(c.problem, source=file)
    except ProblemError as exc:
        what = f"{c.label['model']} on {c.label['gpus']} x {c.label['system']} ({c.label['objective']})"
        inner = f"{exc.field}: {_bare(exc)}" if exc.field else _bare(exc)
        raise ProblemError(f"invalid combination {what}: {inner}", file=file, field=where) from None


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
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # everything after the last newline is a partial write
    rows: dict[str, dict[str, Any]] = {}
    bad = 0
    for line in data[:end].splitlines():
        try:
            row = json.loads(line)
            rows.setdefault(row["key"], row)
        except (ValueError, KeyError, TypeError):
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


# ------------------------------------------------------------------------------------------ execution


Job = tuple[str, dict[str, Any], dict[str, Any]]  # key, label, problem
OnRow = Callable[[dict[str, Any]], None]
SolveFn = Callable[[str, dict[str, Any], dict[str, Any], str, dict[str, Any]], dict[str, Any]]


def error_row(job: Job, kind: str, message: str) -> dict[str, Any]:
    """The row of a problem that could not be solved because its worker failed (not the problem itself)."""
    key, label, _ = job
    return {
        "key": key,
        "combination": label,
        "status": "error",
        "result": None,
        "wall_s": 0.0,
        "error": {"type": kind, "message": message},
    }


PARENT_POLL_S = 0.5  # how often a worker checks that the sweep process is still alive
PR_SET_PDEATHSIG = 1  # linux/prctl.h: signal this process when its parent dies


def _worker_init(parent_pid: int) -> None:
    """Pool workers leave Ctrl-C to the parent, which stops them and records what finished; and they exit when
    the sweep process dies however it dies (SIGKILL included): on Linux the kernel sends them SIGKILL
    (PR_SET_PDEATHSIG), everywhere a daemon thread polls the parent pid. With the workers gone, the
    multiprocessing resource tracker (whose pipe they held) sees end-of-file and exits too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no libc prctl: the polling thread below still applies
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # the sweep is gone: nobody will read this worker's result


def run_local(
    todo: list[Job],
    source: str,
    solver: dict[str, Any],
    workers: int,
    on_row: OnRow,
    fn: SolveFn | None = None,
) -> None:
    """A pool of spawned processes, at most 4 queued problems per worker (an interrupt loses little).

    A worker that dies (killed for memory, a crash in native code) breaks the pool: the problems that were in
    flight are then run one by one in a fresh one-worker pool, so the one that kills its worker is recorded as
    an error and the others are solved normally.
    """
    fn = fn or solve_one
    if workers == 1:
        for key, label, problem in todo:
            on_row(fn(key, label, problem, source, solver))
        return
    queue = deque(todo)
    while queue:
        suspects = _run_pool(queue, source, solver, workers, on_row, fn)
        for t in suspects:
            on_row(_isolated(t, source, solver, fn))


def _new_pool(workers: int) -> ProcessPoolExecutor:
    import multiprocessing

    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
        initargs=(os.getpid(),),
    )


def _run_pool(
    queue: deque[Job], source: str, solver: dict[str, Any], workers: int, on_row: OnRow, fn: SolveFn
) -> list[Job]:
    """Run the queue on one pool until it is empty or the pool breaks; returns the problems then in flight."""
    pool = _new_pool(workers)
    pending: dict[Future[dict[str, Any]], Job] = {}
    try:
        while queue or pending:
            while queue and len(pending) < 4 * workers:
                t = queue.popleft()
                try:
                    pending[pool.submit(fn, t[0], t[1], t[2], source, solver)] = t
                except BrokenProcessPool:
                    queue.appendleft(t)
                    return list(pending.values())
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                exc = fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    broken = True  # stays pending: it is rerun alone
                    continue
                job = pending.pop(fut)
                on_row(fut.result() if exc is None else error_row(job, type(exc).__name__, _one_line(exc)))
            if broken:
                return list(pending.values())
        return []
    finally:
        _stop(pool)


def _isolated(t: Job, source: str, solver: dict[str, Any], fn: SolveFn) -> dict[str, Any]:
    """One problem alone in a one-worker pool: if the worker dies, the row records that."""
    pool = _new_pool(1)
    try:
        return pool.submit(fn, t[0], t[1], t[2], source, solver).result()
    except BrokenProcessPool:
        return error_row(t, "WorkerDied", "the worker process died while solving this problem")
    finally:
        _stop(pool)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down now: cancel queued work and terminate the worker processes this pool started."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=5)


def run_ray(
    todo: list[Job],
    source: str,
    solver: dict[str, Any],
    workers: int | None,
    address: str | None,
    on_row: OnRow,
) -> None:
    """The same problems as Ray tasks on an existing cluster (``address``; a running ray.init is reused)."""
    try:
        import ray
    except ImportError:
        raise ProblemError(
            "the ray backend needs ray: pip install 'madmax-opt[ray]'", field="--backend"
        ) from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        window = 4 * (workers or max(int(ray.cluster_resources().get("CPU", 1)), 1))
        remote = ray.remote(num_cpus=1, max_retries=1)(solve_one)
        queue = list(reversed(todo))
        pending: dict[Any, Job] = {}
        try:
            while queue or pending:
                while queue and len(pending) < window:
                    t = queue.pop()
                    pending[remote.remote(t[0], t[1], t[2], source, solver)] = t
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    t = pending.pop(ref)
                    try:
                        on_row(ray.get(ref))
                    except ray.exceptions.RayError as exc:
                        on_row(error_row(t, type(exc).__name__, _one_line(exc)[:500]))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()


class _Rate(ProgressColumn):
    def render(self, task: ProgressTask) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.1f}/s" if speed else "-/s", style="progress.data.speed")


@dataclass
class Counts:
    ok: int = 0
    infeasible: int = 0
    error: int = 0

    def add(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    def text(self) -> str:
        return f"ok {self.ok}  infeasible {self.infeasible}  error {self.error}"


@dataclass
class SweepRun:
    """What one invocation did (also stored in the manifest for the report)."""

    total: int
    skipped: int
    solved: int = 0
    counts: Counts = field(default_factory=Counts)
    wall_s: float = 0.0
    interrupted: str | None = None  # "SIGINT" or "SIGTERM"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so that the sweep stops the same way as on Ctrl-C."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def run_sweep(
    sweep: Sweep,
    outdir: Path,
    *,
    workers: int | None = None,
    backend: Literal["local", "ray"] = "local",
    address: str | None = None,
    restart: bool = False,
    retry_errors: bool = False,
    command: str | None = None,
    console: Console | None = None,
) -> SweepRun:
    """Solve every combination not yet in ``outdir/results.jsonl``; safe to interrupt and rerun."""
    console = console or Console(stderr=True)
    outdir.mkdir(parents=True, exist_ok=True)
    lock = os.open(
        outdir, os.O_RDONLY
    )  # an exclusive lock on the directory itself: one sweep writes at a time
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise ProblemError(
            "another sweep is writing to this directory", file=str(outdir), field="--out"
        ) from None
    try:
        return _run_locked(sweep, outdir, workers, backend, address, restart, retry_errors, command, console)
    finally:
        os.close(lock)


def _run_locked(
    sweep: Sweep,
    outdir: Path,
    workers: int | None,
    backend: str,
    address: str | None,
    restart: bool,
    retry_errors: bool,
    command: str | None,
    console: Console,
) -> SweepRun:
    results = outdir / RESULTS_FILE
    if restart and results.exists():
        results.unlink()
    rows = read_rows(results, repair=True)
    if retry_errors and any(r["status"] == "error" for r in rows.values()):
        rows = {k: r for k, r in rows.items() if r["status"] != "error"}
        rewrite_rows(results, rows.values())
    wanted = {c.key for c in sweep.combinations}
    todo = [(c.key, c.label, c.problem) for c in sweep.combinations if c.key not in rows]
    run = SweepRun(total=len(sweep.combinations), skipped=len(wanted & rows.keys()))
    n_workers = workers or os.cpu_count() or 1
    manifest: dict[str, Any] = {
        "sweep_file": sweep.path,
        "title": sweep.spec.title,
        "description": sweep.spec.description,
        "command": command,
        "objectives": list(sweep.spec.objectives),
        "keys": [c.key for c in sweep.combinations],
        "run": None,
    }
    write_json(outdir / MANIFEST_FILE, manifest)
    solver = sweep.spec.solver.model_dump(mode="json")
    log = ResultsLog(results)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    progress = Progress(
        TextColumn("[bold]sweep[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        _Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )
    t0 = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        log.append(row)
        rows[row["key"]] = row
        run.solved += 1
        run.counts.add(row["status"])
        progress.update(bar, advance=1, counts=run.counts.text())

    try:
        with progress:
            bar = progress.add_task("sweep", total=run.total, completed=run.skipped, counts=run.counts.text())
            if backend == "ray":
                run_ray(todo, sweep.path, solver, workers, address, on_row)
            else:
                run_local(todo, sweep.path, solver, min(n_workers, max(len(todo), 1)), on_row)
    except KeyboardInterrupt as exc:
        run.interrupted = "SIGTERM" if isinstance(exc, _Terminated) else "SIGINT"
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
        log.close()
        run.wall_s = time.perf_counter() - t0
        ordered = [rows[k] for k in manifest["keys"] if k in rows]
        write_table(outdir / TABLE_FILE, ordered)
        manifest["run"] = {
            "backend": backend,
            "workers": n_workers,
            "cpu_count": os.cpu_count(),
            "total": run.total,
            "skipped": run.skipped,
            "solved": run.solved,
            "wall_s": run.wall_s,
            "interrupted": run.interrupted,
            "counts": vars(run.counts),
            "python": sys.version.split()[0],
            "validate_s": sweep.validate_s,
            "load_avg_1m_at_end": os.getloadavg()[0],
        }
        write_json(outdir / MANIFEST_FILE, manifest)
    return run


# ------------------------------------------------------------------------------------------ command




__all__ = [
    "Sweep",
    "SweepFile",
    "comparable",
    "load_sweep",
    "read_rows",
    "run_sweep",
    "solve_one",
]
