"""Training step model: named additive time terms, memory per GPU and validity for arrays of plans.

This is the single source of truth for every training cost term. The exact evaluator reports these floats; the
CP-SAT encoder rounds the same arrays to integers. Formulas follow Megatron-Core behaviour (see ``Stack``):

    step = m * t_stage(bottleneck) + (p-1)/v * t_stage(mean) + DP_exposed + optimizer
    t_stage = compute + recompute + TP_exposed + CP_exposed + PP_p2p + ZeRO3_exposed + launch overhead

per micro-batch, with m = global_batch / (dp * mbs) micro-batches and p = pp stages of L/p layers each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.collectives import all_gather_s, all_reduce_s, p2p_s, reduce_scatter_s
from madmax_opt.compute import gemm_time_s, memory_bound_time_s
from madmax_opt.hardware import HardwareTable
from madmax_opt.memory import MemoryTerms, layer_activation_bytes, model_state_bytes
from madmax_opt.pipeline import bubble_time_s, in_flight_layer_factor
from madmax_opt.plan import PlanArrays
from madmax_opt.spec import Stack, Task
from madmax_opt.workload import ACT_BYTES, TransformerWorkload

Arr = NDArray[np.float64]

OPTIMIZER_BYTES_PER_PARAM = 34.0  # Adam step reads grad+master+m+v (16 B), writes master+m+v (12 B) + bf16 copy (2 B)
                                  # plus the grad zeroing/unscale pass (4 B): memory-bound
FLASH_BWD_FACTOR = 2.5  # flash-attention backward = 2x forward + recomputed QK^T/softmax (Dao 2022, Sec. 3.1)
STAGE_TERMS: tuple[str, ...] = ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "zero3_comm", "overhead")
STEP_TERMS: tuple[str, ...] = (*STAGE_TERMS, "bubble", "dp_comm", "optimizer")

INVALID_REASONS: dict[int, str] = {
    1: "dp*tp*pp*cp must equal the number of GPUs",
    2: "tp must divide heads and kv_heads",
    3: "pp*vpp must divide the number of layers",
    4: "dp*mbs must divide global_batch",
    5: "vpp > 1 needs pp > 1 and a micro-batch count divisible by pp",
    6: "cp > 1 needs seq_len divisible by 2*cp (load-balanced causal split)",
    7: "sp needs tp > 1",
    8: "zero > 0 needs dp*cp > 1",
    9: "tp must divide the scale-up domain or be a multiple of it",
    10: "memory per GPU exceeds capacity",
}
MEMORY_REASON = 10


@dataclass(frozen=True)
class TrainingTerms:
    time: dict[str, Arr]  # additive terms of the step time, seconds
    hidden_comm: dict[str, Arr]  # communication overlapped with compute (not in the step time), seconds
    memory: MemoryTerms
    capacity_bytes: Arr
    invalid: NDArray[np.int64]  # 0 = valid, else a key of INVALID_REASONS (the first violated)
    tokens_per_step: float
    model_flops_per_step: float
    gpus: NDArray[np.int64]
    peak_flops: Arr

    @property
    def step_time_s(self) -> Arr:
        return np.sum([self.time[k] for k in STEP_TERMS], axis=0)


def _f(a: NDArray[np.int64]) -> Arr:
    return a.astype(np.float64)


def training_terms(
    wl: TransformerWorkload, task: Task, stack: Stack, table: HardwareTable, plans: PlanArrays
) -> TrainingTerms:
    """Evaluate the training cost model for every plan in ``plans`` (vectorised)."""
    dp, tp, pp, cp, vpp, mbs = (_f(x) for x in (plans.dp, plans.tp, plans.pp, plans.cp, plans.vpp, plans.mbs))
    zero, rc, sp, hw = plans.zero, plans.recompute, plans.sp, plans.hw
    tiers = table.tiers(hw)
    peak = table.peak_flops(task.precision)[hw]
    eff, half = table.gemm_eff[hw], table.gemm_half_dim[hw]
    hbm_bw = table.hbm_bw[hw]
    m = wl.model
    s = float(wl.seq_len)
    h = float(m.hidden)
    n_micro = task.global_batch / (dp * mbs)
    tokens = mbs * s / cp  # tokens of one micro-batch on one GPU
    layers_per_stage = wl.layers / pp
    sp_div = np.where(sp > 0, tp, 1.0)
    train_frac = wl.trainable_fraction

    # ---- per layer, per micro-batch compute (forward) ------------------------------------------------
    gemm_fwd = np.zeros_like(dp)
    for g in wl.gemms:
        sharded = (g.n if g.tp_dim == "n" else g.k) / tp
        other = float(g.k if g.tp_dim == "n" else g.n)
        dim = np.minimum(np.minimum(tokens, sharded), other)
        gemm_fwd = gemm_fwd + gemm_time_s(tokens * g.flops_per_token / tp, dim, peak, eff, half)
    attn_flops = tokens * wl.attn_flops_per_token / tp
    if stack.flash_attention:
        attn_fwd = attn_flops * (0.5 if wl.causal else 1.0) / (peak * table.attn_eff[hw])
        attn_bwd_factor = FLASH_BWD_FACTOR
    else:  # unfused: batched GEMMs of inner dim head_dim over the full s x s matrix + softmax traffic
        attn_fwd = gemm_time_s(attn_flops, np.full_like(dp, float(m.head_dim)), peak, eff, half)
        attn_bwd_factor = 2.0
    score_elem = memory_bound_time_s(tokens * s * wl.score_elementwise_bytes_per_key / tp, hbm_bw)
    elem = memory_bound_time_s(
        tokens * (wl.elementwise_replicated_bytes / sp_div + wl.elementwise_tp_bytes / tp), hbm_bw
    )
    layer_fwd = gemm_fwd + attn_fwd + score_elem + elem
    # backward: activation-gradient GEMMs always, weight-gradient GEMMs only for trainable weights
    layer_bwd = gemm_fwd * (1.0 + train_frac) + attn_fwd * attn_bwd_factor + 2.0 * (score_elem + elem)
    layer_recompute = np.select([rc == 1, rc == 2], [attn_fwd * (not stack.flash_attention) + score_elem, layer_fwd], 0.0)

    # ---- TP (+SP) and CP communication per layer per micro-batch ------------------------------------
    act_bytes = tokens * h * ACT_BYTES
    tp_collectives = 4.0 + np.where(rc == 2, 2.0, 0.0)  # 2 fwd + 2 bwd all-reduces (or AG+RS pairs with SP)
    tp_each = np.where(tp > 1, all_reduce_s(act_bytes, tp, np.ones_like(tp), tiers), 0.0)
    tp_comm = tp_collectives * tp_each
    if stack.tp_comm_overlap:
        passes = 3.0 + np.where(rc == 2, 1.0, 0.0)
        tp_exposed = np.maximum(0.0, tp_comm - gemm_fwd * passes)
    else:
        tp_exposed = tp_comm
    kv_bytes = mbs * s * 2 * m.n_kv_heads * m.head_dim * ACT_BYTES / tp  # whole-sequence K and V of a layer
    cp_fwd = np.where(cp > 1, all_gather_s(kv_bytes, cp, tp, tiers), 0.0)  # ring attention passes KV blocks
    cp_comm = cp_fwd * (3.0 + np.where(rc == 2, 1.0, 0.0))  # fwd KV, bwd KV + dKV, recompute KV
    cp_window = attn_fwd * (1.0 + attn_bwd_factor + np.where(rc == 2, 1.0, 0.0))
    cp_exposed = np.maximum(0.0, cp_comm - cp_window)

    # ---- per stage, per micro-batch ----------------------------------------------------------------
    overhead = table.layer_overhead_s[hw] * (2.0 + np.where(rc == 2, 1.0, 0.0))
    base = {
        "compute": layers_per_stage * (layer_fwd + layer_bwd),
        "recompute": layers_per_stage * layer_recompute,
        "tp_comm": layers_per_stage * tp_exposed,
        "cp_comm": layers_per_stage * cp_exposed,
        "overhead": layers_per_stage * overhead,
    }
    hidden = {
        "tp_comm": layers_per_stage * (tp_comm - tp_exposed),
        "cp_comm": layers_per_stage * (cp_comm - cp_exposed),
    }
    # LM head + loss on the last stage (vocab-parallel GEMM, fp32 softmax traffic)
    head_gemm = gemm_time_s(
        tokens * wl.head_flops_per_token / tp, np.minimum(tokens, max(wl.vocab, 1) / tp), peak, eff, half
    ) if wl.vocab else np.zeros_like(dp)
    head_time = head_gemm * 3.0 + memory_bound_time_s(tokens * wl.vocab / tp * 4.0 * 3.0, hbm_bw)
    emb_time = memory_bound_time_s(tokens * h * ACT_BYTES * 3.0, hbm_bw)

    # pipeline p2p: activation forward, gradient backward, once per virtual chunk
    p2p_bytes = tokens * h * ACT_BYTES / sp_div
    pp_stride = tp * cp * dp
    pp_comm = np.where(pp > 1, 2.0 * vpp * p2p_s(p2p_bytes, pp_stride, tiers), 0.0)

    # ---- parameters per GPU ------------------------------------------------------------------------
    layer_params = layers_per_stage * wl.params_per_layer / tp
    layer_trainable = layers_per_stage * (wl.params_per_layer * train_frac + wl.lora_params_per_layer) / tp
    emb_trainable = 1.0 if (train_frac > 0 and wl.lora_params_per_layer == 0) else 0.0
    emb_params = wl.embedding_params / tp
    head_params = np.where(
        pp > 1, (wl.head_params or (wl.embedding_params if m.tied_embeddings else 0)), wl.head_params
    ) / tp
    first_params = layer_params + emb_params + np.where(pp > 1, 0.0, head_params)
    last_params = layer_params + head_params + np.where(pp > 1, 0.0, emb_params)
    first_train = layer_trainable + emb_trainable * (first_params - layer_params)
    last_train = layer_trainable + emb_trainable * (last_params - layer_params)

    dp_group = dp * cp  # gradients are reduced (and ZeRO shards) over dp x cp
    grad_bytes = 4.0 if stack.grad_reduce_dtype == "fp32" else 2.0
    zero3_each = np.where(
        (zero >= 3) & (dp_group > 1),
        (2.0 + np.where(rc == 2, 1.0, 0.0)) * all_gather_s(first_params * 2.0, dp_group, tp, tiers)
        + reduce_scatter_s(first_train * grad_bytes, dp_group, tp, tiers),
        0.0,
    )
    stage_compute = base["compute"] + base["recompute"]
    zero3_exposed = np.maximum(0.0, zero3_each - stage_compute) if stack.dp_overlap else zero3_each
    base["zero3_comm"] = zero3_exposed
    hidden["zero3_comm"] = zero3_each - zero3_exposed

    first = dict(base, pp_comm=pp_comm)
    first["compute"] = base["compute"] + emb_time + np.where(pp > 1, 0.0, head_time)
    last = dict(base, pp_comm=pp_comm)
    last["compute"] = base["compute"] + head_time + np.where(pp > 1, 0.0, emb_time)
    t_first = np.sum([first[k] for k in STAGE_TERMS], axis=0)
    t_last = np.sum([last[k] for k in STAGE_TERMS], axis=0)
    first_is_bottleneck = t_first >= t_last
    bottleneck = {k: np.where(first_is_bottleneck, first[k], last[k]) for k in STAGE_TERMS}
    t_base = np.sum([base[k] for k in STAGE_TERMS if k in base], axis=0) + pp_comm
    t_mean = np.where(pp > 1, ((pp - 2.0) * t_base + t_first + t_last) / pp, t_first)

    time = {k: n_micro * bottleneck[k] for k in STAGE_TERMS}
    time["bubble"] = bubble_time_s(pp, vpp, t_mean)

    # ---- data-parallel gradient sync (ZeRO 0-2), overlapped with the last micro-batch's backward -------
    worst_train = np.maximum(first_train, last_train)
    grads = worst_train * grad_bytes
    sync = np.select(
        [zero == 0, zero <= 2],
        [
            all_reduce_s(grads, dp_group, tp, tiers),
            reduce_scatter_s(grads, dp_group, tp, tiers) + all_gather_s(worst_train * 2.0, dp_group, tp, tiers),
        ],
        0.0,
    )
    sync = np.where(dp_group > 1, sync, 0.0)
    window = layers_per_stage * layer_bwd if stack.dp_overlap else 0.0
    time["dp_comm"] = np.maximum(0.0, sync - window)
    hidden["dp_comm"] = sync - time["dp_comm"]
    opt_params = worst_train / np.where(zero >= 1, dp_group, 1.0)
    time["optimizer"] = memory_bound_time_s(opt_params * OPTIMIZER_BYTES_PER_PARAM, hbm_bw)

    # ---- memory per GPU (worst of first and last stage) ---------------------------------------------
    score_per_token = np.full_like(dp, s * wl.act_score_bytes_per_key)
    stored, working = layer_activation_bytes(
        tokens, tp, sp, rc, wl.act_replicated_bytes, wl.act_tp_sharded_bytes, score_per_token, ACT_BYTES * h
    )
    first_act = layers_per_stage * in_flight_layer_factor(n_micro, pp, vpp) * stored + working
    logits = tokens * wl.vocab / tp * 4.0
    last_act = layers_per_stage * stored + working + logits
    first_act = first_act + np.where(pp > 1, 0.0, logits)
    zero3_buffers = np.where(zero >= 3, 2.0 * 2.0 * wl.params_per_layer / tp, 0.0)  # two gathered layers
    mems = []
    for params, train, act in ((first_params, first_train, first_act), (last_params, last_train, last_act)):
        w, gr, op = model_state_bytes(params, train, zero, dp_group, grad_bytes)
        mems.append(MemoryTerms(w, gr, op, act, zero3_buffers))
    first_worse = mems[0].total >= mems[1].total
    memory = MemoryTerms(
        *(np.where(first_worse, getattr(mems[0], f), getattr(mems[1], f))
          for f in ("weights", "gradients", "optimizer", "activations", "temporary"))
    )
    capacity = table.hbm_bytes[hw] * (1.0 - stack.memory_reserve_fraction)

    invalid = _invalid(wl, task, table, plans, n_micro, memory.total, capacity)
    tokens_per_step = float(task.global_batch * s)
    return TrainingTerms(
        time=time,
        hidden_comm=hidden,
        memory=memory,
        capacity_bytes=capacity,
        invalid=invalid,
        tokens_per_step=tokens_per_step,
        model_flops_per_step=tokens_per_step * wl.model_flops_per_token,
        gpus=plans.gpus,
        peak_flops=peak,
    )


def _invalid(
    wl: TransformerWorkload,
    task: Task,
    table: HardwareTable,
    plans: PlanArrays,
    n_micro: Arr,
    mem_total: Arr,
    capacity: Arr,
) -> NDArray[np.int64]:
    m = wl.model
    tp, pp, vpp, cp = plans.tp, plans.pp, plans.vpp, plans.cp
    node = table.tier_size[0][plans.hw]
    node = np.where(np.isinf(node), 1 << 30, node).astype(np.int64)
    checks = [
        (1, plans.gpus != table.gpus[plans.hw].astype(np.int64)),
        (2, (m.heads % tp != 0) | (m.n_kv_heads % tp != 0)),
        (3, wl.layers % (pp * vpp) != 0),
        (4, task.global_batch % (plans.dp * plans.mbs) != 0),
        (5, (vpp > 1) & ((pp == 1) | (np.round(n_micro).astype(np.int64) % pp != 0))),
        (6, (cp > 1) & (wl.seq_len % (2 * cp) != 0)),
        (7, (plans.sp > 0) & (tp == 1)),
        (8, (plans.zero > 0) & (plans.dp * cp == 1)),
        (9, (node % tp != 0) & (tp % node != 0)),
        (MEMORY_REASON, mem_total > capacity),
    ]
    code = np.zeros(len(plans), dtype=np.int64)
    for c, bad in reversed(checks):  # the first violated check wins
        code = np.where(bad, c, code)
    return code
