"""Fleet output: rich tables (allocation, utilisation, binding constraints, what-if, greedy baseline), a Gantt-style
PNG of finish times, sweep-compatible CSV rows and the Markdown report of ``madmax-opt fleet --out``."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from madmax_opt.fleet.solve import FleetResult, JobResult, WhatIf
from madmax_opt.model.plan_settings import plan_text, settings
from madmax_opt.studies.sweep_results import CSV_COLUMNS

FLEET_COLUMNS = ("fleet_system", "weight", "placed", "deadline_h", "meets_targets", "ttft_s", "tpot_s", "note")
# the plan settings the sweep CSV has columns for (dp ... ep); the system column is the pool's catalog system
PLAN_COLUMNS = tuple(s.name for s in settings() if s.name in CSV_COLUMNS and s.name != "system")




def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _outcome(j: JobResult, horizon: str) -> str:
    if not j.placed:
        return "-"
    if j.finish_h is not None:
        return f"{j.finish_h:,.1f} h"
    return f"serves {horizon}"


def allocation_table(result: FleetResult, title: str, jobs: list[JobResult] | None = None) -> Table:
    t = Table(title=title, header_style="bold")
    rows = jobs if jobs is not None else result.jobs
    for col in ("job", "system", "GPUs", "plan", "tokens/s", "finish / latency", "deadline h", "met", "cost $"):
        t.add_column(col, justify="left" if col in ("job", "system", "plan") else "right")
    t.columns[0].no_wrap, t.columns[0].min_width = True, max([len(j.job) for j in rows] + [3])  # names stay whole
    t.columns[3].overflow = "fold"  # a plan wraps rather than losing its precision
    notes = []
    for j in rows:
        slo = _outcome(j, "horizon")
        if j.ttft_s is not None and j.tpot_s is not None:
            slo = f"TTFT {j.ttft_s * 1e3:,.0f} ms, TPOT {j.tpot_s * 1e3:,.1f} ms"  # each number with its unit
        met = "-" if not j.placed else ("yes" if j.meets_targets else "no")
        if not j.placed:
            notes.append(f"{j.job}: {j.note}")
        t.add_row(j.job, j.system if j.placed else "[red]unplaced[/red]", str(j.gpus or "-"), plan_text(j.plan),
                  _num(j.throughput), slo, _num(j.deadline_h), met, _num(j.cost_usd))
    if notes:
        t.caption = "; ".join(notes)
    return t


def utilisation_table(result: FleetResult) -> Table:
    t = Table(title="fleet utilisation", header_style="bold")
    for col in ("system", "catalog", "GPU", "used / available GPUs", "nodes", "utilisation"):
        t.add_column(col, justify="left" if col in ("system", "catalog", "GPU") else "right")
    for p in result.pools:
        t.add_row(p.system, p.catalog_system, p.gpu, f"{p.used_gpus:,} / {p.gpus:,}", f"{p.used_nodes} / {p.nodes}",
                  f"{p.utilisation:.0%}")
    return t


def binding_table(result: FleetResult) -> Table:
    t = Table(title=f"binding constraints (relaxed alone and re-solved; gain in {result.unit})", header_style="bold")
    for col in ("constraint", "detail", "gain if relaxed"):
        t.add_column(col, justify="right" if col.startswith("gain") else "left")
    for b in result.binding:
        t.add_row(b.constraint, b.detail, _num(b.gain, ",.4g"))
    if not result.binding:
        t.add_row("none", "no single relaxation improves the objective", "0")
    return t


def best_what_if(result: FleetResult) -> dict[int, WhatIf]:
    """Per extra GPU count: the system whose extra GPUs improve the objective most (ties: file order; none if no
    system's do)."""
    best: dict[int, WhatIf] = {}
    for w in result.what_if:
        cur = best.get(w.extra_gpus)
        if w.gain is not None and w.gain > 1e-9 and (cur is None or cur.gain is None or w.gain > cur.gain):
            best[w.extra_gpus] = w
    return best


def what_if_table(result: FleetResult) -> Table:
    systems = list(dict.fromkeys(w.system for w in result.what_if))
    t = Table(title=f"what-if: extra GPUs on one system, re-solved (gain in {result.unit})", header_style="bold")
    t.add_column("extra GPUs", justify="right")
    for s in systems:
        t.add_column(f"+ {s}", justify="right")
    t.add_column("best", justify="left")
    best = best_what_if(result)
    for extra in dict.fromkeys(w.extra_gpus for w in result.what_if):
        gains = {w.system: w.gain for w in result.what_if if w.extra_gpus == extra}
        b = best.get(extra)
        t.add_row(f"{extra:,}", *(_num(gains[s], ",.4g") for s in systems), b.system if b else "none")
    return t


def headline(result: FleetResult) -> str:
    s = result.solver
    gap = "proven optimal" if s.status == "optimal" else f"best found, gap {s.gap:.2%} to the proven bound"
    greedy = "greedy baseline: cannot place every required job" if result.greedy.value is None else (
        f"greedy baseline {result.greedy.value:,.6g}; optimum gains {result.gain_vs_greedy:,.6g}"
        + (f" ({result.relative_gain_vs_greedy:+.1%})" if result.relative_gain_vs_greedy is not None else ""))
    return (f"objective {result.objective}: {result.value:,.6g} {result.unit} ({gap}; {s.options} options, "
            f"CP-SAT {s.wall_s:.2f} s, plan searches {s.option_search_wall_s:.1f} s). {greedy}")


def print_fleet(result: FleetResult, console: Console) -> None:
    console.print(f"[bold]{headline(result)}[/bold]")
    console.print(allocation_table(result, "optimal allocation (CP-SAT)"))
    console.print(utilisation_table(result))
    console.print(binding_table(result))
    if result.what_if:
        console.print(what_if_table(result))
    console.print(allocation_table(result, "greedy baseline (priority order, fastest option that fits)",
                                   result.greedy.jobs))


# ------------------------------------------------------------------------------------------------ files


def sweep_rows(result: FleetResult) -> list[dict[str, Any]]:
    """One row per job with the sweep CSV's columns (studies.sweep_results.CSV_COLUMNS) plus the fleet's own."""
    catalog = {p.system: p.catalog_system for p in result.pools}
    rows = []
    for j in result.jobs:
        row: dict[str, Any] = dict.fromkeys((*CSV_COLUMNS, *FLEET_COLUMNS))
        row |= {"key": j.job, "model": j.model, "task": j.task, "objective": f"fleet-{result.objective}",
                "status": "ok" if j.placed else "unplaced", "error": None if j.placed else j.note,
                "fleet_system": j.system, "weight": j.weight, "placed": j.placed, "deadline_h": j.deadline_h,
                "meets_targets": j.meets_targets, "ttft_s": j.ttft_s, "tpot_s": j.tpot_s, "note": j.note}
        if j.placed and j.system is not None and j.throughput is not None:
            row |= {k: (j.plan or {}).get(k) for k in PLAN_COLUMNS}
            row |= {"system": catalog[j.system], "gpu": j.gpu, "gpus": j.gpus, "step_time_s": j.step_time_s,
                    "tokens_per_s": j.throughput, "tokens_per_s_per_gpu": j.throughput / j.gpus, "mfu": j.mfu,
                    "cost_per_hour_usd": j.cost_per_hour_usd, "usd_per_million_tokens": j.usd_per_million_tokens,
                    "memory_bytes_per_gpu": j.memory_bytes_per_gpu,
                    "tokens_per_joule": j.throughput / j.power_w if j.power_w else None,
                    "time_to_train_h": j.finish_h, "cost_to_train_usd": j.cost_usd if j.finish_h else None,
                    "energy_mwh": j.energy_kwh / 1e3 if j.finish_h and j.energy_kwh is not None else None}
        rows.append(row)
    return rows


def write_csv(result: FleetResult, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=(*CSV_COLUMNS, *FLEET_COLUMNS))
        w.writeheader()
        w.writerows(sweep_rows(result))


def gantt_png(result: FleetResult, path: Path, horizon_h: float | None) -> None:
    """Finish time per job (bars from 0), optimum above greedy; serving jobs span the horizon, deadlines marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [p.system for p in result.pools]
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(systems)}
    ends = [j.finish_h or 0.0 for j in (*result.jobs, *result.greedy.jobs)] + [j.deadline_h or 0.0 for j in result.jobs]
    span = max([*ends, horizon_h or 0.0, 1.0])
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.2 + 0.9 * len(result.jobs)), sharex=True)
    for ax, (label, jobs) in zip(axes, (("optimum (CP-SAT)", result.jobs), ("greedy baseline", result.greedy.jobs)),
                                 strict=True):
        for y, j in enumerate(jobs):
            if j.placed and j.system is not None:
                end = j.finish_h if j.finish_h is not None else (horizon_h or span)
                ax.barh(y, end, color=colors[j.system], hatch=None if j.finish_h is not None else "//",
                        edgecolor="black", linewidth=0.5)
                ax.text(end, y, f" {j.gpus} x {j.system}", va="center", fontsize=8)
            else:
                ax.text(0, y, " unplaced", va="center", fontsize=8, color="red")
            if j.deadline_h is not None:
                ax.plot([j.deadline_h] * 2, [y - 0.4, y + 0.4], color="red", linewidth=2)
        ax.set_yticks(range(len(jobs)), [j.job for j in jobs])
        ax.invert_yaxis()
        ax.set_title(label, fontsize=10)
    axes[-1].set_xlabel("hours (training: time to finish its budget; hatched: serving over the horizon; "
                        "red: deadline)")
    axes[-1].set_xlim(0, span * 1.25)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[s]) for s in systems]
    fig.legend(handles, systems, loc="upper center", ncol=len(systems), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: FleetResult, fleet_path: str, command: str) -> str:
    """The report: the allocation beside the greedy baseline, utilisation, binding constraints, what-if."""
    lines = [f"# Fleet allocation: {fleet_path}", "", f"Regenerate: `{command}`", "", headline(result), ""]
    head = "| job | task | system | GPUs | plan | tokens/s | finish (h) | deadline (h) | met | $/h | cost $ |"

    def table(jobs: list[JobResult]) -> list[str]:
        out = [head, "|" + "---|" * 11]
        for j in jobs:
            sysname = j.system if j.placed else f"unplaced: {j.note}"
            finish = _num(j.finish_h, ",.1f") if j.placed and j.finish_h is not None else ("serving" if j.placed else "-")
            met = "-" if not j.placed else ("yes" if j.meets_targets else "no")
            out.append(f"| {j.job} | {j.task} | {sysname} | {j.gpus or '-'} | {plan_text(j.plan)} | "
                       f"{_num(j.throughput)} | {finish} | {_num(j.deadline_h)} | {met} | "
                       f"{_num(j.cost_per_hour_usd if j.placed else None, ',.2f')} | {_num(j.cost_usd)} |")
        return out

    lines += ["## Optimal allocation (CP-SAT)", "", *table(result.jobs), ""]
    lines += ["## Greedy baseline (each job in priority order takes its fastest option that fits)", "",
              *table(result.greedy.jobs), ""]
    lines += ["## Utilisation", "", "| system | catalog | GPU | used / available GPUs | utilisation |", "|---|---|---|---|---|"]
    lines += [f"| {p.system} | {p.catalog_system} | {p.gpu} | {p.used_gpus:,} / {p.gpus:,} | {p.utilisation:.0%} |"
              for p in result.pools]
    lines += ["", f"## Binding constraints (each relaxed alone, re-solved; gain in {result.unit})", "",
              "| constraint | detail | gain |", "|---|---|---|"]
    lines += [f"| {b.constraint} | {b.detail} | {b.gain:,.4g} |" for b in result.binding] or ["| none | | |"]
    if result.what_if:
        systems = list(dict.fromkeys(w.system for w in result.what_if))
        best = best_what_if(result)
        lines += ["", f"## What-if: extra GPUs on one system, re-solved (gain in {result.unit})", "",
                  "| extra GPUs | " + " | ".join(f"+ {s}" for s in systems) + " | best |",
                  "|---|" + "---|" * (len(systems) + 1)]
        for extra in dict.fromkeys(w.extra_gpus for w in result.what_if):
            gains = {w.system: w.gain for w in result.what_if if w.extra_gpus == extra}
            b = best.get(extra)
            lines.append(f"| {extra:,} | " + " | ".join(_num(gains[s], ",.4g") for s in systems)
                         + f" | {b.system if b else 'none'} |")
        lines += ["", "The what-if re-solves the allocation with the same option tables (each system's cluster "
                  "sizes as listed in the fleet file), so extra GPUs let more jobs run or larger listed sizes fit."]
    lines += ["", f"Objective integers CP-SAT sees: {result.score_unit}.", ""]
    return "\n".join(lines)


def write_report(result: FleetResult, out: Path, fleet_path: str, command: str, horizon_h: float | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(fleet_path).stem
    (out / f"{stem}.json").write_text(json.dumps(result.model_dump(mode="json"), indent=1) + "\n")
    write_csv(result, out / f"{stem}-rows.csv")
    gantt_png(result, out / f"{stem}-gantt.png", horizon_h)
    path = out / f"{stem}.md"
    path.write_text(markdown(result, fleet_path, command) + f"\n![finish times]({stem}-gantt.png)\n")
    return path
