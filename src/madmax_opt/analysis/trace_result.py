"""What the step-timeline simulator (``trace.py``) returns: per-stage results, the :class:`Simulation` and its
JSON summary, and the trace events that its records expand into (templates of identical layers unrolled)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from madmax_opt.analysis.trace_setup import COMPUTE, TRACE_TOLERANCE, Setup
from madmax_opt.core.errors import ProblemError


@dataclass
class StageResult:
    """One stage's step: busy time per stream and where its compute stream's time went."""

    busy_s: list[float]  # per stream
    breakdown_s: dict[str, float]  # STEP_TERMS: compute-stream busy by category + idle by cause; sums to step


@dataclass
class Simulation:
    setup: Setup
    step_time_s: float
    stages: list[StageResult]
    records: list[tuple[Any, ...]] = field(repr=False)
    wall_s: float = 0.0

    @property
    def streams(self) -> tuple[str, ...]:
        return self.setup.streams

    @property
    def closed_form_step_s(self) -> float:
        return float(self.setup.closed_form["step_time_s"])

    @property
    def difference(self) -> float:
        """Simulated / closed-form step time - 1."""
        return self.step_time_s / self.closed_form_step_s - 1.0

    @property
    def critical_stage(self) -> int:
        """The stage with the most compute-stream work (the pipeline's bottleneck)."""
        busy = [sum(r.breakdown_s[k] for k in ("compute", "recompute", "overhead")) for r in self.stages]
        return int(np.argmax(busy))

    def exposed_comm_s(self, stage: int) -> float:
        return sum(v for k, v in self.stages[stage].breakdown_s.items() if k.endswith("_comm"))

    def summary(self) -> dict[str, Any]:
        """The JSON summary of ``madmax-opt timeline --json``."""
        step = self.step_time_s
        crit = self.critical_stage
        su = self.setup
        return {
            "plan": su.closed_form["plan"],
            "hardware": su.closed_form["hardware"],
            "step_time_s": step,
            "closed_form_step_time_s": self.closed_form_step_s,
            "difference": self.difference,
            "tolerance": TRACE_TOLERANCE,
            "within_tolerance": abs(self.difference) <= TRACE_TOLERANCE,
            "micro_batches": su.n_micro,
            "schedule": "interleaved 1F1B" if su.vpp > 1 else "1F1B",
            "critical_stage": crit,
            "breakdown_s": self.stages[crit].breakdown_s,
            "closed_form_breakdown_s": su.closed_form["time_breakdown_s"],
            "exposed_comm_s": self.exposed_comm_s(crit),
            "stages": [
                {
                    "stage": s,
                    "layers": su.stages[s].layers,
                    "busy_s": dict(zip(self.streams, r.busy_s, strict=True)),
                    "idle_s": {k: step - b for k, b in zip(self.streams, r.busy_s, strict=True)},
                    "links": {k: su.stages[s].links.get(k, "gpu") for k in self.streams},
                    "breakdown_s": r.breakdown_s,
                    "exposed_comm_s": self.exposed_comm_s(s),
                }
                for s, r in enumerate(self.stages)
            ],
            "simulation_wall_s": self.wall_s,
        }

    def events(self, detail: str = "ops") -> list[TraceEvent]:
        """Every op as a :class:`TraceEvent` (``detail="layers"``: one compute event per layer pass)."""
        if detail not in ("ops", "layers"):
            raise ProblemError(f"unknown trace detail {detail!r}; allowed: ops, layers", field="--detail")
        return list(expand_events(self, detail == "ops"))

    def event_count(self, detail: str = "ops") -> int:
        n = 0
        for rec in self.records:
            if rec[0] == "units":
                units, count = rec[3], rec[5]
                n += count * (sum(len(u.ops) for u in units) if detail == "ops" else len(units))
            else:
                n += 1
        return n


@dataclass(frozen=True)
class TraceEvent:
    id: int
    stage: int
    stream: str
    name: str
    cat: str
    start_s: float
    dur_s: float
    deps: tuple[int, ...]  # events that must end before this one starts
    args: dict[str, Any]

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


def expand_events(sim: Simulation, ops: bool) -> Iterator[TraceEvent]:
    """Records -> events with ids; dependencies point at the exit event of the record they name."""
    streams = sim.streams
    exit_of: list[int] = []
    next_id = 0
    for rec in sim.records:
        if rec[0] in ("op", "link"):
            if rec[0] == "op":
                _, s, stream, name, cat, start, dur, deps, args = rec
            else:
                _, s, stream, name, cat, op, deps, args = rec
                start, dur = op.start_s, op.end_s - op.start_s
            ev = TraceEvent(next_id, s, streams[stream], name, cat, start, dur,
                            tuple(exit_of[d] for d in deps), dict(args))
            next_id += 1
            exit_of.append(ev.id)
            yield ev
            continue
        _, s, t0, units, span, count, layer0, step, mb, c, deps = rec
        entry_deps = tuple(exit_of[d] for d in deps)
        prev_exit = -1
        for i in range(count):
            layer = layer0 + i * step
            t_u = t0 + i * span
            for u in units:
                args = {"mb": mb, "chunk": c, "layer": layer}
                if not ops:
                    cat = "recompute" if u.kind == "rc" else "compute"
                    dep = entry_deps if prev_exit < 0 else ()
                    yield TraceEvent(next_id, s, COMPUTE, f"L{layer} {u.kind}", cat, t_u, u.duration_s, dep, args)
                    prev_exit = next_id
                    next_id += 1
                else:
                    base = next_id
                    for j, op in enumerate(u.ops):
                        dep = tuple(base + d for d in op.deps)
                        if j == 0:
                            dep = dep + (entry_deps if prev_exit < 0 else ((prev_exit,) if op.stream == 0 else ()))
                        yield TraceEvent(next_id, s, streams[op.stream], f"L{layer} {op.name}", op.cat,
                                         t_u + op.start_s, op.dur_s, dep, args)
                        next_id += 1
                    prev_exit = base + u.exit
                t_u += u.duration_s
        exit_of.append(prev_exit)
