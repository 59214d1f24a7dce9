"""One transformer layer's training costs for one micro-batch on one GPU (:class:`LayerCosts`), plus the embedding,
LM-head and pipeline p2p extras of a stage: the first of the training model's three layers of functions
(model/training.py assembles stages and the step from them; it re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.collectives import Tiers, all_gather_s, p2p_s
from madmax_opt.model.compute import (
    FP8_WEIGHT_COPY_BYTES,
    LOW_PRECISION_GEMMS,
    at_ceiling_s,
    gemm_time_s,
    memory_bound_time_s,
)
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.memory import (
    OPTIMIZER_STATE_BYTES,
    WEIGHT_BYTES,
    layer_activation_bytes,
    op_sac_layer_bytes,
)
from madmax_opt.model.ops import exposed_hidden, layer_ops
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import RC, Stack, Task, TrainingFramework
from madmax_opt.model.workload import ACT_BYTES, TransformerWorkload

COMM_INTERFERENCE = 0.15  # compute slowdown while NVLink collectives overlap it (docs/reference/hardware.md)


def _f(a: NDArray[np.int64]) -> Arr:
    return a.astype(np.float64)


@dataclass(frozen=True)
class LayerCosts:
    """Per-plan costs of one transformer layer for one micro-batch on one GPU, plus the stage extras."""

    plans: PlanArrays
    tiers: Tiers
    n_micro: Arr
    time: dict[str, Arr]  # compute, recompute, tp_comm, cp_comm, overhead (exposed), per layer per micro-batch
    hidden: dict[str, Arr]  # tp_comm, cp_comm overlapped, per layer per micro-batch
    bwd_s: Arr  # backward compute of one layer without its weight-gradient GEMMs
    wgrad_s: Arr  # weight-gradient GEMMs of one trainable layer
    params: Arr  # parameters of one layer on one GPU = (params_per_layer + LoRA adapters) / tp
    trainable: Arr  # parameters with gradients of one trainable layer on one GPU
    lora_trainable: Arr  # LoRA adapter parameters of one layer on one GPU (trained in every layer)
    trainable_fraction: float  # share of layers with trainable base weights
    act_stored_bytes: Arr  # activations one layer keeps per micro-batch in flight
    act_working_bytes: Arr  # transient working set (full recompute rebuilds one layer)
    emb_time_s: Arr
    emb_params: Arr
    head_time_s: Arr
    head_params: Arr  # LM head on the last stage (a copy of the tied embedding when pp > 1)
    logits_bytes: Arr
    pp_comm_s: Arr
    emb_trainable: float  # 1 if embedding/head weights are trained
    grad_bytes: float
    dp_group: Arr
    zero3_layer_buffers: Arr
    weight_copy_bytes: float = 0.0  # extra bytes per local parameter held for FP8 GEMMs (TE weight cache)
    gather_bytes: float = 2.0  # bytes per parameter a ZeRO-3 / FSDP all-gather moves (bf16; float8 all-gather: 1)
    expert_params: Arr | float = 0.0  # routed-expert parameters of one layer on one GPU (MoE)
    expert_group: Arr | float = 1.0  # expert-data-parallel group (dp*cp/ep) and its stride
    expert_stride: Arr | float = 1.0
    optimizer_bytes: float = OPTIMIZER_STATE_BYTES["fp32"]  # Adam state per trainable parameter (stack.optimizer_dtype)


def layer_costs(
    wl: TransformerWorkload, task: Task, stack: Stack, table: HardwareTable, plans: PlanArrays
) -> LayerCosts:
    """Costs of one layer (and the embedding/head extras) for every plan in ``plans`` (vectorised)."""
    dp, tp, pp, vpp, mbs = (_f(x) for x in (plans.dp, plans.tp, plans.pp, plans.vpp, plans.mbs))
    groups = Groups.of(plans)
    rc, sp, hw = plans.recompute, plans.sp, plans.hw
    low = task.precision in LOW_PRECISION_GEMMS
    ops = layer_ops(wl, task, stack, table, plans)  # the op table (model/ops.py): every compute and comm op
    tiers, tokens, full_rc, ex = ops.tiers, ops.tokens, ops.full_rc, ops.experts
    peak, eff, half, hbm_bw = ops.peak, ops.eff, ops.half, ops.hbm_bw
    m = wl.model
    s = float(wl.seq_len)
    h = float(m.hidden)

    # ---- compute: the table's rows, per pass (each lifted to the measured utilisation ceiling by its own row) --------
    layer_fwd = ops.total_s("compute", "fwd")
    # backward: activation-gradient GEMMs always; weight-gradient GEMMs (= forward FLOPs) in trainable layers only,
    # added per stage by the number of trainable layers it holds
    layer_bwd = ops.total_s("compute", "bwd-input")
    gemm_fwd = ops.total_s("compute", "bwd-weight")
    train_frac = wl.trainable_fraction
    layer_recompute = ops.total_s("recompute", "recompute")

    # ---- TP (+SP), EP and CP communication: the table's collectives, exposed beyond their overlap windows ----
    ones = np.ones_like(tp)
    bwd_exposed, bwd_hidden = exposed_hidden(ops.select("tp_comm", "bwd-input"))
    tp_comm = ops.total_s("tp_comm", "fwd", "recompute") + bwd_exposed + bwd_hidden
    # --tp-comm-overlap (userbuffers): everything hides behind the GEMMs it joins (fwd, 2x bwd, recompute fwd)
    tp_hidden = np.minimum(tp_comm, gemm_fwd * (3.0 + full_rc)) if stack.tp_comm_overlap else bwd_hidden
    # overlapped collectives take SMs from the GEMMs under them (~15 % on NVLink; docs/reference/hardware.md)
    tp_exposed = tp_comm - tp_hidden + COMM_INTERFERENCE * tp_hidden
    # MoE token dispatch + combine: 2 all-to-alls forward, 2 backward, 2 more in a full recompute
    ep_comm = ops.total_s("ep_comm", "fwd", "recompute", "bwd-input")
    if stack.ep_comm_overlap:  # hidden behind the expert GEMMs (fwd, 2x bwd, recompute)
        ep_exposed = np.maximum(0.0, ep_comm - ex.fwd_gemm_s * (3.0 + full_rc))
    else:
        ep_exposed = ep_comm
    cp_comm = ops.total_s("cp_comm", "fwd", "recompute", "bwd-input")  # fwd KV, recompute KV, bwd KV + dKV
    cp_window = ops.attn_fwd_s * (1.0 + ops.attn_bwd_factor + full_rc)
    cp_exposed = np.maximum(0.0, cp_comm - cp_window)

    # ---- extras: embedding (first stage), LM head + loss (last stage), pipeline p2p ----------------
    if wl.vocab:
        head_dim = np.minimum(tokens, wl.vocab / tp)
        head_flops = tokens * wl.head_flops_per_token / tp  # no faster than the utilisation ceiling, like the layers
        head_gemm = at_ceiling_s(gemm_time_s(head_flops, head_dim, peak, eff, half), head_flops,
                                 table.peak_flops(task.precision)[hw], ops.ceiling)
    else:
        head_gemm = np.zeros_like(dp)
    head_time = head_gemm * 3.0 + memory_bound_time_s(tokens * wl.vocab / tp * 4.0 * 3.0, hbm_bw)
    emb_time = memory_bound_time_s(tokens * h * ACT_BYTES * 3.0, hbm_bw)
    # p2p per virtual chunk: fwd activation + bwd gradient. Split over the TP ranks when SP shards it already or
    # with scatter/gather (Narayanan et al. 2021, Sec. 4.1: send b*s*h/t per rank, all-gather over NVLink on arrival)
    split = (sp > 0) | ((tp > 1) & stack.pp_scatter_gather)
    act_full = tokens * h * ACT_BYTES
    regather = np.where(split & (sp == 0), all_gather_s(act_full, tp, np.ones_like(tp), tiers), 0.0)
    p2p_each = p2p_s(act_full / np.where(split, tp, 1.0), groups.stage, tiers, pp) + regather
    pp_comm = np.where(pp > 1, 2.0 * vpp * p2p_each, 0.0)

    # ---- parameters and activations ------------------------------------------------------------------
    head_params = wl.head_params or (wl.embedding_params if m.tied_embeddings else 0)
    score_per_token = np.full_like(dp, s * wl.act_score_bytes_per_key)
    stored, working = layer_activation_bytes(
        tokens, tp, sp, rc, wl.act_replicated_bytes + wl.fp8_replicated_delta_bytes,
        wl.act_tp_sharded_bytes + wl.fp8_tp_delta_bytes, score_per_token, ACT_BYTES * h
    )
    if wl.op_sac_applies(stack):  # torchtitan's selective AC is op-level SAC
        sac = op_sac_layer_bytes(tokens, tp, sp, wl.act_sac_replicated_bytes, wl.act_sac_tp_bytes,
                                 wl.act_sac_unsharded_bytes)
        stored = np.where(rc == RC.SELECTIVE, sac, stored)
    return LayerCosts(
        plans=plans,
        tiers=tiers,
        n_micro=task.global_batch / (dp * mbs),
        time={
            "compute": layer_fwd + layer_bwd,  # + wgrad_s per trainable layer (stage_costs)
            "recompute": layer_recompute,
            "tp_comm": tp_exposed,
            "cp_comm": cp_exposed,
            "ep_comm": ep_exposed,
            "overhead": table.layer_overhead_s[hw] * (2.0 + full_rc),
        },
        hidden={"tp_comm": tp_hidden, "cp_comm": cp_comm - cp_exposed, "ep_comm": ep_comm - ep_exposed},
        bwd_s=layer_bwd,
        wgrad_s=gemm_fwd,
        params=(wl.params_per_layer + wl.lora_params_per_layer) / tp,
        trainable=wl.params_per_layer / tp + ones * 0.0,
        lora_trainable=wl.lora_params_per_layer / tp + ones * 0.0,
        trainable_fraction=train_frac,
        act_stored_bytes=stored,
        act_working_bytes=working,
        emb_time_s=emb_time,
        emb_params=wl.embedding_params / tp,
        head_time_s=head_time,
        head_params=np.where(pp > 1, head_params, wl.head_params) / tp,
        logits_bytes=tokens * wl.vocab / tp * 4.0,
        pp_comm_s=pp_comm,
        emb_trainable=1.0 if wl.trains_embedding else 0.0,
        grad_bytes=4.0 if stack.grad_reduce_dtype == "fp32" else 2.0,
        dp_group=groups.gradient,  # gradients are reduced (and ZeRO shards) over dp x cp
        zero3_layer_buffers=np.where(plans.zero >= 3, 2.0 * 2.0 * (wl.params_per_layer / tp + ex.params), 0.0),
        # Megatron-Core + TE caches each weight's FP8 copy and its transpose for the step; FSDP2 / torchao casts on
        # the fly and keeps no copy (torchao Float8Linear); FP8 primary weights (stack.fp8_params) replace the bf16
        # weight by the FP8 copy and its transpose
        weight_copy_bytes=(FP8_WEIGHT_COPY_BYTES.get(task.precision, 0.0) - WEIGHT_BYTES) if (low and stack.fp8_params)
        else FP8_WEIGHT_COPY_BYTES.get(task.precision, 0.0) * (stack.framework == TrainingFramework.MEGATRON_CORE),
        # torchtitan all-gathers FP8 weights for Float8 linears (torchao enable_fsdp_float8_all_gather; inferred
        # for the Dec 2024 benchmark, torchtitan docs/float8.md), and so does --fp8-param-gather
        gather_bytes=1.0 if (low and (stack.framework == TrainingFramework.TORCHTITAN or stack.fp8_params)) else 2.0,
        expert_params=ex.params,
        expert_group=ex.group,
        expert_stride=ex.stride,
        optimizer_bytes=OPTIMIZER_STATE_BYTES[stack.optimizer_dtype],
    )
