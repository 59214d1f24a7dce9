"""Mixture-of-experts serving terms: expert weights per GPU under expert parallelism, the experts a batch touches,
grouped-GEMM time and the dispatch / combine all-to-all of every MoE layer (vectorised, one entry per plan).

Layout (vLLM ``--enable-expert-parallel``, SGLang / TensorRT-LLM wide EP with attention DP): a replica runs
attention with ``tp`` GPUs; the routed experts of a layer are spread over ``ep`` GPUs, ``ep`` = 1 (every expert
sharded over the replica's TP ranks, like a dense MLP) or a multiple of ``tp`` (``ep / tp`` attention replicas share
one expert pool and step together; each GPU holds ``E / ep`` whole experts). Per GPU and MoE layer, for ``T`` tokens
per replica:

    pooled tokens          T_pool = T * max(ep, tp) / tp                  (tokens of the replicas sharing experts)
    active experts         E_act = E * (1 - (1 - k/E)^T_pool)             (each token picks k of E uniformly)
    expert weight bytes    E_act * P_e * w / max(ep, tp)                   (streamed once per pass)
                           with EP (ep > 1) the busiest GPU's active experts instead of E_act / ep: the
                           group steps together (``busiest_active_experts``)
    expert FLOPs           T * k * f * 2 P_e / tp                          (f = load imbalance of the busiest GPU)
    rows per expert        M = T_pool * k * f / E_act   (grouped-GEMM efficiency falls with M: shape factor on M)
    dispatch / combine     all-to-all of (T / tp) * k * h * 2 B per GPU over the ep group, once each (ep > tp)
    TP restore             all-gather of T h 2 B over tp after the combine (ep > tp; replaces the MLP all-reduce)
    ep = tp                no all-to-all: every TP rank holds the replica's tokens, runs its E / ep experts on
                           them and the outputs are all-reduced as a dense MLP's (SGLang
                           DeepseekV2MoE.forward_normal and FusedMoE ``reduce_results``; the all-to-all path,
                           forward_deepep, serves attention DP)

Grouped GEMMs run at ``grouped_gemm_ratio`` of dense-GEMM efficiency (B200: 0.30 / 0.49 of peak,
docs/reference/hardware.md); at decode the few tokens per expert make them weight-bandwidth-bound, which the
roofline's memory term (active experts only) models. The KV cache is the attention's: unchanged by EP.
"""

from __future__ import annotations

import math

import numpy as np

from madmax_opt.core.numeric import Arr
from madmax_opt.model.collectives import Tiers, all_gather_s, all_to_all_s
from madmax_opt.model.compute import gemm_time_s, memory_bound_time_s
from madmax_opt.model.workload import ACT_BYTES, TransformerWorkload


def expert_shards(tp: Arr, ep: Arr) -> Arr:
    """GPUs one layer's routed experts are spread over: tp when ep = 1 (TP-sharded experts), else ep."""
    return np.maximum(ep, tp)


def pooled_tokens(tokens: Arr, tp: Arr, ep: Arr) -> Arr:
    """T_pool = T * max(ep, tp) / tp: the tokens of all attention replicas that share one expert pool."""
    return tokens * expert_shards(tp, ep) / tp


def active_experts(wl: TransformerWorkload, tokens_pool: Arr) -> Arr:
    """E_act = E (1 - (1 - k/E)^T): expected experts with at least one of T tokens (k distinct picks per token)."""
    e, k = float(wl.num_experts), float(wl.top_k)
    return e * (1.0 - np.power(1.0 - k / e, tokens_pool))


def tokens_per_expert(wl: TransformerWorkload, tokens: Arr, tp: Arr, ep: Arr) -> Arr:
    """M = T_pool k f / E_act: rows of the grouped GEMM per active expert (T_pool tokens pick k experts each)."""
    pool = pooled_tokens(tokens, tp, ep)
    return _rows_per_expert(wl, pool, active_experts(wl, pool))


def _rows_per_expert(wl: TransformerWorkload, pool: Arr, act: Arr) -> Arr:
    """M = T_pool k f / E_act from the pooled tokens and the active experts already computed."""
    return pool * wl.top_k * wl.expert_load_factor / np.maximum(act, 1e-9)


def busiest_active_experts(wl: TransformerWorkload, tokens_pool: Arr, ep: Arr) -> Arr:
    """Expected active experts on the busiest of ``ep`` GPUs holding n = E / ep whole experts each: every expert is
    active with probability q = 1 - (1 - k/E)^T (``active_experts``), a GPU's count ~ Binomial(n, q) (independent
    across GPUs, an approximation), and E[max of ep] = sum_{j<n} (1 - F(j)^ep) with F the binomial CDF. ep = 1
    (TP-sharded experts): every GPU streams its shard of every active expert, E_act (no imbalance). The EP group
    steps together, so the busiest GPU sets the time of its expert weights' streaming at small batches."""
    e = float(wl.num_experts)
    q = 1.0 - np.power(1.0 - float(wl.top_k) / e, tokens_pool)
    out = e * q  # ep = 1
    for size in np.unique(ep[ep > 1]):
        n = int(e // size)
        sel = ep == size
        j = np.arange(n + 1, dtype=np.float64)
        log_comb = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(n + 1)])
        qs = np.clip(q[sel], 1e-300, 1.0 - 1e-16)[:, None]
        pmf = np.exp(log_comb[None, :] + j[None, :] * np.log(qs) + (n - j)[None, :] * np.log1p(-qs))
        cdf = np.cumsum(pmf, axis=1)[:, :n]  # F(0) ... F(n - 1)
        out = np.where(sel, 0.0, out)
        out[sel] = np.sum(1.0 - np.power(np.minimum(cdf, 1.0), float(size)), axis=1) * float(size)
    return out


def expert_weight_bytes_per_gpu(wl: TransformerWorkload, tp: Arr, ep: Arr, weight_bytes: Arr) -> Arr:
    """Routed-expert weights of one layer on one GPU: E * P_e * w / max(ep, tp)."""
    return wl.expert_params_per_layer * weight_bytes / expert_shards(tp, ep)


def expert_pass_s(
    wl: TransformerWorkload,
    tokens: Arr,
    tp: Arr,
    ep: Arr,
    peak_flops: Arr,
    gemm_eff: Arr,
    half_dim: Arr,
    grouped_ratio: Arr,
    weight_bytes: Arr,
    hbm_bw: Arr,
) -> Arr:
    """Routed-expert grouped GEMMs of one layer on one GPU: roofline of expert FLOPs and active-expert bytes."""
    if not wl.moe:
        return np.zeros_like(tokens)
    shards = expert_shards(tp, ep)
    per_expert_dim = np.where(ep > 1, 1.0, tp)  # ep = 1: each expert's width is TP-sharded
    pool = pooled_tokens(tokens, tp, ep)
    act = active_experts(wl, pool)
    rows = _rows_per_expert(wl, pool, act)  # tokens_per_expert without pooling and counting experts again
    compute = np.zeros_like(tokens)
    for g in wl.expert_gemms:
        sharded = (g.n if g.tp_dim == "n" else g.k) / per_expert_dim
        other = float(g.k if g.tp_dim == "n" else g.n)
        # the shape factor takes the rows each expert gets: a grouped GEMM pads every expert's few tokens to whole
        # tiles, so its efficiency falls with M = tokens per expert (the dense GEMMs' half-dimension law)
        dim = np.minimum(np.minimum(sharded, other), rows)
        flops = tokens * wl.top_k * wl.expert_load_factor * g.flops_per_token / tp
        compute = compute + gemm_time_s(flops, dim, peak_flops, gemm_eff * grouped_ratio, half_dim)
    # weights streamed by the busiest GPU: its share of the active experts (E_act / shards with TP-sharded experts;
    # the expected maximum over the EP group of whole experts, ``busiest_active_experts`` / ep, with EP)
    busiest = np.where(ep > 1, busiest_active_experts(wl, pool, ep), act)
    expert_bytes = busiest * sum(g.params for g in wl.expert_gemms) * weight_bytes / shards
    io_bytes = tokens * wl.top_k * wl.expert_load_factor * 2.0 * wl.model.hidden * ACT_BYTES / tp
    return np.maximum(compute, memory_bound_time_s(expert_bytes + io_bytes, hbm_bw))


def ep_comm_s(wl: TransformerWorkload, tokens: Arr, tp: Arr, ep: Arr, stride: Arr, tiers: Tiers) -> Arr:
    """Dispatch + combine all-to-all over the ep GPUs, plus the all-gather that restores the replica's tokens on
    its TP ranks (ep > tp: an expert pool shared by attention replicas); zero for dense models and for experts
    inside one replica (ep <= tp: the tokens are on every rank already; the MLP all-reduce combines them)."""
    if not wl.moe:
        return np.zeros_like(tokens)
    h = float(wl.model.hidden)
    a2a_bytes = tokens / tp * wl.top_k * h * ACT_BYTES
    a2a = 2.0 * all_to_all_s(a2a_bytes, ep, stride, tiers)
    restore = np.where(tp > 1, all_gather_s(tokens * h * ACT_BYTES, tp, np.ones_like(tp), tiers), 0.0)
    return np.where(ep > tp, a2a + restore, 0.0)
