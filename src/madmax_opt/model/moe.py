"""Mixture-of-experts terms: routed-expert grouped GEMMs, token dispatch/combine all-to-all, expert parameters.

Megatron-Core MoE layout (``--expert-model-parallel-size``): the ``ep`` ranks of an expert-parallel group are
consecutive inside the data-parallel dimension (rank order tp-cp-ep-dp-pp), so the group has stride tp*cp; each
holds E/ep experts, sharded again over TP (expert TP = TP, Megatron's default before decoupling). Expert gradients
are reduced over the expert-data-parallel group of dp*cp/ep ranks (stride tp*cp*ep).

Per GPU, per layer and micro-batch of T tokens (T already divided by cp):
    routed token copies       T * k * f_load                        (f_load = max(capacity factor, imbalance))
    expert FLOPs (fwd)        T * k * f_load * 2 * (up + down weights) / tp
    per-expert GEMM rows      T * k * ep / E   (tokens an expert receives from the ep ranks)
    dispatch/combine bytes    T * k * f_load * h * 2 B / (tp if SP)  each, all-to-all over the ep group
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from madmax_opt.core.numeric import Arr
from madmax_opt.model.collectives import Tiers, all_to_all_s
from madmax_opt.model.compute import gemm_time_s
from madmax_opt.model.groups import Groups
from madmax_opt.model.workload import ACT_BYTES, TransformerWorkload


@dataclass(frozen=True)
class ExpertCosts:
    fwd_gemm_s: Arr  # routed-expert GEMMs of one layer, forward
    a2a_each_s: Arr  # one dispatch (or combine) all-to-all
    params: Arr  # routed-expert parameters of one layer on one GPU
    group: Arr  # expert-data-parallel group size (dp*cp/ep)
    stride: Arr  # its stride in ranks
    fwd_flops: Arr  # FLOPs of the routed-expert GEMMs, forward (padded copies included)
    operand_elements: Arr  # elements of their operands: routed inputs and outputs, local expert weights
    a2a_bytes: Arr  # bytes each rank sends in one dispatch (or combine)


def expert_costs(
    wl: TransformerWorkload,
    tokens: Arr,
    groups: Groups[Arr],
    sp_div: Arr,
    tiers: Tiers,
    peak: Arr,
    gemm_eff: Arr,
    half_dim: Arr,
    grouped_ratio: Arr,
) -> ExpertCosts:
    """Routed-expert costs for every plan (zeros for dense models)."""
    zeros = np.zeros_like(tokens)
    tp, ep = groups.tp, groups.ep
    if not wl.moe:
        return ExpertCosts(zeros, zeros, zeros, groups.gradient, tp, zeros, zeros, zeros)
    copies = tokens * wl.top_k * wl.expert_load_factor
    rows_per_expert = tokens * wl.top_k * ep / wl.num_experts
    fwd, flops, elements = zeros, zeros, zeros
    for g in wl.expert_gemms:
        sharded = (g.n if g.tp_dim == "n" else g.k) / tp
        other = float(g.k if g.tp_dim == "n" else g.n)
        dim = np.minimum(np.minimum(rows_per_expert, sharded), other)
        g_flops = copies * g.flops_per_token / tp
        flops = flops + g_flops
        elements = elements + copies * (sharded + other) + wl.num_experts / ep * sharded * other
        # grouped GEMMs run below dense-GEMM efficiency (B200: 0.30 vs 0.49 of peak, hardware.md)
        fwd = fwd + gemm_time_s(g_flops, dim, peak, gemm_eff * grouped_ratio, half_dim)
    a2a_bytes = copies * wl.model.hidden * ACT_BYTES / sp_div
    a2a = np.where(ep > 1, all_to_all_s(a2a_bytes, ep, groups.expert_stride, tiers), 0.0)
    return ExpertCosts(
        fwd_gemm_s=fwd,
        a2a_each_s=a2a,
        params=wl.expert_params_per_layer / (tp * ep),
        group=groups.expert_dp,
        stride=groups.expert_dp_stride,
        fwd_flops=flops,
        operand_elements=elements,
        a2a_bytes=a2a_bytes,
    )
