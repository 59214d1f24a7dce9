"""Event-level simulation of one training step: every op of every layer and micro-batch on per-GPU streams.

The closed form (``training.py``) adds per-micro-batch stage times and approximates the pipeline bubble, the DP
gradient overlap and the ZeRO-3 prefetch by formulas. This module replays the same per-op costs
(``training.layer_costs`` and ``training.stage_costs``; no cost formula is repeated here) as events on the streams
of one GPU per pipeline stage (all GPUs of a stage run the same program) and reports when the step really ends.

Streams: ``compute``; one communication stream per layer collective kind that the cost model reports (``tp``,
``cp``, ``ep``); ``ag`` (ZeRO-3 weight all-gathers) and ``dp`` (DP gradient buckets, ZeRO-3 reduce-scatters) on
separate streams as FSDP issues them; ``pp`` (pipeline sends). Only the streams a plan uses exist. Each
communication stream is labelled with the network tier its process group spans (NVLink inside a node, the network
across nodes). Ops on one stream run in issue order and streams run concurrently, as NCCL communicators do; MAD-Max's
model (Hsia et al. 2024, two streams with cross-stream dependencies) is the special case of one comm stream. The
streams of a GPU on one tier share its bandwidth while step-level traffic (ZeRO-3, gradient buckets, pipeline
sends) is in flight: busy streams split it equally (``SharedLink``; the closed form gives each collective the full
link, and so does the simulation between such traffic, where only one layer collective runs at a time).

One layer pass (forward; backward runs the blocks in reverse): attention block compute, exposed CP ring exchange,
TP collective, exposed MoE dispatch, MLP block compute, MoE combine, TP collective. The closed form reports per
layer and micro-batch: forward compute (compute - bwd), backward compute, recompute, launch overhead, and per
collective kind the exposed and the overlapped (hidden) time. Placement rules (scheduling, not cost):
- exposed communication is split over the forward, recompute and backward passes in proportion to their compute
  (``training.py`` reports it per layer, not per pass), and inside a pass over its blocking points (TP: two equal
  collectives, one after each block; CP: one in the attention block; EP: dispatch and combine around the MLP);
- hidden communication runs on its stream under the compute that hides it (TP: every block; CP: attention
  blocks; EP: MLP blocks), in proportion to that compute; launch overhead is spread like compute;
- the attention/MLP split of a pass is by model FLOPs (display only: both run back to back on compute);
- embedding (first stage) and LM head + loss (last stage): 1/3 of their time forward, 2/3 backward.

Step-level rules: pipeline sends are synchronous (Megatron-Core p2p: the sender waits for the transfer, the
receiver for the data); DP gradients are reduced per layer bucket as soon as the layer's last micro-batch backward
is done (Megatron DDP ``overlap_grad_reduce``; the closed form's per-stage sync is split evenly over the stage's
layers); ZeRO-3 gathers one unit (layer pass) ahead and reduce-scatters each layer's gradients after its backward
(FSDP prefetch; the closed form's per-stage traffic split over layers and, within a layer, by bytes: bf16 weights
per gather, ``grad_bytes`` per reduce-scatter); the optimizer step waits for every stage's reductions (the
gradient-norm all-reduce over the model-parallel group) and takes ``stage_costs``'s optimizer time. Schedules:
1F1B (Narayanan et al. 2021, PipeDream-Flush) and Megatron-Core's interleaved 1F1B.

Identical layers are aggregated: the passes of a chunk's layers that issue no step-level traffic (no ZeRO-3
gather, no gradient bucket) while none is in flight on their tiers advance in O(1) as n copies of the layer
template; the others go layer by layer, op by op on a contended tier. The trace expands templates on export.

Modules: this one schedules and runs the engine; ``trace_setup`` prepares the per-stage work from the closed form,
``trace_link`` models a shared tier (processor sharing), ``trace_result`` holds the :class:`Simulation` with its
summary and trace events, ``trace_export`` writes Chrome traces and re-ranks plans."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from madmax_opt.analysis.evaluator import Model
from madmax_opt.analysis.trace_link import LinkOp, SharedLink
from madmax_opt.analysis.trace_result import Simulation, StageResult
from madmax_opt.analysis.trace_setup import AG, COMPUTE_CATS, DP, PP, Setup, Unit, setup
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import STEP_TERMS

# ------------------------------------------------------------------------------------------------ schedules


def schedule(p: int, v: int, m: int, stage: int) -> list[tuple[int, int, int]]:
    """(is_backward, micro-batch, chunk) in the order stage ``stage`` runs them.

    v = 1: 1F1B, min(p - s - 1, m) warm-up forwards, then one forward one backward, then the cool-down backwards.
    v > 1: Megatron-Core's interleaved 1F1B (m divisible by p): warm-up (p - s - 1) * 2 + (v - 1) * p virtual
    forwards (all of them when m = p); the k-th virtual op runs chunk (k mod pv) // p (reversed for backward) of
    micro-batch (k // pv) * p + k mod p.
    """
    if v == 1:
        warm = min(p - stage - 1, m)
        order = [(0, i, 0) for i in range(warm)]
        for i in range(m - warm):
            order += [(0, warm + i, 0), (1, i, 0)]
        return order + [(1, i, 0) for i in range(m - warm, m)]
    total = m * v
    warm = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)

    def op(k: int, backward: bool) -> tuple[int, int, int]:
        chunk = (k % (p * v)) // p
        return (int(backward), (k // (p * v)) * p + k % p, v - 1 - chunk if backward else chunk)

    order = [op(k, False) for k in range(warm)]
    for i in range(total - warm):
        order += [op(warm + i, False), op(i, True)]
    return order + [op(k, True) for k in range(total - warm, total)]


# ---------------------------------------------------------------------------------------------- simulation


class _Stage:
    """Mutable state of one stage during the simulation."""

    __slots__ = ("busy", "c_free", "cat", "deps", "gaps", "gather", "gather_rec", "last_link_rec", "last_rec",
                 "links", "units_left")

    def __init__(self, n_streams: int, n_links: int, units_left: int) -> None:
        self.c_free = 0.0
        self.busy = [0.0] * n_streams
        self.cat = dict.fromkeys(COMPUTE_CATS, 0.0)
        self.gaps: dict[str, float] = {}
        self.deps: list[int] = []  # records the next compute op waits for (cross-stream)
        self.links = [SharedLink() for _ in range(n_links)]
        self.gather: LinkOp | None = None  # ZeRO-3: the gather issued for the next layer pass
        self.gather_rec = -1
        self.last_link_rec = -1
        self.last_rec = -1  # last record on the compute stream
        self.units_left = units_left

    def gap(self, cause: str, dt: float) -> None:
        if dt > 0.0:
            self.gaps[cause] = self.gaps.get(cause, 0.0) + dt


def simulate(model: Model, plan: Plan, *, record: bool = True) -> Simulation:
    """Simulate one training step of ``plan``; ``record=False`` skips the trace records (benchmarks)."""
    t0 = time.perf_counter()
    sim = simulate_setup(setup(model, plan), record=record)
    sim.wall_s = time.perf_counter() - t0
    return sim


def simulate_setup(su: Setup, *, record: bool = True) -> Simulation:
    """Simulate prepared per-stage work (what-if studies: edit a :class:`Setup` with ``dataclasses.replace``)."""
    return _Engine(su, record).run()


class _Engine:
    def __init__(self, su: Setup, record: bool) -> None:
        self.su = su
        self.record = record
        self.p, self.v, self.m = len(su.stages), su.vpp, su.n_micro
        self.n_streams = len(su.streams)
        self.ag, self.dp, self.pp = (su.streams.index(k) if k in su.streams else -1 for k in (AG, DP, PP))
        self.recs: list[tuple[Any, ...]] = []
        # per stage: the link (network tier) of every comm stream; the layer streams that share a tier with
        # step-level traffic (ZeRO-3, gradient buckets, pipeline sends) must go op by op while it is in flight
        self.link_of: list[list[int]] = []
        self.shared: list[list[int]] = []
        step_streams = {k for k in (AG, DP, PP) if k in su.streams}
        self.st = []
        for s, w in enumerate(su.stages):
            tiers = sorted({w.links[k] for k in su.streams[1:]})
            link_of = [-1] + [tiers.index(w.links[k]) for k in su.streams[1:]]
            step_links = {link_of[su.streams.index(k)] for k in step_streams}
            layer_links = {link_of[i] for i, k in enumerate(su.streams) if i and k not in step_streams}
            self.link_of.append(link_of)
            self.shared.append(sorted(step_links & layer_links))
            units = self.m * sum(su.chunk_layers[s]) * (len(w.fwd) + len(w.bwd))
            self.st.append(_Stage(self.n_streams, len(tiers), units))
        size = self.p * self.v * self.m
        # data a chunk waits for: (end, start, record) of the send that delivers it, per direction
        self.inbox: list[list[tuple[float, float, int] | None]] = [[None] * size, [None] * size]

    def _key(self, s: int, c: int, mb: int) -> int:
        return (s * self.v + c) * self.m + mb

    def _rec(self, rec: tuple[Any, ...]) -> int:
        if not self.record:
            return -1
        self.recs.append(rec)
        return len(self.recs) - 1

    def _link(self, s: int, stream: int) -> SharedLink:
        return self.st[s].links[self.link_of[s][stream]]

    def run(self) -> Simulation:
        p, v = self.p, self.v
        orders = [schedule(p, v, self.m, s) for s in range(p)]
        ptr = [0] * p
        waiting: dict[tuple[int, int], int] = {}
        ready = deque(range(p))
        done = 0
        while ready:
            s = ready.popleft()
            order = orders[s]
            while ptr[s] < len(order):
                bwd, mb, c = order[ptr[s]]
                msg = None
                if self._has_source(s, c, bwd):
                    key = self._key(s, c, mb)
                    msg = self.inbox[bwd][key]
                    if msg is None:
                        waiting[(bwd, key)] = s
                        break
                target = self._block(s, bwd, mb, c, msg)
                ptr[s] += 1
                if target is not None and target in waiting:
                    ready.append(waiting.pop(target))
            else:
                done += 1
        if done != p:  # a schedule bug, never a user error
            raise RuntimeError(f"pipeline schedule deadlocked: {ptr} of {[len(o) for o in orders]} ops done")
        return self._finish()

    def _has_source(self, s: int, c: int, bwd: int) -> bool:
        """Whether a send from another (stage, chunk) feeds this block (not the model's first / last chunk)."""
        if not bwd:
            return s > 0 or c > 0
        return s < self.p - 1 or c < self.v - 1

    def _block(self, s: int, bwd: int, mb: int, c: int, msg: tuple[float, float, int] | None
               ) -> tuple[int, int] | None:
        st, w = self.st[s], self.su.stages[s]
        t = st.c_free
        if msg is not None:
            end, start, rec = msg
            if end > t:
                pp_part = end - max(start, t)
                st.gap("pp_comm", pp_part)
                st.gap("bubble", end - t - pp_part)
                t = end
            if rec >= 0:
                st.deps.append(rec)
        first = s == 0 and c == 0
        last = s == self.p - 1 and c == self.v - 1
        n = self.su.chunk_layers[s][c]
        layer0 = self.su.layer_ids[s][c]
        args = {"mb": mb, "chunk": c}
        if not bwd:
            if first:
                t = self._compute(s, t, "embedding fwd", "compute", w.emb_fwd_s, args)
            t = self._layers(s, t, w.fwd, n, layer0, 1, mb, c, bucket=False)
            if last:
                t = self._compute(s, t, "LM head + loss fwd", "compute", w.head_fwd_s, args)
        else:
            if last:
                t = self._compute(s, t, "LM head + loss bwd", "compute", w.head_bwd_s, args)
            t = self._layers(s, t, w.bwd, n, layer0 + n - 1, -1, mb, c, bucket=mb == self.m - 1)
            if first:
                t = self._compute(s, t, "embedding bwd", "compute", w.emb_bwd_s, args)
        st.c_free = t
        if (not bwd and last) or (bwd and first):
            return None
        # synchronous pipeline send of the activation (forward) or the gradient (backward)
        if not bwd:
            dst_s, dst_c = (s + 1, c) if s < self.p - 1 else (0, c + 1)
        else:
            dst_s, dst_c = (s - 1, c) if s > 0 else (self.p - 1, c - 1)
        link = self._link(s, self.pp)
        op = link.issue(self.pp, t, w.send_s)
        end = link.finish(op)
        st.gap("pp_comm", end - t)
        st.c_free = end
        name = f"send {'grad' if bwd else 'act'} mb{mb} -> stage {dst_s}"
        rec = self._rec(("link", s, self.pp, name, "pp_comm", op, [st.last_rec] if st.last_rec >= 0 else [],
                         {"mb": mb, "chunk": c, "to_stage": dst_s}))
        if rec >= 0:
            st.deps.append(rec)
        key = self._key(dst_s, dst_c, mb)
        self.inbox[bwd][key] = (end, op.start_s, rec)
        return bwd, key

    def _compute(self, s: int, t: float, name: str, cat: str, dur: float, args: dict[str, Any]) -> float:
        if dur <= 0.0:
            return t
        st = self.st[s]
        st.busy[0] += dur
        st.cat[cat] += dur
        if self.record:
            st.last_rec = self._rec(("op", s, 0, name, cat, t, dur, st.deps, args))
            st.deps = []
        return t + dur

    def _account(self, st: _Stage, u: Unit, n: int, comm: bool = True) -> None:
        """Busy time and template gaps of ``n`` passes (``comm=False``: the comm ops went through the links)."""
        for k, x in u.compute_s.items():
            st.cat[k] += n * x
        if not comm:
            st.busy[0] += n * u.busy_s[0]
            return
        for i, b in enumerate(u.busy_s):
            st.busy[i] += n * b
        for k, x in u.gaps_s.items():
            st.gap(k, n * x)

    def _quiet(self, s: int, t: float) -> bool:
        """No step-level traffic in flight on a tier the layer collectives use."""
        st = self.st[s]
        return all(st.links[i].idle_at(t) for i in self.shared[s])

    def _layers(self, s: int, t: float, units: tuple[Unit, ...], n: int, layer0: int, step: int, mb: int, c: int,
                bucket: bool) -> float:
        st, w = self.st[s], self.su.stages[s]
        zero3 = w.gather_s > 0.0 or w.reduce_s > 0.0
        overlap = self.su.dp_overlap
        do_bucket = bucket and w.bucket_s > 0.0 and overlap  # without overlap: one sync after the backward
        if not zero3 and not do_bucket and self._quiet(s, t):  # identical layers back to back: n templates at once
            for u in units:
                self._account(st, u, n)
            span = sum(u.duration_s for u in units)
            if self.record:
                st.last_rec = self._rec(("units", s, t, units, span, n, layer0, step, mb, c, st.deps))
                st.deps = []
            return t + n * span
        for i in range(n):
            layer = layer0 + i * step
            for u in units:
                if zero3:
                    if st.gather is None:  # nothing prefetched (the step's first pass): gather now
                        self._gather(s, t)
                    assert st.gather is not None
                    ready = self._link(s, self.ag).finish(st.gather)
                    if ready > t:
                        st.gap("zero3_comm", ready - t)
                        t = ready
                    if st.gather_rec >= 0:
                        st.deps.append(st.gather_rec)
                    st.gather = None
                    st.units_left -= 1
                    if st.units_left > 0 and overlap:  # prefetch the next pass's weights now (one pass ahead)
                        self._gather(s, t)
                if self.shared[s] and not self._quiet(s, t):
                    t, rec = self._unit_ops(s, t, u, layer, {"mb": mb, "chunk": c, "layer": layer})
                else:
                    self._account(st, u, 1)
                    rec = self._rec(("units", s, t, (u,), u.duration_s, 1, layer, step, mb, c, st.deps))
                    st.deps = []
                    t += u.duration_s
                st.last_rec = rec
                if u.kind != "bwd":
                    continue
                if zero3 and w.reduce_s > 0.0:
                    op = self._link_op(s, t, w.reduce_s, f"ZeRO-3 reduce-scatter L{layer}", "zero3_comm", rec,
                                       {"mb": mb, "layer": layer})
                    if not overlap:  # the backward waits for its gradients to be scattered
                        end = self._link(s, self.dp).finish(op)
                        st.gap("zero3_comm", end - t)
                        t = max(t, end)
                        if st.last_link_rec >= 0:
                            st.deps.append(st.last_link_rec)
                if do_bucket:
                    self._link_op(s, t, w.bucket_s, f"grad reduce L{layer}", "dp_comm", rec, {"layer": layer})
        return t

    def _unit_ops(self, s: int, t: float, u: Unit, layer: int, args: dict[str, Any]) -> tuple[float, int]:
        """One layer pass op by op, its collectives on the shared links (contended by step-level traffic)."""
        st = self.st[s]
        self._account(st, u, 1, comm=False)
        cursor = seg_start = t
        ids: list[int] = []
        hidden: list[tuple[LinkOp, str]] = []
        local_free: dict[int, tuple[float, str]] = {}  # streams on tiers without step-level traffic: plain FIFO
        shared, link_of = self.shared[s], self.link_of[s]
        exit_rec = -1
        for j, op in enumerate(u.ops):
            deps = [ids[d] for d in op.deps if ids[d] >= 0]
            if j == 0:
                deps += st.deps
                st.deps = []
            if op.stream == 0:
                seg_start = cursor
                rec = self._rec(("op", s, 0, f"L{layer} {op.name}", op.cat, cursor, op.dur_s, deps, args))
                cursor += op.dur_s
                exit_rec = rec
            elif link_of[op.stream] not in shared:
                start = max(cursor if op.blocking else seg_start, local_free.get(op.stream, (0.0, ""))[0])
                local_free[op.stream] = (start + op.dur_s, op.cat)
                st.busy[op.stream] += op.dur_s
                rec = self._rec(("op", s, op.stream, f"L{layer} {op.name}", op.cat, start, op.dur_s, deps, args))
                if op.blocking:
                    st.gap(op.cat, start + op.dur_s - cursor)
                    cursor = start + op.dur_s
                    exit_rec = rec
            else:
                link = self._link(s, op.stream)
                lop = link.issue(op.stream, cursor if op.blocking else seg_start, op.dur_s)
                rec = self._rec(("link", s, op.stream, f"L{layer} {op.name}", op.cat, lop, deps, args))
                if op.blocking:
                    end = link.finish(lop)
                    st.gap(op.cat, end - cursor)
                    cursor = max(cursor, end)
                    exit_rec = rec
                else:
                    hidden.append((lop, op.cat))
            ids.append(rec)
        # as in the template, hidden comm that outlasts its compute holds the pass open
        ends = [(self._link(s, lop.queue).finish(lop), cat) for lop, cat in hidden]
        ends += list(local_free.values())
        for end, cat in ends:
            if end > cursor:
                st.gap(cat, end - cursor)
                cursor = end
        return cursor, exit_rec

    def _gather(self, s: int, issue: float) -> None:
        st = self.st[s]
        st.gather = self._link(s, self.ag).issue(self.ag, issue, self.su.stages[s].gather_s)
        st.gather_rec = self._rec(("link", s, self.ag, "ZeRO-3 weight all-gather", "zero3_comm", st.gather, [], {}))

    def _link_op(self, s: int, issue: float, work: float, name: str, cat: str, dep: int, args: dict[str, Any]
                 ) -> LinkOp:
        st = self.st[s]
        op = self._link(s, self.dp).issue(self.dp, issue, work)
        st.last_link_rec = self._rec(("link", s, self.dp, name, cat, op, [dep] if dep >= 0 else [], args))
        return op

    def _finish(self) -> Simulation:
        # the optimizer waits for every stage's gradient reductions (global gradient-norm all-reduce)
        sts = self.st
        if not self.su.dp_overlap:  # unbucketed: the whole stage's gradients after its last backward
            for s, st in enumerate(sts):
                w = self.su.stages[s]
                if w.bucket_s > 0.0:
                    self._link_op(s, st.c_free, w.bucket_s * w.layers, "grad reduce (after backward)", "dp_comm",
                                  st.last_rec, {})
        link_end = [max([st.c_free, *(link.finish() for link in st.links)]) for st in sts]
        for st in sts:
            for link in st.links:
                for q, b in link.busy_s.items():
                    st.busy[q] += b
        barrier = max(link_end)
        barrier_deps = sorted({r for st in sts for r in (st.last_rec, st.last_link_rec) if r >= 0})
        zero3 = any(w.gather_s > 0 or w.reduce_s > 0 for w in self.su.stages)
        ends = []
        for s, st in enumerate(sts):
            w = self.su.stages[s]
            st.gap("zero3_comm" if zero3 else "dp_comm", link_end[s] - st.c_free)
            st.gap("bubble", barrier - link_end[s])
            st.busy[0] += w.optimizer_s
            st.cat["optimizer"] += w.optimizer_s
            if w.optimizer_s > 0:
                self._rec(("op", s, 0, "optimizer step", "optimizer", barrier, w.optimizer_s, barrier_deps, {}))
            ends.append(barrier + w.optimizer_s)
        step = max(ends)
        results = []
        for s, st in enumerate(sts):
            st.gap("bubble", step - ends[s])
            breakdown = dict.fromkeys(STEP_TERMS, 0.0)
            breakdown.update({k: st.cat[k] for k in COMPUTE_CATS})
            for k, x in st.gaps.items():
                breakdown[k] = breakdown.get(k, 0.0) + x
            results.append(StageResult(list(st.busy), breakdown))
        return Simulation(self.su, step, results, self.recs)
