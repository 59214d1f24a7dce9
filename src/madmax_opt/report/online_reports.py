"""Arrival-rate (online serving) output: the solve table and ``madmax-opt pareto``'s rate-vs-latency curves."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from madmax_opt.model.plan_settings import plan_text
from madmax_opt.model.problem import Problem
from madmax_opt.report.report import metric_table

CURVE_PLANS = 6  # plans drawn: the best plan of each distinct (hardware, dp, tp, pp, precision), by rate per GPU
CURVE_POINTS = 24


def record_table(rec: dict[str, Any], title: str) -> Table:
    hw = rec["hardware"]
    t = metric_table(title, plan_text(rec["plan"]), hw)
    at = rec["at_arrival_rate"]
    t.add_row("max arrival rate meeting the targets (req/s)", f"{rec['max_rate']:,.2f}")
    t.add_row("  per GPU (req/s)", f"{rec['max_rate_per_gpu']:,.3f}")
    t.add_row("stability limit (req/s)", f"{rec['stability_limit']:,.2f}")
    t.add_section()
    t.add_row(f"at {rec['arrival_rate']:g} req/s: utilisation", f"{at['utilisation']:.1%}")
    for m in ("ttft", "tpot"):
        for q in (50, 90, 99):
            t.add_row(f"  {m.upper()} p{q} (ms)", f"{at[f'{m}_p{q}_s'] * 1e3:,.2f}")
    t.add_row("  running sequences per replica", f"{at['running_per_replica']:,.1f}")
    t.add_row("  P(all slots busy)", f"{at['wait_probability']:.2%}")
    return t


def print_online_records(records: list[dict[str, Any]], console: Console) -> None:
    for i, r in enumerate(records):
        console.print(record_table(r, "plan" if len(records) == 1 else f"plan {i + 1}"))
        if not r["feasible"]:
            console.print(f"[red]infeasible:[/red] {r['infeasible_reason']}")


def print_online(result: dict[str, Any], console: Console) -> None:
    s = result["solver"]
    console.print(f"[bold]status:[/bold] {result['status']}   objective {s['objective']} {s['objective_unit']}   "
                  f"candidates {s['candidates']:,} (max rate computed for {s['evaluated']:,})   wall "
                  f"{s['wall_s']:.2f} s")
    for i, r in enumerate(result["top"]):
        console.print(record_table(r, "best plan" if i == 0 else f"plan {i + 1}"))
    if result.get("options"):  # several systems: each one's best and how far from the optimum
        from madmax_opt.report.report import options_table

        console.print(options_table(result["options"], result["objective"], serving=True, online=True))


def curves(problem: Problem) -> tuple[list[dict[str, Any]], Any]:
    """Rate-vs-latency curves of the best plans (of distinct shapes among the search's top 40): per plan,
    CURVE_POINTS rates from 5 % to 99 % of its stability limit."""
    from madmax_opt.model.queueing import latency, service_table
    from madmax_opt.search.online import solve_online
    from madmax_opt.search.serving_space import ServingModel, ServingPlan

    model = ServingModel(problem)
    top = solve_online(problem, top_k=40, model=model)["top"]
    seen: set[tuple[Any, ...]] = set()
    out = []
    for rec in top:
        p = rec["plan"]
        key = (p["system"], p["dp"], p["tp"], p["pp"], p["precision"])
        if key in seen:
            continue
        seen.add(key)
        plan = ServingPlan(dp=p["dp"], tp=p["tp"], pp=p["pp"], ep=p["ep"], precision=p["precision"],
                           max_num_seqs=p["max_num_seqs"], system=p["system"])
        row = service_table(model.terms, model.arrays([plan]), model.workload)
        rates = np.linspace(0.05, 0.99, CURVE_POINTS) * float(row.max_rate_per_replica()[0])
        lat = latency(_repeat(row, CURVE_POINTS), rates)
        gpus = float(rec["hardware"]["gpus"])
        out.append({**rec, "meets_targets": True, "rate_per_gpu": (rates * row.replicas[0] / gpus).tolist(),
                    "ttft_p99_s": lat.ttft_s[:, 2].tolist(), "tpot_p90_s": lat.tpot_s[:, 1].tolist()})
        if len(out) == CURVE_PLANS:
            break
    return out, model


def _repeat(row: Any, n: int) -> Any:
    from madmax_opt.model.queueing import ServiceTable

    fields = ("cap", "n_grid", "t_grid", "prefill_s", "first_token_extra_s", "replicas")
    return ServiceTable(**{f: np.repeat(getattr(row, f), n, axis=0) for f in fields},
                        outputs=row.outputs, shares=row.shares)


def write_online_pareto(problem: Problem, out: Path) -> tuple[Path, Path]:
    """``<out>.md`` and ``<out>.png``: p99 TTFT and p90 TPOT against the arrival rate per GPU, per plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, model = curves(problem)
    task = model.task
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for r in rows:
        label = f"{plan_text(r['plan'])} x{r['hardware']['gpus']} {r['hardware']['gpu']}"
        a1.plot(r["rate_per_gpu"], np.array(r["ttft_p99_s"]) * 1e3, "-o", ms=2, label=label)
        a2.plot(r["rate_per_gpu"], np.array(r["tpot_p90_s"]) * 1e3, "-o", ms=2, label=label)
    for ax, name, target in ((a1, "TTFT p99", task.ttft_p99_s), (a2, "TPOT p90", task.tpot_p90_s)):
        if target is not None:
            ax.axhline(target * 1e3, color="tab:red", ls="--", lw=1, label=f"target {target * 1e3:g} ms")
        ax.set_xlabel("arrival rate per GPU (requests/s)")
        ax.set_ylabel(f"{name} (ms, log)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{problem.model.name}: latency vs arrival rate (Poisson), {problem.source}", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, metadata={"Software": None})
    plt.close(fig)
    lines = [
        f"# Latency vs arrival rate: {problem.source}",
        "",
        f"Generated by `madmax-opt pareto {problem.source}` ({_dt.date.today().isoformat()}). Do not edit by hand.",
        "",
        f"The best plan of each shape (hardware, dp, tp, pp, precision) by the highest arrival rate per GPU meeting "
        f"the targets; curves from 5 % to 99 % of each plan's stability limit (queueing model, model/queueing.py). "
        f"Plot: `{png.name}`.",
        "",
        "| plan | hardware | max rate (req/s) | per GPU | stability limit | meets targets at the task rate |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {plan_text(r['plan'])} | {r['hardware']['system']} x{r['hardware']['gpus']} | "
                     f"{r['max_rate']:,.2f} | {r['max_rate_per_gpu']:,.3f} | {r['stability_limit']:,.2f} | "
                     f"{'yes' if r['meets_targets'] else 'no'} |")
    md.write_text("\n".join(lines) + "\n")
    return md, png
