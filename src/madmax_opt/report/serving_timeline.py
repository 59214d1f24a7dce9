"""``madmax-opt timeline`` on an inference problem: a serving plan's decode rounds and prefill as a Chrome trace
(Perfetto) and a Gantt PNG, cross-checked against the closed-form serving step times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.serving_trace import (
    PREFILL_PID,
    STREAM_LABELS,
    STREAMS,
    ServingTimeline,
    chrome_trace,
    simulate_serving,
)
from madmax_opt.analysis.trace_setup import TRACE_TOLERANCE
from madmax_opt.core.errors import ProblemError
from madmax_opt.model.problem import Problem

CATEGORY_COLORS = {"attention": "#4c72b0", "gemm": "#55a868", "overhead": "#8c8c8c", "head": "#937860",
                   "tp_comm": "#c44e52", "ep_comm": "#dd8452", "pp_comm": "#8172b3", "kv_transfer": "#da8bc3"}
CATEGORY_LABELS = {"attention": "attention + QKV/O GEMMs", "gemm": "MLP / expert GEMMs", "overhead": "norms, launches",
                   "head": "LM head", "tp_comm": "TP all-reduce", "ep_comm": "EP all-to-all",
                   "pp_comm": "pipeline p2p", "kv_transfer": "KV-cache transfer"}


def serving_timeline(problem: Problem, plan_file: Path, index: int) -> ServingTimeline:
    from madmax_opt.report.serving_tables import load_serving_plans
    from madmax_opt.search.serving_space import ServingModel

    plans, _ = load_serving_plans(plan_file)
    if not 0 <= index < len(plans):
        raise ProblemError(f"plan index {index} out of range; allowed: 0 to {len(plans) - 1}", file=str(plan_file),
                           field="--index")
    plan = plans[index]
    model = ServingModel(problem)
    arr = model.arrays([plan])
    code = int(model.terms(arr).invalid[0])
    if code:
        from madmax_opt.model.inference import INVALID_REASONS

        raise ProblemError(INVALID_REASONS[code], file=str(plan_file), field=f"[{index}]" if index else None)
    return simulate_serving(model.workload, model.task, problem.stack, model.table, model.cal, arr,
                            plan.model_dump(exclude_none=True, exclude_defaults=True))


def gantt(tl: ServingTimeline, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({(e.pid, e.stream) for e in tl.events if e.dur_s > 0},
                  key=lambda r: (r[0], STREAMS.index(r[1])))
    index = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 1.5 + 0.3 * len(rows)))
    end = tl.end_s
    bars: dict[tuple[int, str, str], list[tuple[float, float]]] = {}  # one bar collection per row and category
    for e in tl.events:
        if e.dur_s > 0:
            bars.setdefault((e.pid, e.stream, e.cat), []).append((e.start_s * 1e3, max(e.dur_s, end / 3000) * 1e3))
    seen: set[str] = set()
    for (pid, stream, cat), spans in bars.items():
        ax.broken_barh(spans, (index[(pid, stream)] - 0.4, 0.8), facecolors=CATEGORY_COLORS.get(cat, "#333333"),
                       edgecolor="none", label=None if cat in seen else CATEGORY_LABELS.get(cat, cat))
        seen.add(cat)

    def row_label(pid: int, stream: str) -> str:
        who = f"prefill stage {pid - PREFILL_PID}" if pid >= PREFILL_PID else f"decode stage {pid}"
        return f"{who} · {STREAM_LABELS[stream]}"

    ax.set_yticks(range(len(rows)), [row_label(*r) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1e3 * 1.01)
    ax.set_xlabel("time (ms)")
    d = tl.differences
    ax.set_title(f"serving plan {tl.plan}: decode round {tl.simulated['decode_round_s'] * 1e3:,.2f} ms "
                 f"({d.get('decode_round_s', 0.0):+.2%} vs closed form), TPOT {tl.simulated['tpot_s'] * 1e3:,.2f} ms "
                 f"({d.get('tpot_s', 0.0):+.2%})", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def write_serving_timeline(tl: ServingTimeline, out_dir: Path, stem: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / f"{stem}.trace.json"
    with trace.open("w", encoding="utf-8") as f:
        json.dump(chrome_trace(tl), f, separators=(",", ":"))
    return {"trace": trace, "gantt": gantt(tl, out_dir / f"{stem}.gantt.png")}


def summary(tl: ServingTimeline, files: dict[str, Path]) -> dict[str, Any]:
    return {"plan": tl.plan, "simulated_s": tl.simulated, "closed_form_s": tl.closed_form,
            "difference": tl.differences, "tolerance": TRACE_TOLERANCE, "events": len(tl.events),
            "files": {k: str(v) for k, v in files.items()}}


def serving_timeline_cmd(problem: Problem, plan: Path, index: int, out: Path, json_out: bool,
                         console: Console) -> str | None:
    """The serving branch of ``madmax-opt timeline``; returns the warning when beyond the tolerance (the caller
    prints it on stderr and exits 1, as for training)."""
    tl = serving_timeline(problem, plan, index)
    files = write_serving_timeline(tl, out, plan.stem if index == 0 else f"{plan.stem}-{index}")
    if json_out:
        print(json.dumps(summary(tl, files), indent=2))
    else:
        t = Table(title=f"simulated serving step: {tl.plan}", header_style="bold")
        for c in ("quantity", "simulated (ms)", "closed form (ms)", "difference"):
            t.add_column(c, justify="left" if c == "quantity" else "right")
        for k, v in tl.closed_form.items():
            t.add_row(k.removesuffix("_s").replace("_", " "), f"{tl.simulated[k] * 1e3:,.3f}", f"{v * 1e3:,.3f}",
                      f"{tl.differences.get(k, 0.0):+.2%}")
        console.print(t)
        console.print(f"tolerance {TRACE_TOLERANCE:.0%}; wrote {files['trace']} and {files['gantt']}")
    if tl.within_tolerance:
        return None
    worst = max(tl.differences.items(), key=lambda kv: abs(kv[1]))
    return (f"warning: simulated {worst[0]} differs from the closed form by {worst[1]:+.2%}, beyond the "
            f"{TRACE_TOLERANCE:.0%} tolerance (the outputs were written)")
