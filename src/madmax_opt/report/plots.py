"""PNG plots (matplotlib, Agg backend): step-time and memory breakdowns of evaluated plans, the top-k plans side by
side, and a Gantt chart of a simulated step. Inputs are the evaluator's JSON records and ``trace.Simulation``s;
seconds and bytes in, milliseconds / seconds and GB on the axes (human units only here, at the edge).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from madmax_opt.analysis.records import TrainingRecord
from madmax_opt.core.units import GB
from madmax_opt.model.plan_settings import plan_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from madmax_opt.analysis.trace_result import Simulation

# step-time terms of the closed form (training.STEP_TERMS) and of the simulation, in stacking order
TERM_LABELS: dict[str, str] = {
    "compute": "compute (fwd + bwd)",
    "recompute": "recompute",
    "overhead": "launch overhead",
    "tp_comm": "TP comm (exposed)",
    "cp_comm": "CP comm (exposed)",
    "ep_comm": "MoE all-to-all (exposed)",
    "pp_comm": "pipeline p2p (exposed)",
    "zero3_comm": "ZeRO-3 gather/scatter (exposed)",
    "dp_comm": "DP grad sync (exposed)",
    "bubble": "pipeline bubble / wait",
    "optimizer": "optimizer step",
}
TERM_COLORS: dict[str, str] = {
    "compute": "#4C72B0",
    "recompute": "#8FB0DA",
    "overhead": "#B8B8B8",
    "tp_comm": "#DD8452",
    "cp_comm": "#E8B64A",
    "ep_comm": "#937860",
    "pp_comm": "#55A868",
    "zero3_comm": "#C44E52",
    "dp_comm": "#DA8BC3",
    "bubble": "#EEEEEE",
    "optimizer": "#8172B3",
}
MEMORY_LABELS: dict[str, str] = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "temporary": "temporary buffers",
}
MEMORY_COLORS: dict[str, str] = {
    "weights": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#8172B3",
    "activations": "#55A868",
    "temporary": "#B8B8B8",
}
MAX_GANTT_STAGES = 16
MAX_GANTT_EVENTS = 250_000  # ~6 s of rendering; above it one bar per layer pass


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _time_unit(seconds: float) -> tuple[float, str]:
    """Scale and unit for a time axis whose largest value is ``seconds``."""
    return (1.0, "s") if seconds >= 10.0 else (1e3, "ms")




def _legend_right(ax: Axes) -> None:
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)


def _stacked(ax: Axes, labels: Sequence[str], parts: dict[str, list[float]], names: dict[str, str],
             colors: dict[str, str], horizontal: bool) -> None:
    base = [0.0] * len(labels)
    pos = list(range(len(labels)))
    for key, values in parts.items():
        if not any(v > 0 for v in values):
            continue
        if horizontal:
            ax.barh(pos, values, left=base, height=0.6, color=colors[key], label=names[key], edgecolor="white",
                    linewidth=0.5)
        else:
            ax.bar(pos, values, bottom=base, width=0.6, color=colors[key], label=names[key], edgecolor="white",
                   linewidth=0.5)
        base = [b + v for b, v in zip(base, values, strict=True)]


def step_time_figure(records: Sequence[TrainingRecord], path: Path, title: str = "Step time breakdown",
                     simulated: Sequence[dict[str, float] | None] | None = None) -> Path:
    """Horizontal stacked bars: where each plan's step time goes (closed form; + simulation when given)."""
    plt = _pyplot()
    rows: list[tuple[str, dict[str, float]]] = []
    for i, rec in enumerate(records):
        rows.append((f"#{i + 1} {plan_text(rec['plan'])}", rec["time_breakdown_s"]))
        if simulated is not None and simulated[i] is not None:
            rows.append((f"#{i + 1} simulated (trace)", simulated[i] or {}))
    longest = max(sum(b.values()) for _, b in rows)
    scale, unit = _time_unit(longest)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.55 * len(rows)))
    parts = {k: [b.get(k, 0.0) * scale for _, b in rows] for k in TERM_LABELS}
    _stacked(ax, [r[0] for r in rows], parts, TERM_LABELS, TERM_COLORS, horizontal=True)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(f"time per training step ({unit})")
    for y, (_, b) in enumerate(rows):
        total = sum(b.values()) * scale
        ax.text(total, y, f" {total:,.1f} {unit}", va="center", fontsize=8)
    ax.set_xlim(0, longest * scale * 1.15)
    return _finish(plt, fig, ax, title, path)


def _finish(plt: Any, fig: Any, ax: Any, title: str, path: Path) -> Path:
    """Title, x grid, legend right of the axes, save and close: the common end of the bar charts."""
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    _legend_right(ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def memory_figure(records: Sequence[TrainingRecord], path: Path, title: str = "Memory per GPU") -> Path:
    """Stacked bars of memory per GPU against the usable capacity (dashed line) of each plan's GPU."""
    plt = _pyplot()
    labels = [f"#{i + 1} {plan_text(r['plan'])}" for i, r in enumerate(records)]
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.55 * len(records)))
    parts = {k: [r["memory_bytes_per_gpu"][k] / GB for r in records] for k in MEMORY_LABELS}
    _stacked(ax, labels, parts, MEMORY_LABELS, MEMORY_COLORS, horizontal=True)
    for y, r in enumerate(records):
        cap = r["memory_bytes_per_gpu"]["capacity"] / GB
        ax.plot([cap, cap], [y - 0.4, y + 0.4], color="#C44E52", linestyle="--", linewidth=1.5,
                label="usable capacity" if y == 0 else None)
        total = r["memory_bytes_per_gpu"]["total"] / GB
        ax.text(max(total, cap), y, f" {total:,.1f} / {cap:,.1f} GB", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.invert_yaxis()
    top = max(max(r["memory_bytes_per_gpu"]["total"], r["memory_bytes_per_gpu"]["capacity"]) for r in records) / GB
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("memory per GPU (GB)")
    return _finish(plt, fig, ax, title, path)


def top_k_figure(records: Sequence[TrainingRecord], path: Path, title: str = "Top plans") -> Path:
    """The top-k plans side by side: step-time breakdown (with tokens/s) and memory against capacity."""
    plt = _pyplot()
    labels = [f"#{i + 1}" for i in range(len(records))]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(max(12, 2.2 * len(records) + 6), 5.6))
    longest = max(r["step_time_s"] for r in records)
    scale, unit = _time_unit(longest)
    parts = {k: [r["time_breakdown_s"].get(k, 0.0) * scale for r in records] for k in TERM_LABELS}
    _stacked(ax_t, labels, parts, TERM_LABELS, TERM_COLORS, horizontal=False)
    for x, r in enumerate(records):
        ax_t.text(x, r["step_time_s"] * scale, f"{r['tokens_per_s']:,.0f}\ntok/s", ha="center", va="bottom",
                  fontsize=8)
    ax_t.set_ylim(0, longest * scale * 1.2)
    ax_t.set_ylabel(f"step time ({unit})")
    ax_t.set_title("step time breakdown")
    mparts = {k: [r["memory_bytes_per_gpu"][k] / GB for r in records] for k in MEMORY_LABELS}
    _stacked(ax_m, labels, mparts, MEMORY_LABELS, MEMORY_COLORS, horizontal=False)
    for x, r in enumerate(records):
        cap = r["memory_bytes_per_gpu"]["capacity"] / GB
        ax_m.plot([x - 0.4, x + 0.4], [cap, cap], color="#C44E52", linestyle="--", linewidth=1.5,
                  label="usable capacity" if x == 0 else None)
    ax_m.set_ylabel("memory per GPU (GB)")
    ax_m.set_title("memory per GPU")
    for ax in (ax_t, ax_m):
        ax.set_xticks(range(len(records)), labels)
        ax.set_xlabel("plan rank")
        ax.grid(axis="y", alpha=0.3)
    key = "\n".join(f"#{i + 1}: {plan_text(r['plan'])} on {r['hardware']['gpus']} x {r['hardware']['gpu']}"
                    for i, r in enumerate(records))
    _legend_right(ax_t)
    _legend_right(ax_m)
    fig.suptitle(title)
    fig.tight_layout()
    fig.text(0.01, -0.01, key, fontsize=8, family="monospace", va="top")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plan_figures(records: Sequence[TrainingRecord], out_dir: Path, top_k: bool = False) -> list[Path]:
    """The plots of ``solve --plot`` / ``evaluate --plot``: step-time and memory breakdowns (+ the top-k)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [step_time_figure(records, out_dir / "step_time.png"), memory_figure(records, out_dir / "memory.png")]
    if top_k and len(records) > 1:
        paths.append(top_k_figure(records, out_dir / "top_k.png", title=f"Top {len(records)} plans"))
    return paths


def gantt_figure(sim: Simulation, path: Path) -> Path:
    """Gantt chart of a simulated step: one row per stream of each pipeline stage (at most 16 stages shown)."""
    from madmax_opt.analysis.trace_export import stream_label

    plt = _pyplot()
    p = len(sim.setup.stages)
    shown = sorted({round(i * (p - 1) / (MAX_GANTT_STAGES - 1)) for i in range(MAX_GANTT_STAGES)}) \
        if p > MAX_GANTT_STAGES else list(range(p))
    detail = "ops" if sim.event_count("ops") <= MAX_GANTT_EVENTS else "layers"
    bars: dict[tuple[int, str], dict[str, list[tuple[float, float]]]] = {}
    for ev in sim.events(detail):
        if ev.stage in shown and ev.dur_s > 0:
            bars.setdefault((ev.stage, ev.stream), {}).setdefault(ev.cat, []).append((ev.start_s, ev.dur_s))
    rows = [(s, k) for s in shown for k in sim.streams if (s, k) in bars]
    scale, unit = _time_unit(sim.step_time_s)
    min_width = sim.step_time_s * scale / 3000  # display only: sub-pixel ops (p2p sends) stay visible
    fig, ax = plt.subplots(figsize=(14, 1.5 + 0.28 * len(rows)))
    seen: set[str] = set()
    for y, key in enumerate(rows):
        for cat, spans in bars[key].items():
            cat_key = cat if cat in TERM_COLORS else "compute"
            ax.broken_barh([(a * scale, max(d * scale, min_width)) for a, d in spans], (y - 0.4, 0.8),
                           facecolors=TERM_COLORS[cat_key], edgecolor="none",
                           label=None if cat_key in seen else TERM_LABELS[cat_key].replace(" (exposed)", ""))
            seen.add(cat_key)
    labels = [f"stage {s} · {stream_label(k, sim.setup.stages[s].links.get(k))}" for s, k in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    for y in range(1, len(rows)):
        if rows[y][0] != rows[y - 1][0]:
            ax.axhline(y - 0.5, color="#999999", linewidth=0.5)
    ax.set_xlim(0, sim.step_time_s * scale * 1.01)
    ax.set_xlabel(f"time in the training step ({unit})")
    plan = plan_text(sim.setup.closed_form['plan'])
    hw = sim.setup.closed_form["hardware"]
    note = "" if len(shown) == p else f"; {len(shown)} of {p} stages shown"
    note += "" if detail == "ops" else "; one bar per layer pass (its collectives inside)"
    ax.set_title(f"{plan} on {hw['gpus']} x {hw['gpu']}: simulated step {sim.step_time_s * scale:,.1f} {unit} "
                 f"(closed form {sim.closed_form_step_s * scale:,.1f} {unit}, {sim.difference:+.1%}); "
                 f"{sim.setup.n_micro} micro-batches{note}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    _legend_right(ax)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
