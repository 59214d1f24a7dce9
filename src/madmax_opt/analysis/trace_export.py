"""Simulated steps out: Chrome / Perfetto trace events and re-ranking of top-k plans by simulated step time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from madmax_opt.analysis.evaluator import Model
from madmax_opt.analysis.trace import simulate
from madmax_opt.analysis.trace_result import Simulation
from madmax_opt.analysis.trace_setup import AG, COMPUTE, DP, PP, TRACE_TOLERANCE
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan

# -------------------------------------------------------------------------------------------- trace export




STREAM_LABELS = {COMPUTE: "compute", "tp": "TP comm", "cp": "CP comm", "ep": "EP all-to-all",
                 AG: "ZeRO-3 all-gather", DP: "grad reduce", PP: "pipeline p2p"}


def stream_label(stream: str, link: str | None) -> str:
    label = STREAM_LABELS.get(stream, stream)
    return f"{label} ({link})" if link and stream != COMPUTE else label


def chrome_trace(sim: Simulation, detail: str = "ops") -> dict[str, Any]:
    """The step as a Chrome trace-event JSON object (Perfetto / chrome://tracing): one process per pipeline stage,
    one thread per stream; complete events (``ph: X``, ``ts``/``dur`` in microseconds), track-name metadata, and
    flow arrows for pipeline sends. ``args.deps`` lists the event ids each event waited for."""
    su = sim.setup
    out: list[dict[str, Any]] = []
    plan = su.closed_form["plan"]
    for s, w in enumerate(su.stages):
        out.append({"name": "process_name", "ph": "M", "pid": s, "tid": 0,
                    "args": {"name": f"pipeline stage {s} ({w.layers} layers)"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": s, "tid": 0, "args": {"sort_index": s}})
        for k, stream in enumerate(sim.streams):
            out.append({"name": "thread_name", "ph": "M", "pid": s, "tid": k,
                        "args": {"name": stream_label(stream, w.links.get(stream))}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": k, "args": {"sort_index": k}})
    index = {k: i for i, k in enumerate(sim.streams)}
    flows = 0
    receivers: dict[int, tuple[int, int]] = {}  # send event id -> (flow id, sending stage)
    for ev in sim.events(detail):
        ts = round(ev.start_s * 1e6, 3)
        dur = round(ev.end_s * 1e6, 3) - ts
        item: dict[str, Any] = {"name": ev.name, "cat": ev.cat, "ph": "X", "ts": ts, "dur": round(dur, 3),
                                "pid": ev.stage, "tid": index[ev.stream],
                                "args": {"id": ev.id, **ev.args, **({"deps": list(ev.deps)} if ev.deps else {})}}
        out.append(item)
        if ev.cat == "pp_comm":
            flows += 1
            receivers[ev.id] = (flows, ev.stage)
            out.append({"name": "p2p", "cat": "pp_comm", "ph": "s", "id": flows, "ts": ts, "pid": ev.stage,
                        "tid": index[ev.stream]})
        for d in ev.deps:  # the arrow ends where the other stage's compute picks the data up
            if d in receivers and ev.stream == COMPUTE and receivers[d][1] != ev.stage:
                out.append({"name": "p2p", "cat": "pp_comm", "ph": "f", "bp": "e", "id": receivers.pop(d)[0],
                            "ts": ts, "pid": ev.stage, "tid": index[ev.stream]})
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "madmax-opt timeline",
            "plan": plan,
            "hardware": su.closed_form["hardware"],
            "step_time_s": sim.step_time_s,
            "closed_form_step_time_s": sim.closed_form_step_s,
        },
    }


# ----------------------------------------------------------------------------------------------- re-ranking


def rerank(problem: Problem, records: Sequence[dict[str, Any]], tolerance: float = TRACE_TOLERANCE
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Order solver records by their simulated objective; the closed-form best stays first unless another plan
    beats it by more than ``tolerance`` in simulation. Each record gains ``simulated_step_time_s``."""
    model = Model(problem)
    out = []
    for rec in records:
        plan = Plan.model_validate({k: v for k, v in rec["plan"].items() if v is not None})
        sim = simulate(model, plan, record=False)
        out.append({**rec, "simulated_step_time_s": sim.step_time_s})

    def objective(r: dict[str, Any]) -> float:
        t = float(r["simulated_step_time_s"])
        return t * float(r["cost_per_hour_usd"]) if problem.objective == "cost" else t

    order = sorted(range(len(out)), key=lambda i: (objective(out[i]), i))
    best = order[0]
    keep = objective(out[0]) <= objective(out[best]) * (1.0 + tolerance)
    if keep:
        order = [0, *(i for i in order if i != 0)]
    info = {
        "tolerance": tolerance,
        "kept_closed_form_best": keep,
        "closed_form_rank": [i + 1 for i in order],
        "simulated_step_time_s": [out[i]["simulated_step_time_s"] for i in order],
    }
    return [out[i] for i in order], info
