"""Sweep report: Pareto fronts, best plans, speedups over the MAD-Max baseline, PNG plots (madmax-opt report).

Reads ``OUTDIR/results.jsonl`` and ``OUTDIR/sweep.json`` written by ``madmax-opt sweep``; only rows of the
sweep's current combinations are used. Human units (hours, US$, GB) appear only here, at the edge."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.model.plan_settings import plan_text
from madmax_opt.studies.sweep_results import tokens_per_joule
from madmax_opt.studies.sweep_schema import load_folder
from madmax_opt.studies.sweep_spec import RESULTS_FILE, TABLE_FILE

REFERENCE_TOKENS = 1.0e9  # time and cost are per 1e9 tokens when the task has no token budget
PLOTS = {
    "pareto": "pareto_time_cost.png",
    "throughput": "throughput_vs_gpus.png",
    "per_gpu": "throughput_per_gpu.png",
    "energy": "tokens_per_joule.png",
}
MAX_LISTED_FAILURES = 60
VIEW_SPAN = 30.0  # the time-cost plot shows points up to 30x the front's largest time and cost


# ------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Point:
    """One solved problem: its best plan and the metrics the report ranks by (SI units)."""

    row: dict[str, Any]
    model: str
    task: int
    system: str
    gpu: str
    gpus: int
    objective: str
    plan: dict[str, Any]
    tokens_per_s: float
    mfu: float
    usd_per_million_tokens: float
    time_s: float  # to train task.train_tokens (or REFERENCE_TOKENS)
    cost_usd: float
    tokens_per_joule: float
    speedup: float | None
    baseline_reason: str | None

    @property
    def group(self) -> tuple[str, int]:
        return (self.model, self.task)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus


def point(row: dict[str, Any]) -> Point:
    """The report's view of an ``ok`` row; time and cost from the solve JSON's time_to_train when present."""
    c, res = row["combination"], row["result"]
    best = res["best"]
    tps = float(best["tokens_per_s"])
    tt = best.get("time_to_train")
    if tt:
        time_s, cost = tt["hours"] * SECONDS_PER_HOUR, tt["cost_usd"]
    else:  # t = N / tps; $ = N / 1e6 x $/M tokens
        time_s, cost = REFERENCE_TOKENS / tps, REFERENCE_TOKENS / 1e6 * best["usd_per_million_tokens"]
    base = res.get("baseline")
    reason = None
    if base is not None and not base["feasible"]:
        reason = base["infeasible_reason"] or "infeasible"
    return Point(
        row=row,
        model=c["model"],
        task=int(c["task"]),
        system=c["system"],
        gpu=c["gpu"],
        gpus=int(c["gpus"]),
        objective=c["objective"],
        plan=best["plan"],
        tokens_per_s=tps,
        mfu=float(best["mfu"]),
        usd_per_million_tokens=float(best["usd_per_million_tokens"]),
        time_s=float(time_s),
        cost_usd=float(cost),
        tokens_per_joule=tokens_per_joule(tps, int(c["gpus"]), float(c["power_w_per_gpu"])),
        speedup=res.get("speedup_vs_baseline"),
        baseline_reason=reason,
    )


def load(outdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the rows of the sweep's current combinations, in sweep order, validated against the
    schema of studies/sweep_schema.py (a damaged folder is a one-line error; damaged lines are counted on stderr)."""
    manifest, rows, damaged = load_folder(outdir)
    if damaged:
        print(f"warning: {outdir / RESULTS_FILE}: {damaged} damaged line(s) skipped (not JSON, or no key); their "
              "problems count as not run (madmax-opt sweep solves them again)", file=sys.stderr)
    return manifest, rows


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point weakly dominates (both coordinates minimised), by the first one.

    Sort by (x, y); walking in that order, a point is on the front iff its y is below every y seen so far.
    Of identical points only the first is kept.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    best_y = math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def geomean(xs: Sequence[float]) -> float:
    """(prod x)^(1/n), via logs."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def unique_points(points: Sequence[Point]) -> list[Point]:
    """One point per (model, task, system, GPUs): the objectives of a single-option problem share one optimum;
    the fastest is kept should they differ (ties in rounding)."""
    best: dict[tuple[Any, ...], Point] = {}
    for p in points:
        k = (p.model, p.task, p.system, p.gpus)
        if k not in best or p.tokens_per_s > best[k].tokens_per_s:
            best[k] = p
    return list(best.values())


# ------------------------------------------------------------------------------------------ markdown




def _speedup(p: Point) -> str:
    if p.speedup is not None:
        return f"{p.speedup:.2f}x"
    return "baseline infeasible" if p.baseline_reason else "-"


def _hours(s: float) -> str:
    h = s / SECONDS_PER_HOUR
    return f"{h:,.0f}" if h >= 100 else f"{h:,.1f}" if h >= 1 else f"{h:.3f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _group_title(group: tuple[str, int], manifest_tasks: dict[int, dict[str, Any]]) -> str:
    model, task = group
    t = manifest_tasks.get(task, {})
    desc = ", ".join(
        f"{k} {t[k]:.3g}" if isinstance(t[k], float) else f"{k} {t[k]}"
        for k in ("seq_len", "global_batch", "train_tokens")
        if t.get(k) is not None
    )
    return f"{model} (task {task}: {desc})" if desc else f"{model} (task {task})"


def _time_label(has_budget: bool) -> tuple[str, str]:
    if has_budget:
        return "time to train (h)", "cost to train ($)"
    return f"time per {REFERENCE_TOKENS:.0e} tokens (h)", f"cost per {REFERENCE_TOKENS:.0e} tokens ($)"


OBJECTIVE_METRIC = {
    "throughput": ("max tokens/s", lambda p: -p.tokens_per_s),
    "cost": ("min $ per M tokens", lambda p: p.usd_per_million_tokens),
    "time_to_train": ("min time to train", lambda p: p.time_s),
    "energy": ("max tokens per joule", lambda p: -p.tokens_per_joule),
}


def markdown(
    outdir: Path, md_path: Path, manifest: dict[str, Any], rows: list[dict[str, Any]], plots: dict[str, Path]
) -> str:
    points = [point(r) for r in rows if r["status"] == "ok"]
    tasks = {int(r["combination"]["task"]): r["combination"] for r in rows}
    has_budget = all(r["combination"].get("train_tokens") for r in rows)
    t_label, c_label = _time_label(has_budget)
    groups = sorted({p.group for p in points}, key=lambda g: (g[0], g[1]))
    n_total = len(manifest["keys"])
    status = {s: sum(r["status"] == s for r in rows) for s in ("ok", "infeasible", "error")}
    optimal = sum(r["status"] == "ok" and r["result"]["status"] == "optimal" for r in rows)
    lines = [f"# {manifest.get('title') or 'Sweep report: ' + str(manifest.get('sweep_file', outdir))}", ""]
    if manifest.get("command"):
        lines.append(f"Generated by `{manifest['command']}`.")
    lines += [
        f"Rebuild this report from the sweep's results with `madmax-opt report {outdir} --md {md_path}` "
        f"(results: `{outdir / RESULTS_FILE}`, table: `{outdir / TABLE_FILE}`).",
        "",
    ]
    if manifest.get("description"):
        lines += [manifest["description"].strip(), ""]
    lines += [
        f"**{n_total} problems**: {status['ok']} solved ({optimal} proven optimal), "
        f"{status['infeasible']} infeasible, {status['error']} failed, {n_total - len(rows)} not run yet. "
        "Each problem is one model x task x system x cluster size x objective, solved by CP-SAT "
        "(1 worker, deterministic). With one hardware option per problem the fastest plan is also the "
        "cheapest per token, so the front below is the front of the whole sweep.",
        "",
    ]
    run = manifest.get("run")
    if run:
        rate = run["solved"] / run["wall_s"] if run["wall_s"] > 0 else float("nan")
        load = run.get("load_avg_1m_at_end")
        lines += [
            f"Last run: {run['solved']} problems solved, {run['skipped']} already done, "
            f"in {run['wall_s']:.1f} s ({rate:.1f} problems/s; validating the sweep took "
            f"{run.get('validate_s', float('nan')):.1f} s before) with the {run['backend']} backend, "
            f"{run['workers']} workers on {run['cpu_count']} cores"
            + (f", 1-minute load average {load:.1f} at the end" if load is not None else "")
            + (f" (interrupted by {run['interrupted']})" if run["interrupted"] else "")
            + ".",
            "",
        ]

    lines += [f"## Pareto front: {t_label.split(' (')[0]} vs cost", ""]
    if "pareto" in plots:
        lines += [f"![time vs cost]({os.path.relpath(plots['pareto'], md_path.parent)})", ""]
    for g in groups:
        gp = [p for p in points if p.group == g]
        front = [gp[i] for i in pareto_front([(p.time_s, p.cost_usd) for p in gp])]
        lines += [f"### {_group_title(g, tasks)}", ""]
        lines += _table(
            [
                "#",
                "system",
                "GPU",
                "GPUs",
                "plan",
                t_label,
                c_label,
                "tokens/s",
                "MFU",
                "speedup vs baseline",
            ],
            [
                [
                    str(k),
                    p.system,
                    p.gpu,
                    str(p.gpus),
                    plan_text(p.plan),
                    _hours(p.time_s),
                    f"{p.cost_usd:,.0f}",
                    f"{p.tokens_per_s:,.0f}",
                    f"{p.mfu:.1%}",
                    _speedup(p),
                ]
                for k, p in enumerate(front, start=1)
            ],
        )
        lines.append("")

    lines += ["## Best per objective", ""]
    objectives = [*manifest.get("objectives", ["throughput"]), "energy"]
    header = [
        "model",
        "objective",
        "criterion",
        "system",
        "GPUs",
        "plan",
        "tokens/s",
        "$ / M tokens",
        t_label,
        "tokens/J",
        "speedup vs baseline",
    ]
    best_rows = []
    for g in groups:
        gp = [p for p in points if p.group == g]
        for obj in dict.fromkeys(objectives):
            criterion, rank = OBJECTIVE_METRIC[obj]
            candidates = [p for p in gp if p.objective == obj] or gp
            b = min(candidates, key=rank)
            best_rows.append(
                [
                    _group_title(g, tasks),
                    obj,
                    criterion,
                    b.system,
                    str(b.gpus),
                    plan_text(b.plan),
                    f"{b.tokens_per_s:,.0f}",
                    f"{b.usd_per_million_tokens:.3f}",
                    _hours(b.time_s),
                    f"{b.tokens_per_joule:.3g}",
                    _speedup(b),
                ]
            )
    lines += [*_table(header, best_rows), ""] if best_rows else ["(no solved problem)", ""]

    primary = manifest.get("objectives", ["throughput"])[0]
    criterion, rank = OBJECTIVE_METRIC[primary]
    lines += [f"## Best per system ({primary}: {criterion}, over cluster sizes)", ""]
    for g in groups:
        gp = [p for p in points if p.group == g and p.objective == primary]
        lines += [f"### {_group_title(g, tasks)}", ""]
        table = []
        for system in sorted({p.system for p in gp}):
            b = min((p for p in gp if p.system == system), key=rank)
            table.append(
                [
                    system,
                    b.gpu,
                    str(b.gpus),
                    plan_text(b.plan),
                    f"{b.tokens_per_s:,.0f}",
                    f"{b.tokens_per_s_per_gpu:,.0f}",
                    f"{b.mfu:.1%}",
                    f"{b.usd_per_million_tokens:.3f}",
                    _hours(b.time_s),
                    f"{b.cost_usd:,.0f}",
                    f"{b.tokens_per_joule:.3g}",
                    _speedup(b),
                ]
            )
        lines += _table(
            [
                "system",
                "GPU",
                "GPUs",
                "plan",
                "tokens/s",
                "tokens/s/GPU",
                "MFU",
                "$ / M tokens",
                t_label,
                c_label,
                "tokens/J",
                "speedup vs baseline",
            ],
            table,
        )
        lines.append("")

    lines += _speedup_section(unique_points(points))
    lines += _failures_section(rows)
    others = [k for k in ("throughput", "per_gpu", "energy") if k in plots]
    if others:
        lines += ["## Plots", ""]
        titles = {
            "throughput": "throughput vs GPUs",
            "per_gpu": "throughput per GPU vs cluster size",
            "energy": "tokens per joule vs cluster size",
        }
        for k in others:
            lines += [f"![{titles[k]}]({os.path.relpath(plots[k], md_path.parent)})", ""]
    elif not points:
        lines += ["(no solved problem: nothing to plot)", ""]
    elif not plots:
        lines += ["(plots skipped: matplotlib is not installed; pip install 'madmax-opt[plot]')", ""]
    return "\n".join(lines)


def _speedup_section(points: list[Point]) -> list[str]:
    lines = ["## Speedup over the MAD-Max baseline", ""]
    lines.append(
        "Baseline of every problem: FSDP (ZeRO-3) data parallelism over all GPUs, tp = pp = cp = 1, "
        "micro-batch 1, full recomputation, evaluated with the same cost model; "
        "speedup = best plan tokens/s / baseline tokens/s."
    )
    lines.append("")
    with_base = [p for p in points if p.speedup is not None]
    failed = [p for p in points if p.speedup is None and p.baseline_reason]
    if with_base:
        s = sorted(p.speedup for p in with_base if p.speedup is not None)
        top = max(with_base, key=lambda p: p.speedup or 0.0)
        lines.append(
            f"{len(with_base)} of {len(points)} solved (model, system, size) points have a feasible "
            "baseline: "
            f"speedup geometric mean {geomean(s):.2f}x, median {s[len(s) // 2]:.2f}x, min {s[0]:.2f}x, "
            f"max {s[-1]:.2f}x ({top.model} on {top.gpus} x {top.system})."
        )
    if failed:
        reasons: dict[str, int] = {}
        for p in failed:
            r = p.baseline_reason or ""
            key = "does not fit in memory" if r.startswith("memory per GPU") else r
            reasons[key] = reasons.get(key, 0) + 1
        listed = "; ".join(f"{n} x {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"The baseline itself is infeasible on {len(failed)} points ({listed}); the optimiser's plan "
            "runs there while the baseline cannot."
        )
    return [*lines, ""]


def _failures_section(rows: list[dict[str, Any]]) -> list[str]:
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        return []
    lines = [f"## Infeasible and failed problems ({len(bad)})", ""]
    table = []
    for r in bad[:MAX_LISTED_FAILURES]:
        c = r["combination"]
        msg = (r.get("error") or {}).get("message", "")
        table.append(
            [
                c["model"],
                c["system"],
                str(c["gpus"]),
                c["objective"],
                r["status"],
                msg.replace("|", "/")[:160] + ("..." if len(msg) > 160 else ""),
            ]
        )
    lines += _table(["model", "system", "GPUs", "objective", "status", "reason"], table)
    if len(bad) > MAX_LISTED_FAILURES:
        lines.append(f"\n... {len(bad) - MAX_LISTED_FAILURES} more in `{TABLE_FILE}`.")
    return [*lines, ""]
