"""Serving timelines: decode rounds and a prefill pass of one replica, event by event, as a Chrome trace.

The simulation replays the closed-form serving model's per-layer costs (``inference.layer_pass_s``,
``head_pass_s``, ``collectives.p2p_s``; no cost formula is repeated) on one GPU per pipeline stage (the TP ranks of a
stage run the same program): ``ROUNDS`` decode rounds of the running batch in min(B, pp) micro-batches, each stage
taking a micro-batch when it is free and its input has arrived, sends synchronous (the sender waits), the last
stage running the LM head and handing the token back to the first; then, for every request shape of the mix, one
batched prefill pass of k prompts (k = 8192 // prompt tokens, as the model batches them) and its fixed cost
(``prefill_overhead_s``), or, for a disaggregated plan, a lone prompt's prefill on a prefill replica followed by the
KV-cache transfer to the decode replica.

Streams per stage: compute, TP all-reduce, EP all-to-all (MoE with ep > 1), pipeline p2p, KV transfer. Inside a
layer the terms are placed in Megatron order (display only; the layer total is the model's): attention + half the
dense GEMMs, TP all-reduce, EP dispatch, the other GEMMs + expert GEMMs, EP combine, TP all-reduce, norms and
launch overhead.

Cross-check (same style as the training trace): the simulated steady-state decode round, the longest lone prompt's
prefill latency and TPOT = round + (B / E[o]) sum_r w_r pass_r / k_r (disaggregated: round + sum_r w_r KV_r / E[o]),
w_r the shares of the mix's request shapes, against the closed form's ``decode_step_s``, ``prefill_s`` and
``tpot_s``. With pp > 1 the last stage runs the LM head and sends nothing on and the others send, so a batched
prefill pass holds a stage for its layers + max(head, send), as the closed form prices it (to 1e-13 on
serve-llama3-70b's pp 5 optimum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from madmax_opt.analysis.trace_setup import TRACE_TOLERANCE
from madmax_opt.model.collectives import p2p_s
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.inference import (
    PREFILL_PASS_TOKENS,
    InferenceTerms,
    ServingArrays,
    ServingWorkload,
    device,
    head_pass_s,
    inference_terms,
    kv_heads_per_gpu,
    kv_values_per_gpu,
    layer_pass_s,
)
from madmax_opt.model.serving_calibration import CalibrationColumns
from madmax_opt.model.spec import InferenceTask, Stack
from madmax_opt.model.workload import ACT_BYTES

ROUNDS = 4
STREAMS: tuple[str, ...] = ("compute", "tp", "ep", "pp", "kv")
STREAM_LABELS = {"compute": "compute", "tp": "TP all-reduce", "ep": "EP all-to-all", "pp": "pipeline p2p",
                 "kv": "KV-cache transfer"}
PREFILL_PID = 100  # process ids of a disaggregated plan's prefill replica stages start here


@dataclass(frozen=True)
class ServingEvent:
    pid: int
    stream: str
    name: str
    cat: str
    start_s: float
    dur_s: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServingTimeline:
    events: list[ServingEvent]
    stages: int
    closed_form: dict[str, float]  # decode_round_s, prefill_s, tpot_s
    simulated: dict[str, float]
    plan: dict[str, Any]

    @property
    def differences(self) -> dict[str, float]:
        return {k: self.simulated[k] / self.closed_form[k] - 1.0 for k in self.closed_form if self.closed_form[k] > 0}

    @property
    def within_tolerance(self) -> bool:
        return all(abs(d) <= TRACE_TOLERANCE for d in self.differences.values())

    @property
    def end_s(self) -> float:
        return max((e.start_s + e.dur_s for e in self.events), default=0.0)


def _layer_ops(lay: dict[str, float]) -> list[tuple[str, str, str, float]]:
    """(stream, name, category, seconds) of one layer pass in Megatron order."""
    ops = [
        ("compute", "attention + QKV/O GEMMs", "attention", lay["attention"] + lay["gemm"] / 2.0),
        ("tp", "TP all-reduce", "tp_comm", lay["tp_comm"] / 2.0),
        ("ep", "EP dispatch", "ep_comm", lay.get("ep_comm", 0.0) / 2.0),
        ("compute", "MLP / expert GEMMs", "gemm", lay["gemm"] / 2.0 + lay.get("expert_gemm", 0.0)),
        ("ep", "EP combine", "ep_comm", lay.get("ep_comm", 0.0) / 2.0),
        ("tp", "TP all-reduce", "tp_comm", lay["tp_comm"] / 2.0),
        ("compute", "norms, launches", "overhead", lay["elementwise"] + lay["overhead"]),
    ]
    return [o for o in ops if o[3] > 0.0]


class _Builder:
    def __init__(self, layers_per_stage: int) -> None:
        self.events: list[ServingEvent] = []
        self.layers = layers_per_stage

    def stage_pass(self, pid: int, start: float, ops: list[tuple[str, str, str, float]], head_s: float,
                   label: str, args: dict[str, Any], first_layer: int) -> float:
        """One pass of a micro-batch through a stage's layers (and the head); returns its end."""
        t = start
        for i in range(self.layers):
            for stream, name, cat, dur in ops:
                self.events.append(ServingEvent(pid, stream, f"L{first_layer + i} {name}", cat, t, dur, args))
                t += dur
        if head_s > 0:
            self.events.append(ServingEvent(pid, "compute", f"{label} LM head + sampling", "head", t, head_s, args))
            t += head_s
        return t

    def send(self, pid: int, start: float, dur: float, name: str, cat: str, stream: str, args: dict[str, Any]
             ) -> float:
        if dur > 0:
            self.events.append(ServingEvent(pid, stream, name, cat, start, dur, args))
        return start + dur


def _scalars(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(np.asarray(v).ravel()[0]) for k, v in d.items()}


def simulate_serving(sw: ServingWorkload, task: InferenceTask, stack: Stack, table: HardwareTable,
                     cal: CalibrationColumns, plan: ServingArrays, plan_record: dict[str, Any]) -> ServingTimeline:
    """Simulate one replica of the single plan in ``plan`` (one row)."""
    terms: InferenceTerms = inference_terms(sw, task, stack, table, plan, cal)
    dev = device(sw, task, table, plan, cal)
    m = sw.model
    tp, pp = float(plan.tp[0]), int(plan.pp[0])
    layers = m.layers // pp
    one = np.ones(1)
    batch = float(terms.running_batch[0])
    micro, n_micro = float(np.ceil(batch / pp)), int(min(batch, pp))
    gqa = stack.gqa_decode_kernel or m.mla_kv_dim is not None
    group = 1.0 if gqa else m.heads / tp / float(kv_heads_per_gpu(m, np.array([tp]))[0])
    ctx = sw.mean_context

    def hop_s(tokens: float) -> float:
        if pp == 1:
            return 0.0
        return float(p2p_s(tokens * m.hidden * ACT_BYTES * one, dev.tp, dev.tiers, dev.pp)[0])

    dec_ops = _layer_ops(_scalars(layer_pass_s(sw, dev, micro * one, ctx * one, micro * ctx * one, group, decode=True)))
    dec_head = float(head_pass_s(sw, dev, micro * one)[0])
    b = _Builder(layers)
    free = [0.0] * pp  # when each stage's compute is free
    token_back = [0.0] * n_micro  # when micro-batch i's token is back at stage 0
    round_end: list[float] = []
    for r in range(ROUNDS):
        for i in range(n_micro):
            arrive = token_back[i]
            for s in range(pp):
                args = {"round": r, "micro_batch": i, "sequences": micro}
                end = b.stage_pass(s, max(free[s], arrive), dec_ops, dec_head if s == pp - 1 else 0.0,
                                   f"decode r{r} mb{i}", args, s * layers)
                nxt = "to stage 0 (next token)" if s == pp - 1 else f"to stage {s + 1}"
                free[s] = arrive = b.send(s, end, hop_s(micro), f"p2p mb{i} {nxt}", "pp_comm", "pp", args)
            token_back[i] = arrive
        round_end.append(max(token_back))
    decode_round = round_end[-1] - round_end[-2]

    # prefill, one pass per request shape of the mix, priced as the closed form prices it (inference_terms):
    #   TPOT = round + (B / E[o]) sum_r w_r occupancy_r / k_r  (+ sum_r w_r KV_r / E[o] disaggregated),
    #   prefill_s = max_r lone latency_r,
    # w_r the shape's share, k_r = 8192 // p_r prompts a batched pass (1 disaggregated). Not the longest prompt
    # alone: with a mix its pass is not the mean prefill per request (serve-llama2-70b-mix: +14 % TPOT).
    disagg = int(plan.prefill_dp[0]) > 0
    base = PREFILL_PID if disagg else 0
    fixed = float(dev.prefill_overhead_s[0])
    pre_free = [0.0] * pp if disagg else free  # the prefill replica's stages, or the decode replica's after the rounds

    def run_pass(bld: _Builder, pid0: int, stage_free: list[float], ready: float, p: float, k: float,
                 fixed_each_stage: bool) -> tuple[float, float]:
        """A prefill pass of k prompts of p tokens through the stages from ``pid0``, stage 0 starting at ``ready``,
        stage s when it is free and its input has arrived; the pass's fixed cost (``prefill_overhead_s``) on every
        stage (a batched pass: the closed form's stage occupancy) or once, on the last (a lone prompt: the closed
        form's latency). Returns (the end on the last stage, the longest occupancy of a stage)."""
        ops = _layer_ops(_scalars(layer_pass_s(sw, dev, k * p * one, p / 2.0 * one, k * p * one)))
        head = float(head_pass_s(sw, dev, k * one)[0])
        args = {"prompts": k, "prompt_tokens": p}
        arrive, busy = ready, 0.0
        for s in range(pp):
            last = s == pp - 1
            start = max(stage_free[s], arrive)
            end = bld.stage_pass(pid0 + s, start, ops, head if last else 0.0, f"prefill {k:g} x {p:g}", args,
                                 s * layers)
            if fixed_each_stage or last:
                end = bld.send(pid0 + s, end, fixed, f"prefill {k:g} x {p:g} fixed cost (scheduling, host sync)",
                               "overhead", "compute", args)
            after = end if last else bld.send(pid0 + s, end, hop_s(k * p), f"p2p prefill to stage {s + 1}",
                                              "pp_comm", "pp", args)
            busy = max(busy, after - start)  # the pass's occupancy of the stage
            stage_free[s] = arrive = after
        return arrive, busy

    occupancy = kv = prefill_latency = 0.0
    for w, req in zip(sw.share, sw.requests, strict=True):
        p = float(req.prompt_len)
        k = 1.0 if disagg else max(1.0, float(np.floor(PREFILL_PASS_TOKENS / p)))
        ready = max(pre_free)  # drawn one after another (a disaggregated prompt on an idle prefill replica)
        end, busy = run_pass(b, base, pre_free, ready, p, k, not disagg)
        occupancy += float(w) * busy / k
        lone = end - ready if disagg else run_pass(_Builder(layers), 0, [0.0] * pp, 0.0, p, 1.0, False)[0]
        prefill_latency = max(prefill_latency, lone)
        if disagg:  # each GPU sends its KV shard of the prompt to the decode replica
            shard = req.prompt_len * layers * float(kv_values_per_gpu(m, dev.tp)[0]) * float(dev.kv_bytes[0])
            kv_r = float(p2p_s(shard * one, dev.tp * dev.pp, dev.tiers)[0])
            kv += float(w) * kv_r
            for s in range(pp):
                b.send(base + s, end, kv_r, f"KV cache of {p:g} tokens to the decode replica", "kv_transfer", "kv",
                       {"bytes": shard})
    mean_out = sw.mean_output
    tpot = decode_round + (kv / mean_out if disagg else batch / mean_out * occupancy)
    closed = {"decode_round_s": float(terms.decode_step_s[0]), "prefill_s": float(terms.prefill_s[0]),
              "tpot_s": float(terms.tpot_s[0])}
    simulated = {"decode_round_s": decode_round, "prefill_s": prefill_latency, "tpot_s": tpot}
    return ServingTimeline(b.events, pp, closed, simulated, plan_record)


def chrome_trace(tl: ServingTimeline) -> dict[str, Any]:
    """Chrome trace-event JSON (Perfetto / chrome://tracing): a process per pipeline stage (prefill replica
    stages from PREFILL_PID), a thread per stream; complete events with ts/dur in microseconds."""
    out: list[dict[str, Any]] = []
    pids = sorted({e.pid for e in tl.events})
    for pid in pids:
        name = f"prefill replica stage {pid - PREFILL_PID}" if pid >= PREFILL_PID else f"decode replica stage {pid}"
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        for k, s in enumerate(STREAMS):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": k, "args": {"name": STREAM_LABELS[s]}})
    for e in tl.events:
        ts = round(e.start_s * 1e6, 3)
        out.append({"name": e.name, "cat": e.cat, "ph": "X", "ts": ts, "dur": round(e.dur_s * 1e6, 3),
                    "pid": e.pid, "tid": STREAMS.index(e.stream), "args": e.args})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"generator": "madmax-opt timeline (serving)", "plan": tl.plan,
                          "closed_form": tl.closed_form, "simulated": tl.simulated}}
