"""Inference cost model: prefill and decode with a KV cache, continuous batching over TP x PP replicas (vectorised).

A replica is tp x pp GPUs serving ``batch`` concurrent sequences; ``dp`` replicas serve independently, or, when
disaggregated, ``prefill_dp`` of them only prefill and ship the KV cache to the others (Zhong et al. 2024,
DistServe; Patel et al. 2024, Splitwise). Every function works on arrays with one entry per plan.

    layer pass (T tokens, K keys each)  = sum_GEMM roof(F / (peak eff(d)), bytes / BW) + roof(attention) + norms
                                          + 2 TP all-reduces of T h 2 B + launch overhead
    decode round   T_dec = max(n_micro t_stage(bottleneck), sum of stage times)         (B/pp sequences per stage)
    prefill        t_pre = L t_layer(p tokens, p/2 keys) + head + (pp - 1) p2p          (one prompt, latency)
    steady state   T = T_dec + (B / E[o]) P     (prefill P per request interleaved with decode: Yu et al. 2022,
                                                 Orca; Agrawal et al. 2024, Sarathi-Serve mixed batches)
                   TPOT = T,  TTFT = t_pre + the rest of its mixed iteration + queue wait,  tokens/s = dp B / T
    running batch  B = min(N offered, KV-cache capacity, max_num_seqs): a server admits what fits and queues the
                   rest; closed loop of N clients (Little's law): queue wait = (N / B - 1) E[o] T

A plan's ``batch`` is the offered concurrency N. Kernel efficiencies come from the serving calibration of the
(GPU, framework) pair (``serving_calibration``), not from the training fit; MoE layers add the terms of
``serving_moe`` (expert parallelism, active experts, all-to-all).

The GEMM, attention and norm times reuse ``compute.gemm_time_s`` / ``compute.memory_bound_time_s`` and the
workload's GEMM shapes; collectives come from ``collectives``. Roofline (Williams, Waterman, Patterson 2009): a
kernel that streams its weights while computing takes max(compute, memory) time; see ``roofline_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr, IntArr, ordered_sum
from madmax_opt.model.collectives import Tiers, all_reduce_s, p2p_s
from madmax_opt.model.compute import gemm_time_s, memory_bound_time_s
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.serving_calibration import CalibrationColumns
from madmax_opt.model.serving_moe import ep_comm_s, expert_pass_s, expert_weight_bytes_per_gpu
from madmax_opt.model.serving_workload import (  # noqa: F401  (re-exported: the serving model's vocabulary)
    BYTES_PER_VALUE,
    DEFAULT_KV_PRECISION,
    GEMM_PRECISION,
    INVALID_REASONS,
    LOGIT_BYTES,
    MEMORY_REASON,
    PRECISIONS,
    PREFILL_PASS_TOKENS,
    STEP_TERMS,
    PrecisionParts,
    ServingArrays,
    ServingWorkload,
    gemm_precision,
    kv_bytes_per_token,
    kv_heads_per_gpu,
    kv_values_per_gpu,
    precision_parts,
    serving_workload,
)
from madmax_opt.model.spec import InferenceTask, Stack
from madmax_opt.model.workload import ACT_BYTES


def roofline_s(compute_s: Arr, memory_s: Arr) -> Arr:
    """Kernel time = max(compute, memory): weights/KV stream while the math units work (Williams et al. 2009)."""
    return np.maximum(compute_s, memory_s)


@dataclass(frozen=True)
class Device:
    """Per-plan hardware and precision columns a layer pass needs."""

    tp: Arr
    pp: Arr
    ep: Arr
    ep_stride: Arr  # ranks between members of an expert-parallel group
    grouped_ratio: Arr  # grouped-GEMM efficiency relative to dense GEMMs
    peak_flops: Arr  # GEMM precision
    peak16_flops: Arr  # 16-bit (attention kernels)
    gemm_eff: Arr
    gemm_half_dim: Arr
    attn_eff: Arr
    hbm_bw: Arr  # achieved (x hbm_eff)
    overhead_s: Arr
    prefill_overhead_s: Arr  # fixed time of one prefill pass
    weight_bytes: Arr  # bytes per GEMM weight
    kv_bytes: Arr  # bytes per KV value
    tiers: Tiers


def layer_pass_s(
    sw: ServingWorkload, dev: Device, tokens: Arr, keys: Arr, kv_tokens: Arr, kv_reads: Arr | float = 1.0,
    decode: bool = False,
) -> dict[str, Arr]:
    """One transformer layer on one GPU for ``tokens`` tokens attending ``keys`` keys each; ``kv_tokens`` K/V
    entries are read from (decode) or written to (prefill) the cache, each ``kv_reads`` times; ``decode``: the
    attention FLOPs of a decode step (MLA's absorbed form, ``ServingWorkload.decode_attn_flops_per_key``). Returns
    the additive terms."""
    m = sw.model
    tp = dev.tp
    gemm = np.zeros_like(tokens)
    for g in sw.wl.gemms:
        sharded = (g.n if g.tp_dim == "n" else g.k) / tp
        other = float(g.k if g.tp_dim == "n" else g.n)
        # shape factor over the weight dimensions only: few tokens make a GEMM bandwidth-bound, which the
        # roofline's memory term models; the calibration's saturating fit was made on training GEMMs (>= 1k tokens)
        dim = np.minimum(sharded, other) * np.ones_like(tokens)
        compute = gemm_time_s(
            tokens * g.flops_per_token / tp, dim, dev.peak_flops, dev.gemm_eff, dev.gemm_half_dim
        )
        io_bytes = tokens * (sharded + other) * ACT_BYTES  # input + output activations of the local shard
        memory = memory_bound_time_s(g.params / tp * dev.weight_bytes + io_bytes, dev.hbm_bw)
        gemm = gemm + roofline_s(compute, memory)
    attn_flops = tokens * keys * (sw.decode_attn_flops_per_key if decode else sw.attn_flops_per_key) / tp
    kv_layer_bytes = kv_values_per_gpu(m, tp) * dev.kv_bytes  # one token, one layer, one GPU
    attention = roofline_s(
        attn_flops / (dev.peak16_flops * dev.attn_eff),
        memory_bound_time_s(kv_reads * kv_tokens * kv_layer_bytes, dev.hbm_bw),
    )
    expert = expert_pass_s(
        sw.wl, tokens, tp, dev.ep, dev.peak_flops, dev.gemm_eff, dev.gemm_half_dim, dev.grouped_ratio,
        dev.weight_bytes, dev.hbm_bw,
    )
    # norms, residual adds, activation function: replicated (no SP in inference) and TP-sharded traffic
    elementwise = memory_bound_time_s(
        tokens * (sw.wl.elementwise_replicated_bytes + sw.wl.elementwise_tp_bytes / tp), dev.hbm_bw
    )
    # Megatron TP: one all-reduce after attention and one after the MLP (Shoeybi et al. 2019, Fig. 3). Experts spread
    # over the replica's own TP ranks (ep <= tp) see every token already (the attention output is replicated): each
    # rank runs its experts and the MoE output is all-reduced like the MLP's (SGLang DeepseekV2MoE.forward_normal /
    # FusedMoE reduce_results, vLLM FusedMoE without a DP all-to-all); only an expert pool shared by several attention
    # replicas (ep > tp, attention DP) replaces that all-reduce by the all-to-all pair of serving_moe
    reduces = np.where(dev.ep > tp, 1.0, 2.0)
    tp_comm = np.where(
        tp > 1, reduces * all_reduce_s(tokens * m.hidden * ACT_BYTES, tp, np.ones_like(tp), dev.tiers), 0.0
    )
    return {
        "gemm": gemm,
        "attention": attention,
        "elementwise": elementwise,
        "tp_comm": tp_comm,
        "expert_gemm": expert,
        "ep_comm": ep_comm_s(sw.wl, tokens, tp, dev.ep, dev.ep_stride, dev.tiers),
        "overhead": dev.overhead_s,
    }


def expected_max_std_normal(n: float) -> float:
    """E[max of n iid standard normals] = int x n phi(x) Phi(x)^(n-1) dx (numerically, 0 for n = 1)."""
    if n <= 1.0:
        return 0.0
    x = np.linspace(-10.0, 10.0, 4001)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return float(np.sum(x * n * pdf * np.power(cdf, n - 1.0)) * (x[1] - x[0]))


def dp_straggler_factor(sw: ServingWorkload, ranks: Arr, seqs_per_rank: Arr) -> Arr:
    """Attention DP: ``ranks`` attention replicas share one expert pool and step together, so a decode step waits for
    the rank whose B sequences hold the most KV. A running sequence holds c = p + u keys, u ~ U(0, o) (its decode
    progress), so the rank's keys have mean B E[c] and sd sqrt(B) sd(c) (sum of B independent sequences, normal
    approximation), and E[max over n ranks] = B E[c] + z_n sqrt(B) sd(c), z_n = E[max of n standard normals]:
    factor = 1 + z_n sd(c) / (E[c] sqrt(B)) on the attention's KV time. 1 without attention DP."""
    mean = sw.mean_context
    second = sw.running_mean([(r.prompt_len + r.output_len / 2.0) ** 2 + r.output_len ** 2 / 12.0 for r in sw.requests])
    cv = math.sqrt(max(second - mean * mean, 0.0)) / mean
    z = np.zeros_like(ranks)
    for n in np.unique(ranks[ranks > 1]):
        z = np.where(ranks == n, expected_max_std_normal(float(n)), z)
    return 1.0 + z * cv / np.sqrt(np.maximum(seqs_per_rank, 1.0))


def head_pass_s(sw: ServingWorkload, dev: Device, tokens: Arr) -> Arr:
    """LM head (vocab-parallel, 16-bit weights) + fp32 logits write/read for sampling, on the last stage."""
    wl = sw.wl
    v_local = wl.vocab / dev.tp
    compute = gemm_time_s(
        tokens * wl.head_flops_per_token / dev.tp,
        np.minimum(float(wl.model.hidden), v_local) * np.ones_like(tokens),
        dev.peak16_flops,
        dev.gemm_eff,
        dev.gemm_half_dim,
    )
    memory = memory_bound_time_s(wl.model.hidden * v_local * ACT_BYTES, dev.hbm_bw)
    return roofline_s(compute, memory) + memory_bound_time_s(tokens * v_local * LOGIT_BYTES * 2.0, dev.hbm_bw)


@dataclass(frozen=True)
class InferenceTerms:
    """Per-plan serving metrics (SI units) and their parts."""

    ttft_s: Arr
    tpot_s: Arr
    output_tokens_per_s: Arr  # whole deployment
    decode_step_s: Arr  # one decode round of the running batch per token it emits, without interleaved prefill
    prefill_s: Arr  # latency of one prompt's prefill (longest prompt of the mix)
    step: dict[str, Arr]  # additive terms of TPOT (decode round + amortised prefill / KV transfer)
    max_batch: Arr  # sequences per replica whose KV cache fits
    running_batch: Arr  # min(offered, max_batch, max_num_seqs): sequences decoding together
    queue_wait_s: Arr  # mean wait of a request before it is admitted (part of TTFT)
    memory: dict[str, Arr]  # weights, kv_cache, activations, total, capacity (bytes per GPU)
    invalid: IntArr  # 0 = valid, else a key of INVALID_REASONS
    gpus: IntArr

    @property
    def output_tokens_per_s_per_gpu(self) -> Arr:
        return self.output_tokens_per_s / self.gpus


def device(
    sw: ServingWorkload, task: InferenceTask, table: HardwareTable, plans: ServingArrays, cal: CalibrationColumns
) -> Device:
    """Per-plan hardware columns; efficiencies from the serving calibration ``cal`` (one row per hardware option)."""
    hw = plans.hw
    prec = [PRECISIONS[int(i)] for i in plans.precision]
    by_gpu: dict[str, list[float]] = {}  # GEMM peak per precision: W8A8 / W4A4 natively, else weight-only (fp4: bf16)
    for o in table.options:
        if o.gpu.name not in by_gpu:
            gemms = [gemm_precision(p, o.gpu.peak_flops) for p in PRECISIONS]
            by_gpu[o.gpu.name] = [np.nan if g is None else o.gpu.peak_flops[g] for g in gemms]  # type: ignore[index]
    peaks = np.array([by_gpu[o.gpu.name] for o in table.options], dtype=np.float64).T.reshape(len(PRECISIONS), -1)
    peak16 = np.array([o.gpu.peak_flops.get("bf16", np.nan) for o in table.options])
    raw_bw = np.array([o.gpu.hbm_bw for o in table.options])
    kv_of = {p: task.kv_precision or DEFAULT_KV_PRECISION[p] for p in PRECISIONS}
    tp, pp = plans.tp.astype(np.float64), plans.pp.astype(np.float64)
    return Device(
        tp=tp,
        pp=pp,
        ep=plans.ep.astype(np.float64),
        ep_stride=pp,  # an EP group takes the same stage of ep / tp replicas laid out tp x pp apart
        grouped_ratio=cal.grouped_gemm_ratio[hw],
        peak_flops=peaks[plans.precision, hw],
        peak16_flops=peak16[hw],
        gemm_eff=cal.gemm_eff[hw],
        gemm_half_dim=table.gemm_half_dim[hw],
        attn_eff=cal.attn_eff[hw],
        hbm_bw=raw_bw[hw] * cal.hbm_eff[hw],
        overhead_s=cal.layer_overhead_s[hw],
        prefill_overhead_s=cal.prefill_overhead_s[hw],
        weight_bytes=np.array([BYTES_PER_VALUE[p] for p in prec], dtype=np.float64),
        kv_bytes=np.array([BYTES_PER_VALUE[kv_of[p]] for p in prec], dtype=np.float64),
        tiers=_scaled(table.tiers(hw), cal.comm_eff[hw]),
    )


def _scaled(tiers: Tiers, comm_eff: Arr) -> Tiers:
    """The tiers with the runtime's collective efficiency applied to every tier's bandwidth (custom all-reduce
    kernels of TensorRT-LLM / vLLM vs NCCL's bus bandwidth, RCCL on ROCm)."""
    return Tiers(size=tiers.size, bw=tiers.bw * comm_eff[None, :], latency_s=tiers.latency_s)


def accepted_tokens(acceptance: Arr, draft_tokens: float) -> Arr:
    """E = sum_{i=0..d} a^i: tokens a speculative round emits per sequence (1 without drafts)."""
    return np.sum([np.power(acceptance, i) for i in range(int(draft_tokens) + 1)], axis=0)


def memory_bytes(
    sw: ServingWorkload, dev: Device, capacity: Arr, full_reservation: NDArray[np.bool_]
) -> tuple[dict[str, Arr], Arr, Arr]:
    """(batch-independent memory terms, bytes per running sequence, max batch) per GPU of the worst stage."""
    wl, m = sw.wl, sw.model
    tp, pp = dev.tp, dev.pp
    layers = wl.layers / pp
    gemm_params = float(sum(g.params for g in wl.gemms))
    norm_params = 2.0 * wl.final_norm_params  # two norms per layer, the final norm's width: replicated on TP ranks
    bias_params = wl.params_per_layer - gemm_params - norm_params  # norms and biases stay 16-bit
    experts = expert_weight_bytes_per_gpu(wl, tp, dev.ep, dev.weight_bytes) if wl.moe else 0.0
    layer_bytes = layers * (
        (gemm_params * dev.weight_bytes + bias_params * ACT_BYTES) / tp + norm_params * ACT_BYTES + experts
    )
    emb = wl.embedding_params * ACT_BYTES / tp
    head = (wl.head_params or (wl.embedding_params if m.tied_embeddings else 0)) * ACT_BYTES / tp
    ends = np.where(
        pp > 1,
        np.maximum(emb, head + wl.final_norm_params * ACT_BYTES),
        emb + wl.head_params * ACT_BYTES / tp + wl.final_norm_params * ACT_BYTES,
    )
    weights = layer_bytes + ends
    longest_prompt = max(r.prompt_len for r in sw.requests)
    pass_tokens = max(PREFILL_PASS_TOKENS, float(longest_prompt))
    activations = pass_tokens * (wl.act_tp_sharded_bytes / tp + wl.act_replicated_bytes) + np.zeros_like(tp)
    held = np.where(full_reservation, sw.tokens_held, sw.tokens_held_on_demand)
    kv_per_seq = held * layers * kv_values_per_gpu(m, tp) * dev.kv_bytes
    per_seq = kv_per_seq + wl.vocab / tp * LOGIT_BYTES
    free = capacity - weights - activations
    max_batch = np.maximum(np.floor(free / per_seq), 0.0)
    return {"weights": weights, "activations": activations, "kv_per_seq": kv_per_seq}, per_seq, max_batch


def running_batch(plans: ServingArrays, cal: CalibrationColumns, max_batch: Arr) -> Arr:
    """B = min(offered N, sequences whose KV fits, max_num_seqs (the plan's, else the framework's default))."""
    cap = np.where(plans.max_seqs > 0, plans.max_seqs.astype(np.float64), cal.default_max_num_seqs[plans.hw])
    return np.maximum(np.minimum(np.minimum(plans.batch.astype(np.float64), max_batch), cap), 1.0)


def inference_terms(
    sw: ServingWorkload,
    task: InferenceTask,
    stack: Stack,
    table: HardwareTable,
    plans: ServingArrays,
    cal: CalibrationColumns,
) -> InferenceTerms:
    """Evaluate the serving model for every plan in ``plans`` (vectorised)."""
    dev = device(sw, task, table, plans, cal)
    m = sw.model
    tp, pp = dev.tp, dev.pp
    capacity = table.hbm_bytes[plans.hw] * (1.0 - stack.memory_reserve_fraction)
    fixed, per_seq, max_batch = memory_bytes(sw, dev, capacity, cal.kv_full_reservation[plans.hw])
    offered = plans.batch.astype(np.float64)
    batch = running_batch(plans, cal, max_batch)
    layers = float(m.layers)
    h = float(m.hidden)
    chain = pp.copy()  # the p2p chain of pipeline neighbours, tp ranks apart

    def p2p(tokens: Arr) -> Arr:
        return np.where(pp > 1, p2p_s(tokens * h * ACT_BYTES, tp, dev.tiers, chain), 0.0)

    # ---- decode round: B sequences split into n_micro = min(B, pp) micro-batches of ceil(B/pp) --------------------
    micro = np.ceil(batch / pp)
    n_micro = np.minimum(batch, pp)
    context = np.full_like(batch, sw.mean_context)
    # a decode kernel without GQA reuse streams each KV head once per query head it serves (MLA: the latent once)
    gqa = stack.gqa_decode_kernel or m.mla_kv_dim is not None
    group = 1.0 if gqa else m.heads / tp / kv_heads_per_gpu(m, tp)
    # speculative decoding (MTP / EAGLE, d draft tokens): a round verifies 1 + d tokens per sequence, reading each
    # sequence's KV once, after d passes of the one-layer draft module (DeepSeek-V3 report Sec. 2.2 MTP)
    d = float(task.speculative_tokens)
    lay = layer_pass_s(sw, dev, micro * (1.0 + d), context, micro * context, group, decode=True)
    # attention DP (ep > tp): the ep / tp replicas sharing an expert pool wait for the one with the most KV
    straggle = dp_straggler_factor(sw, np.where(dev.ep > tp, dev.ep / tp, 1.0), micro)
    lay["attention"] = lay["attention"] * straggle
    head = head_pass_s(sw, dev, micro * (1.0 + d))
    hop = p2p(micro * (1.0 + d))
    t_layer = ordered_sum(lay.values())
    bottleneck = layers / pp * t_layer + head + hop  # the last stage (it also runs the head)
    whole = (
        layers * t_layer + head + pp * hop
    )  # one micro-batch around the pipeline (next token needs the last)
    stage_bound = n_micro * bottleneck >= whole
    scale_stage = np.where(stage_bound, n_micro * layers / pp, layers)
    scale_head = np.where(stage_bound, n_micro, 1.0)
    scale_hop = np.where(stage_bound, n_micro, pp)
    step = {k: scale_stage * v for k, v in lay.items()}
    step["head"] = scale_head * head
    step["pp_comm"] = scale_hop * hop
    decode_s = np.maximum(n_micro * bottleneck, whole)
    step["draft"] = np.zeros_like(decode_s)
    if d > 0:
        draft_layer = layer_pass_s(sw, dev, micro, context, micro * context, group, decode=True)
        draft_layer["attention"] = draft_layer["attention"] * straggle
        step["draft"] = d * n_micro * (ordered_sum(draft_layer.values()) + head_pass_s(sw, dev, micro))
        decode_s = decode_s + step["draft"]
    # a round emits E = sum_{i=0..d} a^i tokens per sequence (draft i accepted with probability a^i: each draft
    # given the previous with probability a; Leviathan et al. 2023, Sec. 3.1): decode terms are per emitted token
    emitted = accepted_tokens(cal.spec_acceptance[plans.hw], d)
    step = {k: v / emitted for k, v in step.items()}
    decode_s = decode_s / emitted

    # ---- prefill per request shape: latency of one prompt, replica occupancy per prompt when batched ----------
    latencies, occupancy, transfers = [], [], []
    for r in sw.requests:
        p = np.full_like(batch, float(r.prompt_len))
        one = layer_pass_s(sw, dev, p, p / 2.0, p)  # causal: a query attends p/2 keys on average
        ones = np.ones_like(batch)
        latencies.append(  # + the runtime's fixed cost of a prefill pass (scheduling, sampling, host sync)
            layers * ordered_sum(one.values()) + head_pass_s(sw, dev, ones) + (pp - 1) * p2p(p)
            + dev.prefill_overhead_s
        )
        k = max(1.0, np.floor(PREFILL_PASS_TOKENS / r.prompt_len))
        lay_k = layer_pass_s(sw, dev, k * p, p / 2.0, k * p)
        # stage = layers/pp x layer + max(head, send) + fixed: the last stage runs the head, the others send
        head_or_send = np.maximum(head_pass_s(sw, dev, k * ones), p2p(k * p))
        stage_k = layers / pp * ordered_sum(lay_k.values()) + head_or_send + dev.prefill_overhead_s
        occupancy.append(stage_k / k)  # pipelined: a stage takes a new pass every stage time
        shard = r.prompt_len * layers / pp * kv_values_per_gpu(m, tp) * dev.kv_bytes
        transfers.append(
            p2p_s(shard, tp * pp, dev.tiers)
        )  # each GPU sends its KV shard to the decode replica
    share = sw.share
    prefill_per_request = ordered_sum(w * t for w, t in zip(share, occupancy, strict=True))
    kv_transfer = ordered_sum(w * t for w, t in zip(share, transfers, strict=True))
    prefill_latency = np.max(latencies, axis=0)
    mean_out = sw.mean_output
    arrivals = batch / mean_out  # requests joining (and leaving) per decode round

    disagg = plans.prefill_dp > 0
    step["prefill"] = np.where(disagg, 0.0, arrivals * prefill_per_request)
    step["kv_transfer"] = np.where(disagg, kv_transfer / mean_out, 0.0)
    tpot = ordered_sum(step[k] for k in STEP_TERMS)
    others = np.maximum(arrivals - 1.0, 0.0) * prefill_per_request
    # closed loop of N clients, B admitted (Little's law): residence N E[o] T / B, of which E[o] T running
    queue_wait = np.maximum(offered / batch - 1.0, 0.0) * mean_out * tpot
    ttft = prefill_latency + np.where(disagg | (batch <= 1), 0.0, decode_s + others) + queue_wait
    decode_replicas = (plans.dp - plans.prefill_dp).astype(np.float64)
    decode_rate = decode_replicas * batch / np.where(disagg, decode_s, tpot)
    prefill_rate = plans.prefill_dp * mean_out / prefill_per_request  # output tokens/s the prefill pool feeds
    tokens_per_s = np.where(disagg, np.minimum(decode_rate, prefill_rate), decode_rate)

    # ---- memory (at the running batch) -----------------------------------------------------------------------
    kv = batch * fixed["kv_per_seq"]
    total = fixed["weights"] + fixed["activations"] + batch * per_seq
    memory = {
        "weights": fixed["weights"],
        "kv_cache": kv,
        "activations": fixed["activations"],
        "logits": total - fixed["weights"] - fixed["activations"] - kv,
        "total": total,
        "capacity": capacity,
    }

    invalid = _invalid(sw, task, table, plans, dev, max_batch)
    return InferenceTerms(
        ttft_s=ttft,
        tpot_s=tpot,
        output_tokens_per_s=tokens_per_s,
        decode_step_s=decode_s,
        prefill_s=prefill_latency,
        step=step,
        max_batch=max_batch,
        running_batch=batch,
        queue_wait_s=queue_wait,
        memory=memory,
        invalid=invalid,
        gpus=plans.gpus,
    )


def _invalid(
    sw: ServingWorkload,
    task: InferenceTask,
    table: HardwareTable,
    plans: ServingArrays,
    dev: Device,
    max_batch: Arr,
) -> IntArr:
    m = sw.model
    tp, pp, ep = plans.tp, plans.pp, plans.ep
    g = m.n_kv_heads
    node = table.tier_size[0][plans.hw]
    node = np.where(np.isinf(node), 1 << 30, node).astype(np.int64)
    pre = plans.prefill_dp
    experts = m.moe.num_experts if m.moe is not None else 1
    attention_gpus = plans.dp * tp
    bad_ep = (ep > 1) & (
        (m.moe is None) | (ep % tp != 0) | (attention_gpus % ep != 0) | (experts % np.maximum(ep, 1) != 0)
        | ((ep > tp) & (pre > 0))  # an expert pool shared by prefill-only and decode replicas is not modelled
    )
    checks: list[tuple[int, Any]] = [
        (1, plans.gpus != table.gpus[plans.hw].astype(np.int64)),
        (2, (m.heads % tp != 0) | ((g % tp != 0) & (tp % g != 0))),
        (3, m.layers % pp != 0),
        (4, (node % tp != 0) & (tp % node != 0)),
        (5, np.isnan(dev.peak_flops) | np.isnan(dev.peak16_flops)),
        (6, (pre < 0) | ((pre > 0) & (not task.disaggregated or (pre >= plans.dp)))),
        (MEMORY_REASON, max_batch < 1),
        (8, bad_ep),
    ]
    code = np.zeros(len(plans), dtype=np.int64)
    for c, bad in reversed(checks):  # the first violated check wins
        code = np.where(bad, c, code)
    return code
