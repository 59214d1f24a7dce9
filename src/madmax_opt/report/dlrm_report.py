"""DLRM at the edges: ``solve`` / ``evaluate`` output for DLRM problem files and the paper study
(``madmax-opt paper dlrm`` -> results/paper/dlrm.md). Human units only here."""

from __future__ import annotations

import datetime as _dt
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.dlrm_records import DLRMRecord
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.core.units import GB
from madmax_opt.io import catalog
from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict
from madmax_opt.model.dlrm import layout_of
from madmax_opt.model.dlrm_embedding import embedding_options, phase_weights
from madmax_opt.model.dlrm_spec import MLP, DLRMModel, TableGroup
from madmax_opt.model.problem import DLRMProblem
from madmax_opt.report.report import metric_table
from madmax_opt.search.dlrm_search import solve_dlrm
from madmax_opt.search.placement import solve_placement
from madmax_opt.search.placement_ints import int_tables

MS = 1e3


# ============================================================================================ solve / evaluate


def plan_text(rec: DLRMRecord) -> str:
    d = rec["plan"]["dense"]
    dense = d["strategy"] + (f" tp{d['tp']}" if d["tp"] > 1 else "") + (f" ep{d['ep']}" if d["ep"] > 1 else "")
    shard = ", ".join(f"{k} {v:g}" for k, v in rec["embedding"]["tables_by_sharding"].items())
    return f"{dense}; tables: {shard}"


def record_table(rec: DLRMRecord, title: str) -> Table:
    hw = rec["hardware"]
    t = metric_table(title, plan_text(rec), hw)
    if not rec["feasible"]:
        t.add_row("[red]infeasible[/red]", rec["infeasible_reason"])
    step = rec["step_time_s"]
    t.add_row("step time (ms)", f"{step * MS:,.2f}")
    t.add_row("samples/s", f"{rec['samples_per_s']:,.0f}")
    t.add_row("exposed all-to-all", f"{rec['exposed_a2a_share']:.1%}")
    t.add_row("$ / M samples", f"{rec['usd_per_million_samples']:,.4f}")
    if "time_to_train" in rec:
        tt = rec["time_to_train"]
        t.add_row("time to train (h) / $", f"{tt['hours']:,.2f} / {tt['cost_usd']:,.0f}")
    t.add_section()
    for k, v in rec["time_breakdown_s"].items():
        if v > 0:
            t.add_row(f"  {k} (ms)", f"{v * MS:,.2f}  ({v / step:.1%})")
    t.add_section()
    e = rec["embedding"]
    t.add_row("  placement objective (ms)", f"{e['placement_objective_s'] * MS:,.2f}")
    for k, v in e["per_collective_s"].items():
        t.add_row(f"  {k} (ms)", f"{v * MS:,.3f}")
    t.add_section()
    mem = rec["memory_bytes_per_gpu"]
    t.add_row("  memory: embeddings, busiest GPU (GB)", f"{mem['embedding_max'] / GB:,.2f}")
    for k, v in mem["dense"].items():
        t.add_row(f"  memory: dense {k} (GB)", f"{v / GB:,.2f}")
    t.add_row("  memory: total / capacity (GB)", f"{mem['total'] / GB:,.2f} / {mem['capacity'] / GB:,.2f}")
    if "placement_solver" in rec:
        s = rec["placement_solver"]
        greedy = "-" if s["greedy_objective_s"] is None else f"{s['greedy_objective_s'] * MS:,.2f}"
        t.add_section()
        if s.get("proved_by") == "bound":  # greedy met the averaging lower bound: no CP-SAT model was built
            t.add_row("placement", f"{s['status']}: greedy meets the lower bound (no CP-SAT run)")
        else:
            t.add_row("placement CP-SAT", f"{s['status']}, {s['wall_s']:.2f} s, {s['variables']} variables")
        t.add_row("  objective / bound / greedy (ms)",
                  f"{s['objective_s'] * MS:,.2f} / {s['bound_s'] * MS:,.2f} / {greedy}")
    return t


def options_table(result: dict[str, Any]) -> Table:
    """Every hardware option of the problem: its best plan's step time and throughput, how it was settled (optimal;
    pruned: its floor is above the best plan, so its placement got no proof and its optimum lies between the floor
    and the step time shown), or why it has no plan."""
    t = Table(title=f"best plan per hardware option (objective: {result['objective']})", header_style="bold")
    for col, right in (("hardware", False), ("step ms", True), ("samples/s", True), ("settled", False)):
        t.add_column(col, justify="right" if right else "left", no_wrap=right)
    best = result["best"]["hardware"]
    for o in result["options"]:
        step = "-" if o["step_time_s"] is None else f"{o['step_time_s'] * MS:,.2f}"
        rate = "-" if o["samples_per_s"] is None else f"{o['samples_per_s']:,.0f}"
        if o["status"] == "pruned":
            how = f"pruned: >= {o['step_time_floor_s'] * MS:,.2f} ms per step, worse than the best"
        elif not o["feasible"]:
            how = f"[red]none[/red]: {o['reason']}"
        else:
            how = o["status"]
        if o["hardware"] == f"{best['system']}x{best['gpus']}":
            how += " (best)"
        t.add_row(o["hardware"], step, rate, how)
    return t


def print_result(result: dict[str, Any], console: Console) -> None:
    """The tables of ``solve`` on a recommender problem: each hardware option (when several), best plan,
    baseline, speedup."""
    if len(result["options"]) > 1:
        console.print(options_table(result))
    console.print(record_table(result["best"], "best plan"))
    if result["baseline"]:
        console.print(record_table(result["baseline"], "baseline"))
    if result["speedup_vs_baseline"]:
        console.print(f"[bold]speedup over baseline: {result['speedup_vs_baseline']:.2f}x[/bold]")


def print_evaluations(records: list[DLRMRecord], console: Console) -> None:
    """The tables of ``evaluate`` on a recommender problem: one per plan."""
    for i, rec in enumerate(records):
        console.print(record_table(rec, f"plan {i + 1}" if len(records) > 1 else "plan"))


# ================================================================================================ paper study

STUDY_BATCH = 65_536  # the paper's cloud study: fixed global batch of 65,536 samples
STUDY_SAMPLES = 5.0e9  # ... trained for 5 B samples
CLOUD_SIZES = (64, 128, 256, 512)
PAPER_FRONTIER = (("cloud-a-p5", 512, 0.67, 4200.0), ("cloud-b-nd96asr-v4", 128, 1.9, 830.0))
PLACEMENT_BARS = (("dlrm-a", "zionex", 128), ("dlrm-i", "zionex", 128), ("dlrm-a", "zionex", 96),
                  ("dlrm-i", "zionex", 96))


def _problem(model: str, system: str, gpus: int) -> DLRMProblem:
    batch = STUDY_BATCH - STUDY_BATCH % gpus  # whole samples per GPU (65,536 -> 65,472 on 96 GPUs)
    return dlrm_problem_from_dict({
        "model": model, "hardware": {"system": system, "gpus": gpus},
        "task": {"global_batch": batch, "train_samples": STUDY_SAMPLES},
    })


def _solve(problem: DLRMProblem) -> tuple[DLRMRecord | None, DLRMRecord | None, str | None]:
    """(best record, paper-style baseline record, reason when nothing fits)."""
    try:
        best, results = solve_dlrm(problem)
    except InfeasibleError as exc:
        return None, None, str(exc)
    return best, results[0].baseline, None


def _dense_text(rec: DLRMRecord) -> str:
    d = rec["plan"]["dense"]
    return d["strategy"].upper() + (f" + TP{d['tp']}" if d["tp"] > 1 else "")


def _place_text(rec: DLRMRecord) -> str:
    return ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in rec["embedding"]["tables_by_sharding"].items())


def _pareto(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points not dominated in (hours, cost)."""
    ordered = sorted(points, key=lambda p: (p["hours"], p["cost"]))
    front, best_cost = [], float("inf")
    for p in ordered:
        if p["cost"] < best_cost:
            front.append(p)
            best_cost = p["cost"]
    return front


def placement_bars() -> list[dict[str, Any]]:
    """The placement bars: CP-SAT vs greedy at 128 (and 96) GPUs with the proven gap and solve time."""
    rows = []
    for model, system, gpus in PLACEMENT_BARS:
        p = _problem(model, system, gpus)
        lay = layout_of(p.hardware[0], p.stack)
        opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
        it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
        t0 = time.perf_counter()
        res = solve_placement(it, time_limit_s=30.0)
        wall = time.perf_counter() - t0
        rows.append({"model": model, "system": system, "gpus": gpus, "res": res, "wall": wall,
                     "tables": p.model.n_tables, "opts": opts})
    return rows


SYNTHETIC = ((50, 8), (100, 16), (200, 32))  # (tables, GPUs) of the heterogeneous placement instances


def synthetic_model(n_tables: int, seed: int = 0) -> DLRMModel:
    """Heterogeneous tables (a stand-in for production table mixes; not from the paper): rows log-uniform in
    1e4-2e7, dim from {32, 64, 128, 256}, pooling 1 + 4 x Pareto(1.2) capped at 200, fp16; numpy seed ``seed``."""
    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(1e4), np.log(2e7), n_tables)).astype(int)
    dims = rng.choice([32, 64, 128, 256], n_tables)
    pool = np.minimum(1 + rng.pareto(1.2, n_tables) * 4, 200)
    tables = [TableGroup(name=f"t{i}", rows=int(r), dim=int(d), pooling=round(float(q), 1))
              for i, (r, d, q) in enumerate(zip(rows, dims, pool, strict=True))]
    return DLRMModel(name=f"synthetic-{n_tables}", tables=tables, dense_features=512,
                     bottom_mlp=MLP(layers=3, width=512), top_mlp=MLP(layers=3, width=512), interaction="cat")


SYNTHETIC_LIMIT = 20.0  # CP-SAT deterministic time units per synthetic instance (reproducible; ~15-60 s here)


def synthetic_rows() -> list[dict[str, Any]]:
    rows = []
    for n_tables, gpus in SYNTHETIC:
        model = synthetic_model(n_tables)
        p = dlrm_problem_from_dict({"model": model.model_dump(), "hardware": {"system": "zionex", "gpus": gpus},
                                    "task": {"global_batch": STUDY_BATCH}})
        lay = layout_of(p.hardware[0], p.stack)
        opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
        it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
        t0 = time.perf_counter()
        res = solve_placement(it, time_limit_s=300.0, deterministic_limit=SYNTHETIC_LIMIT)
        rows.append({"model": model.name, "system": "zionex", "gpus": gpus, "res": res,
                     "wall": time.perf_counter() - t0, "tables": n_tables, "opts": opts})
    return rows


def write_dlrm_study(out_dir: Path, plot: bool = True) -> Path:
    zionex = _problem("dlrm-a", "zionex", 128)
    z_best, z_base, z_reason = _solve(zionex)
    cloud_systems = [n for n in catalog.systems() if n.startswith("cloud-")]
    cloud: list[dict[str, Any]] = []
    for name in cloud_systems:
        for n in CLOUD_SIZES:
            best, base, reason = _solve(_problem("dlrm-a", name, n))
            cloud.append({"system": name, "gpus": n, "best": best, "base": base, "reason": reason})
    bars = placement_bars()
    synthetic = synthetic_rows()
    lines = [
        "# DLRM study: DLRM-A on ZionEX and on cloud instances (MAD-Max, ISCA 2024, Sec. cloud study)",
        "",
        f"Generated by `madmax-opt paper dlrm` ({_dt.date.today().isoformat()}, {platform.python_implementation()} "
        f"{platform.python_version()}). "
        "Do not edit by hand.",
        "",
        f"Setup (Hsia et al., ISCA 2024, arXiv 2310.02784): DLRM-A (4096 tables x 2.08 M rows, dim 94, pooling 15, fp16 "
        f"embeddings; 10 + 10 MLP layers of width 3994, fp32 dense on TF32 tensor cores), global batch "
        f"{STUDY_BATCH:,} samples, {STUDY_SAMPLES:.0e} samples to train. Per hardware option the solver picks the "
        "dense plan (DDP, FSDP, or TP inside the node x DDP) and the embedding placement (CP-SAT over table-wise, "
        "column-wise, table-row-wise, row-wise, data-parallel; 4096 identical tables as one group of integer "
        "counts). Baseline = the paper's hand-written style: every table table-wise (greedy, largest first to the "
        "least-loaded GPU) and the MLPs DDP or FSDP (the faster of the two). Prices are the paper's on-demand "
        "list prices (data/systems.yaml); ZionEX has no public price (assumed $1.84/GPU-h). Memory capacity is "
        "checked (the paper's model does not check it).",
        "",
        "## ZionEX, 128 GPUs",
        "",
    ]
    if z_best is None:
        lines.append(f"No feasible plan: {z_reason}")
    else:
        lines += [
            "| plan | dense | placement | step ms | samples/s | exposed all-to-all | time to train h | "
            "placement objective ms | where the time goes |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, rec in (("optimum", z_best), ("baseline", z_base)):
            if rec is None:
                continue
            step = rec["step_time_s"]
            big = sorted(rec["time_breakdown_s"].items(), key=lambda kv: -kv[1])
            where = ", ".join(f"{k} {v / step:.0%}" for k, v in big if v / step >= 0.03)
            lines.append(
                f"| {label} | {_dense_text(rec)} | {_place_text(rec)} | {step * MS:.1f} | "
                f"{rec['samples_per_s']:,.0f} | {rec['exposed_a2a_share']:.1%} | "
                f"{rec['time_to_train']['hours']:.2f} | {rec['embedding']['placement_objective_s'] * MS:.1f} | "
                f"{where} |"
            )
        if z_base:
            lines += ["", f"Speedup of the optimum over the baseline: "
                          f"{z_base['step_time_s'] / z_best['step_time_s']:.2f}x."]
    lines += [
        "",
        "## Cloud instance types (64-512 GPUs)",
        "",
        "| system | GPU | GPUs | optimum: dense | placement | step ms | exposed all-to-all | hours | $ | "
        "baseline: dense | step ms | exposed all-to-all | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    points = []
    for c in cloud:
        gpu = catalog.systems()[c["system"]].gpu
        b, base = c["best"], c["base"]
        if b is None:
            why = (c["reason"] or "").split("(")[-1].rstrip(")")
            lines.append(f"| {c['system']} | {gpu} | {c['gpus']} | does not fit: {why} | | | | | | | | | |")
            continue
        tt = b["time_to_train"]
        points.append({"system": c["system"], "gpu": gpu, "gpus": c["gpus"], "hours": tt["hours"],
                       "cost": tt["cost_usd"], "dense": _dense_text(b)})
        base_cols = "- | - | - | -"
        if base is not None:
            base_cols = (f"{_dense_text(base)} | {base['step_time_s'] * MS:.1f} | {base['exposed_a2a_share']:.0%} | "
                         f"{base['step_time_s'] / b['step_time_s']:.2f}x")
        lines.append(
            f"| {c['system']} | {gpu} | {c['gpus']} | {_dense_text(b)} | {_place_text(b)} | "
            f"{b['step_time_s'] * MS:.1f} | {b['exposed_a2a_share']:.0%} | {tt['hours']:.2f} | "
            f"{tt['cost_usd']:,.0f} | {base_cols} |"
        )
    front = _pareto(points)
    lines += [
        "",
        "## Time-versus-cost frontier (training DLRM-A on 5 B samples)",
        "",
        "| system | GPU | GPUs | dense | hours | $ |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {p['system']} | {p['gpu']} | {p['gpus']} | {p['dense']} | {p['hours']:.2f} | {p['cost']:,.0f} |"
              for p in front]
    lines += ["", "The paper's frontier ran from these end points; our model at the same points:", "",
              "| point | paper hours | paper $ | ours hours | ours $ | ours dense |", "|---|---|---|---|---|---|"]
    for system, n, hours, cost in PAPER_FRONTIER:
        ours = next((p for p in points if p["system"] == system and p["gpus"] == n), None)
        cols = "does not fit | - | -" if ours is None else f"{ours['hours']:.2f} | {ours['cost']:,.0f} | {ours['dense']}"
        lines.append(f"| {system} x {n} | {hours} | {cost:,.0f} | {cols} |")
    speedups = [c["base"]["step_time_s"] / c["best"]["step_time_s"] for c in cloud if c["best"] and c["base"]]
    shares = [c["best"]["exposed_a2a_share"] for c in cloud if c["best"]]
    misfits = [f"{c['system']} x {c['gpus']}" for c in cloud if c["best"] is None]
    lines += ["", "## Summary", ""]
    if speedups:
        lines.append(f"- Optimum vs the paper-style baseline on the cloud grid: {min(speedups):.2f}x-"
                     f"{max(speedups):.2f}x (median {sorted(speedups)[len(speedups) // 2]:.2f}x); the paper reports "
                     "a best/worst spread of 1.02x-1.87x per cluster over its hand-written plans.")
    if shares:
        lines.append(f"- Exposed all-to-all in the optimum: {min(shares):.0%}-{max(shares):.0%} of the step: the "
                     "pooled-embedding all-to-all over the inter-node network dominates DLRM-A wherever the network "
                     "is slow (the paper: 14-32 % of GPU hours in exposed communication in production).")
    if misfits:
        lines.append(f"- Does not fit in GPU memory ({len(misfits)} of {len(cloud)}): {', '.join(misfits)}. DLRM-A's "
                     "1.6 TB of fp16 embeddings (+ rowwise-Adagrad state and lookup buffers) need more HBM than these "
                     "clusters have; the paper's model does not check capacity and reports them anyway. Host-memory "
                     "(UVM) offload is not modelled.")
    if front:
        lines.append(f"- Frontier: {len(front)} points, from {front[0]['system']} x {front[0]['gpus']} "
                     f"({front[0]['hours']:.2f} h, ${front[0]['cost']:,.0f}) to {front[-1]['system']} x "
                     f"{front[-1]['gpus']} ({front[-1]['hours']:.2f} h, ${front[-1]['cost']:,.0f}).")
    lines += [
        "",
        "## Placement: CP-SAT vs greedy",
        "",
        "Bottleneck objective = lookups (forward + fused backward/rowwise-Adagrad update) + id all-to-all + 2 x "
        "pooled all-to-all (forward, and the gradient all-to-all backward) + data-parallel tables' all-reduce, each "
        "at its busiest GPU, no overlap. Greedy = table-wise, largest table first to the least-loaded GPU; it is "
        "also the solver's hint. Memory budget = HBM minus the 5 % reserve (no dense part).",
        "",
        "| model | system | GPUs | tables | CP-SAT ms | proven bound ms | gap | greedy ms | better than greedy | "
        "solve s | status | placement |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*bars, *synthetic]:
        res = r["res"]
        if res is None:
            lines.append(f"| {r['model']} | {r['system']} | {r['gpus']} | {r['tables']} | does not fit | | | | | | | |")
            continue
        greedy = "-" if res.greedy_objective is None else f"{res.greedy_objective / 1e6:.2f}"
        gain = "-" if res.gain_vs_greedy is None else f"{res.gain_vs_greedy:.1%}"
        kinds: dict[str, float] = {}  # tables per sharding (a column shard counts 1/split)
        for o, k in zip(res.shards.option.tolist(), res.shards.count.tolist(), strict=True):
            opt = r["opts"].options[o]
            kinds[opt.sharding] = kinds.get(opt.sharding, 0.0) + k / opt.split
        lines.append(
            f"| {r['model']} | {r['system']} | {r['gpus']} | {r['tables']} | {res.objective / 1e6:.2f} | "
            f"{res.bound / 1e6:.2f} | {res.gap:.1%} | {greedy} | {gain} | {r['wall']:.1f} | {res.status} | "
            f"{', '.join(f'{k} {v:g}' for k, v in kinds.items())} |"
        )
    lines += [
        "",
        "With 4096 (DLRM-A) or 512 (DLRM-I) identical tables on 128 identical GPUs the greedy plan (32 or 4 tables "
        "per GPU, table-wise) is already optimal, and CP-SAT proves it: no placement can beat a perfectly "
        "balanced table-wise split here, because every other sharding moves at least as many bytes (row-wise and "
        "table-row-wise add a reduce-scatter; column-wise duplicates the ids; data-parallel all-reduces whole "
        "tables). The issue's bar of >= 20 % over greedy at 128 GPUs is therefore not reachable for these "
        "models as the paper describes them (identical tables); the solver's gains appear where greedy cannot "
        "balance: at 96 GPUs (4096 / 96 and 512 / 96 are not whole numbers) and on heterogeneous tables "
        "(the synthetic rows).",
        "",
        f"The synthetic rows ({', '.join(f'{t} tables on {g} GPUs' for t, g in SYNTHETIC)}) are heterogeneous "
        "tables (`dlrm_report.synthetic_model`, seed 0: rows log-uniform 1e4-2e7, dim 32-256, Pareto pooling), "
        f"not a paper model, solved with a budget of {SYNTHETIC_LIMIT:g} CP-SAT deterministic time units "
        "(reproducible; the solve-s column is this machine's wall time). The proven bound there is weak (large "
        "gap): the LP relaxation of a bin-packing-like problem, which one thread does not close in that budget. "
        "The plan is never worse than greedy (greedy is the hint and the fallback).",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    if plot and points:
        png = _plot_frontier(points, front, out_dir / "dlrm-frontier.png")
        if png:
            lines += ["", f"![time vs cost]({png.name})"]
    path = out_dir / "dlrm.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot_frontier(points: list[dict[str, Any]], front: list[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for gpu in sorted({p["gpu"] for p in points}):
        sel = [p for p in points if p["gpu"] == gpu]
        ax.scatter([p["hours"] for p in sel], [p["cost"] for p in sel], label=gpu, s=18)
    ax.plot([p["hours"] for p in front], [p["cost"] for p in front], "k--", lw=1, label="frontier (ours)")
    ax.scatter([h for _, _, h, _ in PAPER_FRONTIER], [c for _, _, _, c in PAPER_FRONTIER], marker="x", c="red",
               s=60, label="paper frontier end points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hours to train DLRM-A on 5 B samples")
    ax.set_ylabel("US$")
    ax.legend(fontsize=7)
    ax.set_title("DLRM-A: time vs cost (cloud instance types, 64-512 GPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["print_evaluations", "print_result", "write_dlrm_study"]
