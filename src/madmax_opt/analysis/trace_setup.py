"""Step simulation set-up: a plan's layers lowered to per-pass op templates on per-GPU streams, and the per-stage
programs (micro-batches, chunks, step-level traffic) that ``trace.simulate`` runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import Model, evaluate
from madmax_opt.analysis.records import TrainingRecord
from madmax_opt.core.errors import ProblemError
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.memory import WEIGHT_BYTES
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import RC, RECOMPUTE_MODES, Plan
from madmax_opt.model.training import MEMORY_REASON, layer_costs, stage_costs, trainable_layers

# The simulated step time agrees with the closed form within this relative tolerance on the shared validation
# cases and on random valid plans (results/validation/trace_vs_closed_form.md has the measured distribution).
TRACE_TOLERANCE = 0.03
COMPUTE, AG, DP, PP = "compute", "ag", "dp", "pp"
FULL = RC.FULL
MAX_TRACE_EVENTS = 400_000  # above this, ``events`` falls back to one event per layer pass
COMPUTE_CATS: tuple[str, ...] = ("compute", "recompute", "overhead", "optimizer")
HIDDEN_UNDER = {"cp_comm": "attention", "ep_comm": "mlp"}  # ring attention / expert GEMMs; TP hides under both


# ------------------------------------------------------------------------------------------ layer templates


@dataclass(frozen=True)
class Op:
    """One op of a layer pass, placed relative to the start of the pass."""

    stream: int
    name: str
    cat: str  # compute | recompute | a comm term (tp_comm, ...)
    start_s: float
    dur_s: float
    deps: tuple[int, ...]  # ops of the same pass this one waits for (cross-stream edges)
    blocking: bool = False  # a collective the compute stream waits for (hidden ones run under compute)


@dataclass(frozen=True)
class Unit:
    """One layer's forward, recompute or backward pass for one micro-batch, laid out on the streams."""

    kind: str  # fwd | rc | bwd
    ops: tuple[Op, ...]
    duration_s: float  # compute-stream span: the next pass starts here
    exit: int  # the op that ends the pass (what later ops depend on)
    busy_s: tuple[float, ...]  # per stream
    compute_s: dict[str, float]  # compute-stream busy time by category (compute, recompute, overhead)
    gaps_s: dict[str, float]  # compute-stream idle time inside the pass, by the communication it waits for


class _Layout:
    """A tiny list scheduler for one pass: compute ops in order, blocking and hidden comm on their streams."""

    def __init__(self, n_streams: int) -> None:
        self.free = [0.0] * n_streams
        self.t = 0.0
        self.ops: list[Op] = []
        self.last_compute = -1
        self.last_block = -1
        self.busy = [0.0] * n_streams
        self.compute_s: dict[str, float] = {"compute": 0.0, "recompute": 0.0, "overhead": 0.0}
        self.gaps: dict[str, float] = {}
        self.streams_cat: dict[int, str] = {}

    def compute(self, name: str, cat: str, work_s: float, overhead_s: float, hidden: dict[int, float]) -> None:
        dur = work_s + overhead_s
        if dur <= 0.0:
            return
        deps = (self.last_block,) if self.last_block >= 0 else ()
        start = self.t
        self.ops.append(Op(0, name, cat, start, dur, deps))
        self.last_compute, self.last_block = len(self.ops) - 1, -1
        self.compute_s[cat] += work_s
        self.compute_s["overhead"] += overhead_s
        self.busy[0] += dur
        self.t = start + dur
        for stream, h in hidden.items():
            if h > 0.0:
                hs = max(self.free[stream], start)
                self.ops.append(Op(stream, f"{self.streams_cat[stream][:2].upper()} overlapped", self.streams_cat[stream],
                                   hs, h, ()))
                self.free[stream] = hs + h
                self.busy[stream] += h

    def block(self, stream: int, name: str, dur: float) -> None:
        if dur <= 0.0:
            return
        cat = self.streams_cat[stream]
        start = max(self.t, self.free[stream])
        deps = (self.last_compute,) if self.last_compute >= 0 else ()
        self.ops.append(Op(stream, name, cat, start, dur, deps, blocking=True))
        self.last_block = len(self.ops) - 1
        self.free[stream] = start + dur
        self.busy[stream] += dur
        self.gaps[cat] = self.gaps.get(cat, 0.0) + start + dur - self.t
        self.t = start + dur

    def close(self, kind: str) -> Unit:
        # hidden comm that outlasts its compute holds the pass open (the next pass's collectives queue behind it)
        for stream, free in enumerate(self.free):
            if stream and free > self.t:
                cat = self.streams_cat[stream]
                self.gaps[cat] = self.gaps.get(cat, 0.0) + free - self.t
                self.t = free
        exit_ = len(self.ops) - 1
        ends = [op.start_s + op.dur_s for op in self.ops]
        if ends:
            exit_ = max(range(len(ends)), key=lambda i: (ends[i], i))
        return Unit(kind, tuple(self.ops), self.t, exit_, tuple(self.busy), dict(self.compute_s), dict(self.gaps))


@dataclass(frozen=True)
class LayerWork:
    """One layer, one micro-batch, from ``training.layer_costs`` (seconds)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    overhead_s: float
    exposed_s: dict[str, float]  # per comm term (tp_comm, cp_comm, ep_comm)
    hidden_s: dict[str, float]
    full_recompute: bool


def layer_units(w: LayerWork, comm_stream: dict[str, int], n_streams: int, attn_share: float,
                collective_names: dict[str, str]) -> tuple[Unit, ...]:
    """The passes of one layer: (fwd, bwd) or, with full recompute, (fwd, rc, bwd)."""
    kinds = ("fwd", "rc", "bwd") if w.full_recompute else ("fwd", "bwd")
    return tuple(_PassBuilder(w, kind, comm_stream, n_streams, attn_share, collective_names).build() for kind in kinds)


class _PassBuilder:
    """Lays out one pass of one layer: attention block then MLP block (reversed in backward), each followed by
    the collectives that join it to the next block."""

    def __init__(self, w: LayerWork, kind: str, comm_stream: dict[str, int], n_streams: int, attn_share: float,
                 collective_names: dict[str, str]) -> None:
        self.w, self.kind, self.comm_stream, self.names = w, kind, comm_stream, collective_names
        self.a, self.m = attn_share, 1.0 - attn_share
        total = w.fwd_s + w.recompute_s + w.bwd_s
        self.total = total
        share = {"fwd": w.fwd_s, "rc": w.recompute_s, "bwd": w.bwd_s}
        if not w.full_recompute:  # selective recompute runs inside the backward pass
            share = {"fwd": w.fwd_s, "rc": 0.0, "bwd": w.bwd_s + w.recompute_s}
        self.share = share[kind] / total if total > 0 else float(kind == "fwd")
        # compute that hides each collective kind, summed over the layer's blocks (the proportional split's base)
        blocks = w.fwd_s + w.bwd_s + (w.recompute_s if w.full_recompute else 0.0)
        self.window = {"tp_comm": blocks, "cp_comm": self.a * blocks, "ep_comm": self.m * blocks}
        self.exposed = {k: v * self.share for k, v in w.exposed_s.items()}
        self.cat = "recompute" if kind == "rc" else "compute"
        self.lay = _Layout(n_streams)
        self.lay.streams_cat = {s: k for k, s in comm_stream.items()}

    def hidden_for(self, block: str, work_s: float) -> dict[int, float]:
        """Hidden comm under this block: h_k x work / (all compute that hides kind k)."""
        out = {}
        for k, stream in self.comm_stream.items():
            base = self.window.get(k, self.window["tp_comm"])
            hides = HIDDEN_UNDER.get(k, block) == block
            out[stream] = self.w.hidden_s.get(k, 0.0) * work_s / base if base > 0 and hides else 0.0
        return out

    def collective(self, kind: str, fraction: float, name: str | None = None) -> None:
        if kind in self.comm_stream:
            label = name or self.names.get(kind, kind)
            self.lay.block(self.comm_stream[kind], f"{label} (exposed)", self.exposed.get(kind, 0.0) * fraction)

    def attention(self, label: str, work_s: float, ovh_s: float) -> None:
        self.lay.compute(f"{label} attention", self.cat, work_s, ovh_s, self.hidden_for("attention", work_s))
        self.collective("cp_comm", 1.0)
        self.collective("tp_comm", 0.5)

    def mlp(self, label: str, work_s: float, ovh_s: float) -> None:
        self.collective("ep_comm", 0.5, "MoE dispatch")
        self.lay.compute(f"{label} mlp", self.cat, work_s, ovh_s, self.hidden_for("mlp", work_s))
        self.collective("ep_comm", 0.5, "MoE combine")
        self.collective("tp_comm", 0.5)

    def build(self) -> Unit:
        w, a, m = self.w, self.a, self.m
        work = {"fwd": w.fwd_s, "rc": w.recompute_s, "bwd": w.bwd_s}[self.kind]
        ovh = w.overhead_s * self.share
        if self.kind == "bwd":
            if not w.full_recompute and w.recompute_s > 0:
                rc_ovh = w.overhead_s * w.recompute_s / self.total
                self.lay.compute("recompute (selective)", "recompute", w.recompute_s, rc_ovh, {})
                ovh -= rc_ovh
            self.mlp("bwd", work * m, ovh * m)
            self.attention("bwd", work * a, ovh * a)
        else:
            label = "recompute" if self.kind == "rc" else "fwd"
            self.attention(label, work * a, ovh * a)
            self.mlp(label, work * m, ovh * m)
        return self.lay.close(self.kind)


# ------------------------------------------------------------------------------------------ stage programs


@dataclass(frozen=True)
class StageWork:
    """Everything one pipeline stage does in a step, from the closed form's per-op costs (seconds)."""

    index: int
    layers: int  # transformer layers on the stage (all its virtual chunks)
    fwd: tuple[Unit, ...]  # the forward pass of one layer: (fwd,)
    bwd: tuple[Unit, ...]  # (bwd,) or (rc, bwd)
    emb_fwd_s: float
    emb_bwd_s: float
    head_fwd_s: float
    head_bwd_s: float
    send_s: float  # one pipeline send (activation or gradient of one virtual chunk)
    gather_s: float  # ZeRO-3: one weight all-gather per layer pass
    reduce_s: float  # ZeRO-3: one gradient reduce-scatter per layer backward
    bucket_s: float  # DP gradient sync of one layer, once per step
    optimizer_s: float
    links: dict[str, str]  # stream -> network tier name


@dataclass(frozen=True)
class Setup:
    """A plan prepared for simulation: the work of every stage, its streams and the evaluator's record."""

    problem: Problem
    plan: Plan
    streams: tuple[str, ...]  # compute, layer comm kinds (tp, cp, ep), ag, dp, pp: those the plan uses
    stages: tuple[StageWork, ...]
    n_micro: int
    vpp: int
    layer_ids: tuple[tuple[int, ...], ...]  # first global layer of (stage, chunk)
    chunk_layers: tuple[tuple[int, ...], ...]  # layers of (stage, chunk)
    closed_form: TrainingRecord  # the evaluator's record of the plan
    dp_overlap: bool = True  # stack.dp_overlap: gradient buckets under the backward, ZeRO-3 prefetch


def _link(option: HardwareOption, span: int) -> str:
    """The innermost network tier whose domain holds ``span`` consecutive ranks."""
    for tier in option.system.tiers:
        if tier.size is None or span <= tier.size:
            return tier.name
    return option.system.tiers[-1].name


def _attn_share(model: Model) -> float:
    wl = model.workload
    attn = sum(g.flops_per_token for g in wl.gemms if g.name in ("qkv", "proj")) + wl.attn_flops_per_token
    return float(min(0.95, max(0.05, attn / max(wl.layer_flops_per_token, 1))))


def _collective_names(plan: Plan) -> dict[str, str]:
    return {"tp_comm": "TP reduce-scatter/all-gather" if plan.sp else "TP all-reduce",
            "cp_comm": "CP ring KV exchange", "ep_comm": "MoE all-to-all"}


def setup(model: Model, plan: Plan) -> Setup:
    """Per-stage work of ``plan`` from ``training.layer_costs`` / ``stage_costs`` (the evaluator's numbers)."""
    problem = model.problem
    task = problem.training_task
    record = evaluate(problem, [plan])[0]
    code = _invalid_code(model, plan)
    if code not in (0, MEMORY_REASON):
        raise ProblemError(f"cannot simulate an invalid plan: {record['infeasible_reason']}", file=problem.source,
                           field="plan")
    p, v = plan.pp, plan.vpp
    wl = model.workload
    if plan.stage_systems is not None:
        stage_hw = [model.system_index(name) for name in plan.stage_systems]
    else:
        stage_hw = [problem.hw_index(plan)] * p
    base = PlanArrays.from_plans([plan], [stage_hw[0]])
    layers = list(plan.stage_layers) if plan.stage_layers is not None else [wl.layers // p] * p
    rc = ([RECOMPUTE_MODES.index(r) for r in plan.stage_recompute] if plan.stage_recompute is not None
          else [int(base.recompute[0])] * p)
    stages_arr = base.take(np.zeros(p, dtype=np.int64))
    stages_arr = replace(stages_arr, recompute=np.asarray(rc, dtype=np.int64),
                         hw=np.asarray(stage_hw, dtype=np.int64))
    lc = layer_costs(wl, task, problem.stack, model.table, stages_arr)
    s_idx = np.arange(p, dtype=np.float64)
    train = _trainable_layers(wl.frozen_layers, layers, p, v, plan.stage_layers is not None)
    sc = stage_costs(lc, problem.stack, model.table.hbm_bw[stages_arr.hw], np.asarray(layers, dtype=np.float64),
                     (s_idx == 0).astype(np.float64), (s_idx == p - 1).astype(np.float64), np.ones(p), train)
    n_micro = task.global_batch // (plan.dp * plan.mbs)
    comm_terms = [k for k in lc.time if k.endswith("_comm")]

    def at(x: Any, s: int) -> float:
        return float(np.broadcast_to(np.asarray(x, dtype=np.float64), (p,))[s])

    work = [
        LayerWork(
            fwd_s=at(lc.time["compute"], s) - at(lc.bwd_s, s),
            # backward + weight-gradient GEMMs of the stage's trainable layers, averaged over its layers
            bwd_s=at(lc.bwd_s, s) + at(lc.wgrad_s, s) * float(train[s]) / layers[s],
            recompute_s=at(lc.time["recompute"], s),
            overhead_s=at(lc.time["overhead"], s),
            exposed_s={k: at(lc.time[k], s) for k in comm_terms},
            hidden_s={k: at(lc.hidden.get(k, 0.0), s) for k in comm_terms},
            full_recompute=rc[s] == FULL,
        )
        for s in range(p)
    ]
    used = [k for k in comm_terms if any(w.exposed_s[k] + w.hidden_s[k] > 0 for w in work)]
    zero3_s = [at(sc.time["zero3_comm"], s) + at(sc.hidden["zero3_comm"], s) for s in range(p)]  # per micro-batch
    sync_s = [at(sc.dp_exposed_s, s) + at(sc.hidden["dp_comm"], s) for s in range(p)]  # per step
    streams = (COMPUTE, *(k.removesuffix("_comm") for k in used), *([AG] if any(zero3_s) else []),
               *([DP] if any(zero3_s) or any(sync_s) else []), *([PP] if p > 1 else []))
    comm_stream = {k: i + 1 for i, k in enumerate(used)}
    attn = _attn_share(model)
    names = _collective_names(plan)
    g = Groups.of_plan(plan)  # rank spans: tp, cp (tp x cp), ep (tp x cp x ep), a stage (dp x tp x cp), two stages
    spans = {"tp": plan.tp, "cp": plan.tp * plan.cp, "ep": int(g.expert_dp_stride), AG: int(g.stage),
             DP: int(g.stage), PP: 2 * int(g.stage)}
    works = []
    for s, w in enumerate(work):
        full = w.full_recompute
        units = layer_units(w, comm_stream, len(streams), attn, names)
        n = layers[s]
        gathers = 3.0 if full else 2.0  # layer passes that need the weights: fwd, (rc), bwd
        gather_bytes = WEIGHT_BYTES * at(lc.params, s)
        reduce_bytes = lc.grad_bytes * (at(lc.trainable, s) * float(train[s]) / n + at(lc.lora_trainable, s))
        per_layer = zero3_s[s] / n  # the stage's ZeRO-3 traffic per micro-batch, split evenly over its layers
        denom = gathers * gather_bytes + reduce_bytes
        # one gather = Z_layer * 2 B x params / (g x 2 B x params + grad_bytes x trainable): split by bytes moved
        gather = per_layer * gather_bytes / denom if denom > 0 else 0.0
        emb = at(lc.emb_time_s, s) if s == 0 else 0.0
        head = at(lc.head_time_s, s) if s == p - 1 else 0.0
        option = problem.hardware[stage_hw[s]]
        works.append(StageWork(
            index=s, layers=n, fwd=units[:1], bwd=units[1:],
            emb_fwd_s=emb / 3, emb_bwd_s=emb * 2 / 3, head_fwd_s=head / 3, head_bwd_s=head * 2 / 3,
            send_s=at(lc.pp_comm_s, s) / (2 * v) if p > 1 else 0.0,  # pp_comm = 2 v sends per micro-batch
            gather_s=gather, reduce_s=per_layer - gathers * gather,
            bucket_s=sync_s[s] / n, optimizer_s=at(sc.optimizer_s, s),  # one gradient bucket per layer
            links={k: _link(option, span) for k, span in spans.items() if k in streams},
        ))
    # layer ids: model chunk k = c * p + s holds layers [k * n_c, (k + 1) * n_c) (uniform) or the stage's block
    if plan.stage_layers is not None:  # uneven: a stage's layers split over its v chunks as evenly as they go
        sizes = [[int(layers[s]) // v + (1 if c < int(layers[s]) % v else 0) for c in range(v)] for s in range(p)]
        order = [(c, s) for c in range(v) for s in range(p)]  # model chunk k = c * p + s
        starts = np.concatenate([[0], np.cumsum([sizes[s][c] for c, s in order])[:-1]]).astype(int)
        first = {cs: int(starts[k]) for k, cs in enumerate(order)}
        ids: tuple[tuple[int, ...], ...] = tuple(tuple(first[(c, s)] for c in range(v)) for s in range(p))
        chunk_layers: tuple[tuple[int, ...], ...] = tuple(tuple(sizes[s]) for s in range(p))
    else:
        n_c = wl.layers // (p * v)
        ids = tuple(tuple((c * p + s) * n_c for c in range(v)) for s in range(p))
        chunk_layers = tuple((n_c,) * v for _ in range(p))
    return Setup(problem, plan, streams, tuple(works), n_micro, v, ids, chunk_layers, record,
                 dp_overlap=problem.stack.dp_overlap)


def _trainable_layers(frozen: int, layers: list[int], p: int, v: int, uneven: bool) -> NDArray[np.float64]:
    """Layers with trainable base weights per stage (the model's first ``frozen`` layers are frozen); stage s holds
    model chunks c * p + s of n / v layers each (interleaved) or one block of its layers."""
    if uneven or v == 1:
        ends = np.cumsum(layers).astype(np.float64)
        return trainable_layers(ends, np.asarray(layers, dtype=np.float64), float(frozen))
    n_c = layers[0] / v
    chunk_end = np.array([[(c * p + s + 1) * n_c for c in range(v)] for s in range(p)])
    return np.asarray(trainable_layers(chunk_end, np.full_like(chunk_end, n_c), float(frozen)).sum(axis=1))


def _invalid_code(model: Model, plan: Plan) -> int:
    if plan.stage_layers is None:
        return int(model.terms(model.arrays([plan])).invalid[0])
    assert plan.stage_recompute is not None
    rc = [RECOMPUTE_MODES.index(r) for r in plan.stage_recompute]
    if plan.stage_systems is None:
        base = model.arrays([plan])
        return int(model.staged(base, list(plan.stage_layers), rc).invalid[0])
    stage_hw = [model.system_index(name) for name in plan.stage_systems]
    base = PlanArrays.from_plans([plan], [stage_hw[0]])
    return int(model.staged(base, list(plan.stage_layers), rc, stage_hw).invalid[0])
