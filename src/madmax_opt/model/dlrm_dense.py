"""DLRM dense part and step assembly: MLP / interaction / transformer / MoE GEMMs under DDP, FSDP or node tensor
parallelism, vectorised over dense plans, and the step time that joins them with the embedding times."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from madmax_opt.core.errors import ProblemError
from madmax_opt.core.numeric import Arr, IntArr, ordered_sum
from madmax_opt.model.collectives import all_gather_s, all_reduce_s, all_to_all_s, reduce_scatter_s
from madmax_opt.model.compute import gemm_time_s, memory_bound_time_s
from madmax_opt.model.dlrm import DLRMWorkload, Layout
from madmax_opt.model.dlrm_embedding import EmbeddingTimes
from madmax_opt.model.dlrm_spec import (
    ADAM_TRAFFIC_BYTES,
    DENSE_GRAD_BYTES,
    DENSE_STATE_BYTES,
    DENSE_STRATEGIES,
    DENSE_WEIGHT_BYTES,
    DensePlan,
    DLRMModel,
    DLRMSpace,
    DLRMStack,
    DLRMTask,
)
from madmax_opt.model.spec import GPU

# ================================================================================== dense cost model

DENSE_INVALID: dict[int, str] = {
    1: "global_batch must be divisible by the number of GPUs",
    2: "tp must be a power of two that divides the node size",
    3: "tp > 1 is modelled with ddp only",
    4: "tp > 1 with a MoE top MLP is not modelled",
    5: "ep must divide the number of experts and of GPUs (and needs a MoE top MLP when > 1)",
    6: "memory per GPU exceeds capacity",
}
DENSE_MEMORY_REASON = 6


@dataclass(frozen=True)
class DensePlans:
    """Dense plans as columns: strategy (index into DENSE_STRATEGIES), tp, ep."""

    strategy: IntArr
    tp: IntArr
    ep: IntArr

    def __len__(self) -> int:
        return int(self.strategy.shape[0])

    def plan(self, i: int) -> DensePlan:
        return DensePlan(strategy=DENSE_STRATEGIES[int(self.strategy[i])], tp=int(self.tp[i]), ep=int(self.ep[i]))

    @staticmethod
    def of(plans: list[DensePlan]) -> DensePlans:
        return DensePlans(np.array([DENSE_STRATEGIES.index(p.strategy) for p in plans], dtype=np.int64),
                          np.array([p.tp for p in plans], dtype=np.int64),
                          np.array([p.ep for p in plans], dtype=np.int64))


def _knob(values: Any, default: list[int]) -> list[int]:
    if values is None:
        return default
    return sorted(set([values] if isinstance(values, int) else values))


def enumerate_dense(sp: DLRMSpace, m: DLRMModel, lay: Layout) -> DensePlans:
    """The dense plans of the space on one hardware option (validity is ``dense_terms``' job)."""
    strategies = list(DENSE_STRATEGIES) if sp.dense is None else ([sp.dense] if isinstance(sp.dense, str)
                                                                   else list(sp.dense))
    tps = _knob(sp.tp, [t for t in (1, 2, 4, 8, 16) if t <= lay.node])
    experts = m.top_moe.experts if m.top_moe else 1
    eps = _knob(sp.ep, [e for e in range(1, experts + 1) if experts % e == 0 and lay.gpus % e == 0])
    rows = [(DENSE_STRATEGIES.index(s), t, e) for s in strategies for t in tps for e in eps
            if not (s == "fsdp" and t > 1)]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return DensePlans(arr[:, 0], arr[:, 1], arr[:, 2])


@dataclass(frozen=True)
class DenseTerms:
    """Per dense plan (arrays): compute and communication of the dense part of one step."""

    bottom_fwd_s: Arr
    bottom_bwd_s: Arr
    top_fwd_s: Arr  # interaction, transformer block, top MLP (compute)
    top_bwd_s: Arr
    tp_comm_s: Arr  # tensor-parallel activation collectives, fwd + bwd (on the critical path)
    moe_a2a_s: Arr  # expert dispatch/combine all-to-alls, fwd + bwd (on the critical path)
    sync_s: Arr  # DDP: gradient all-reduce; FSDP: backward gathers + gradient reduce-scatter
    fsdp_fwd_s: Arr  # FSDP: forward weight gathers
    optimizer_s: Arr
    memory: dict[str, Arr]  # weights, gradients, optimizer, activations, buffers
    invalid: IntArr
    fwd_flops_per_gpu: Arr

    @property
    def memory_bytes(self) -> Arr:
        return ordered_sum(self.memory.values())  # left to right: one plan rounds as it does in a batch

    def take(self, i: int) -> DenseTerms:
        """Plan ``i`` alone (arrays of length 1): the same floats as ``dense_terms`` of that plan alone, which is
        elementwise over plans (+, -, x, /, min, max, floor, where)."""
        def one(a: Any) -> Any:
            return a[i:i + 1]

        return DenseTerms(**{f.name: one(getattr(self, f.name)) for f in fields(self) if f.name != "memory"},
                          memory={k: one(v) for k, v in self.memory.items()})


def dense_peak_flops(gpu: GPU, precision: str, stack: DLRMStack) -> float:
    """fp32 GEMMs use TF32 tensor cores when allowed and present (PyTorch allow_tf32), else fp32 CUDA cores."""
    peaks = gpu.peak_flops
    key = "tf32" if precision == "fp32" and stack.tf32 and "tf32" in peaks else precision
    if key not in peaks:
        raise ProblemError(f"GPU {gpu.name} has no {key} peak in the catalog", field="model.dense_precision")
    return float(peaks[key])


def dense_terms(wl: DLRMWorkload, task: DLRMTask, stack: DLRMStack, lay: Layout, plans: DensePlans) -> DenseTerms:
    """The dense part for every plan in ``plans`` (vectorised)."""
    gpu = lay.option.gpu
    tiers = lay.tiers
    N = float(lay.gpus)
    b = task.global_batch / N
    tp, ep = plans.tp.astype(np.float64), plans.ep.astype(np.float64)
    fsdp = plans.strategy == DENSE_STRATEGIES.index("fsdp")
    ones = np.ones(len(plans))
    peak = dense_peak_flops(gpu, wl.model.dense_precision, stack) * ones
    eff, half = gpu.calibration.gemm_eff * ones, gpu.calibration.gemm_half_dim * ones
    hbm = lay.hbm_bw * ones
    act = wl.act_bytes
    wb, st = DENSE_WEIGHT_BYTES[wl.model.dense_precision], DENSE_STATE_BYTES[wl.model.dense_precision]

    fwd = {"bottom": 0.0 * ones, "top": 0.0 * ones}
    tp_fwd, tp_bwd, moe_fwd = 0.0 * ones, 0.0 * ones, 0.0 * ones
    flops_gpu = 0.0 * ones
    for block in ("bottom", "top"):
        members = [g for g in wl.gemms if g.block == block or (block == "top" and g.block == "local")]
        tp_members = [g for g in members if g.block != "local" and not g.expert]
        for g in members:
            if g.expert:  # tokens per expert: the EP group's routed tokens spread over the experts
                rows = ep * b * wl.top_k * g.tokens / wl.experts
                flops = b * wl.top_k * g.flops_per_sample * ones
                dim = np.minimum(rows, min(g.k, g.n))
                routed = b * wl.top_k * g.tokens * act
                dispatch = all_to_all_s(routed * g.k * ones, ep, ones, tiers)
                combine = all_to_all_s(routed * g.n * ones, ep, ones, tiers)
                moe_fwd = moe_fwd + np.where(ep > 1, dispatch + combine, 0.0)
            elif g.block == "local":
                flops = b * g.flops_per_sample * ones
                dim = np.minimum(b * g.tokens, min(g.k, g.n)) * ones
            else:  # TP: the group's t*b samples against 1/t of the weights (column: n/t, row: k/t)
                rows = tp * b * g.tokens
                sharded = (g.k if g.row_parallel else g.n) / tp
                flops = b * g.flops_per_sample * ones
                dim = np.minimum(np.minimum(rows, sharded), float(g.n if g.row_parallel else g.k))
            t = gemm_time_s(flops, dim, peak, eff, half)
            t = t + memory_bound_time_s(2.0 * b * g.tokens * g.n * act * (wl.top_k if g.expert else 1) * ones,
                                        hbm)  # ReLU / bias: read + write the output
            fwd[block] = fwd[block] + t
            flops_gpu = flops_gpu + flops
        # Megatron pairs: all-reduce of each row-parallel GEMM's output (fwd) and of each column-parallel GEMM's
        # input grad (bwd); the block input is all-gathered over the group (fwd) and its grad reduce-scattered (bwd)
        for g in tp_members:
            size = tp * b * g.tokens * (g.n if g.row_parallel else g.k) * act
            ar = np.where(tp > 1, all_reduce_s(size, tp, ones, tiers), 0.0)
            if g.row_parallel:
                tp_fwd = tp_fwd + ar
            else:
                tp_bwd = tp_bwd + ar
        if tp_members:
            first, last = tp_members[0], tp_members[-1]
            edge = all_gather_s(tp * b * first.k * act * ones, tp, ones, tiers)
            if not last.row_parallel:  # a block ending on a column-parallel GEMM gathers its output
                edge = edge + all_gather_s(tp * b * last.n * act * ones, tp, ones, tiers)
            tp_fwd = tp_fwd + np.where(tp > 1, edge, 0.0)
            tp_bwd = tp_bwd + np.where(tp > 1, edge, 0.0)
    inter = gemm_time_s(b * wl.interaction_flops_per_sample * ones, float(wl.interaction_dim) * ones, peak, eff,
                        half) if wl.interaction_flops_per_sample else 0.0 * ones
    attn = b * wl.attn_flops_per_sample / (peak * gpu.calibration.attn_eff) * ones
    top_fwd = fwd["top"] + inter + attn
    flops_gpu = flops_gpu + b * (wl.interaction_flops_per_sample + wl.attn_flops_per_sample)
    train = task.kind == "train"
    bwd_factor = 2.0 if train else 0.0  # activation grad + weight grad GEMMs

    # parameters per GPU: TP-sharded MLP weights, replicated local ones, experts split over ep
    tp_params = float(sum(g.params for g in wl.gemms if g.block != "local" and not g.expert))
    rep_params = float(sum(g.params for g in wl.gemms if g.block == "local"))
    exp_params = float(wl.expert_params)
    local_params = tp_params / tp + rep_params + exp_params / ep
    gb = DENSE_GRAD_BYTES
    one = ones
    # one all-reduce per parameter kind that exists: replicated, TP-sharded (over N/t, stride t), experts (N/ep)
    ar_dense = (np.where(rep_params > 0, all_reduce_s(rep_params * gb * one, N * one, one, tiers), 0.0)
                + np.where(tp_params > 0, all_reduce_s(tp_params / tp * gb, N / tp, tp, tiers), 0.0)
                + np.where(exp_params > 0, all_reduce_s(exp_params / ep * gb, N / ep, ep, tiers), 0.0))
    dense_p = tp_params + rep_params
    n_units = float(len([g for g in wl.gemms if not g.expert])) + (float(len([g for g in wl.gemms if g.expert]))
                                                                  if exp_params else 0.0)
    lat_ag = all_gather_s(0.0 * one, N * one, one, tiers)
    gather = (all_gather_s(dense_p * wb * one, N * one, one, tiers)
              + np.where(exp_params > 0, all_gather_s(exp_params / ep * wb, N / ep, ep, tiers), 0.0)
              + (n_units - 1.0) * lat_ag)  # one gather per layer (FSDP unit)
    scatter = (reduce_scatter_s(dense_p * gb * one, N * one, one, tiers)
               + np.where(exp_params > 0, reduce_scatter_s(exp_params / ep * gb, N / ep, ep, tiers), 0.0)
               + (n_units - 1.0) * lat_ag)
    single = N == 1
    sync = np.where(single, 0.0, np.where(fsdp, gather + scatter, ar_dense)) * train
    fsdp_fwd = np.where(fsdp & (not single), gather, 0.0) * train
    opt_params = np.where(fsdp, (dense_p + exp_params) / N, local_params)
    optimizer = memory_bound_time_s(opt_params * ADAM_TRAFFIC_BYTES[wl.model.dense_precision], hbm) * train

    largest = float(max(g.params for g in wl.gemms))
    weights = np.where(fsdp, (dense_p + exp_params) / N * wb + 2.0 * largest * wb, local_params * wb)
    state = np.where(fsdp, (dense_p + exp_params) / N, local_params) * (st - wb) * train
    acts = b * wl.act_bytes_per_sample * (1.0 if train else 0.0) * ones
    if not train:  # inference keeps one layer's input and output at a time
        acts = b * max(g.tokens * (g.k + g.n) * act for g in wl.gemms) * ones
    memory = {"weights": weights, "optimizer_and_grads": state, "activations": acts}

    node = float(lay.node)
    checks = [
        (1, task.global_batch % lay.gpus != 0),
        (2, (node % tp != 0) | (np.log2(tp) % 1 != 0)),
        (3, (tp > 1) & fsdp),
        (4, (tp > 1) & (wl.experts > 1)),
        (5, (wl.experts % plans.ep != 0) | (lay.gpus % plans.ep != 0) | ((plans.ep > 1) & (wl.experts == 1))),
    ]
    code = np.zeros(len(plans), dtype=np.int64)
    for c, bad in reversed(checks):
        code = np.where(bad, c, code)
    return DenseTerms(
        bottom_fwd_s=fwd["bottom"],
        bottom_bwd_s=bwd_factor * fwd["bottom"],
        top_fwd_s=top_fwd,
        top_bwd_s=bwd_factor * top_fwd,
        tp_comm_s=tp_fwd + tp_bwd * train,
        moe_a2a_s=moe_fwd * (2.0 if train else 1.0),  # the backward sends the gradients the same way
        sync_s=sync,
        fsdp_fwd_s=fsdp_fwd,
        optimizer_s=optimizer,
        memory=memory,
        invalid=code,
        fwd_flops_per_gpu=flops_gpu,
    )


# ===================================================================================== step assembly

STEP_TERMS: tuple[str, ...] = (
    "lookup_fwd", "bottom_fwd", "a2a_fwd", "fsdp_fwd", "top_fwd", "tp_comm", "moe_a2a", "top_bwd", "bottom_bwd",
    "a2a_bwd", "lookup_bwd", "grad_sync", "optimizer",
)


def step_terms(dense: DenseTerms, emb: EmbeddingTimes, stack: DLRMStack, task: DLRMTask) -> tuple[
        dict[str, Arr], dict[str, Arr]]:
    """(additive step terms, overlapped communication) per dense plan. Two streams (MAD-Max): compute and comm.

    forward:  Lf + max(Cin + Cout, Bf) + Tf  -- the bottom MLP (needs no embedding) fills the waits for the id
              all-to-all (Cin, before the lookups) and the pooled all-to-all (Cout, after them), split at layers;
              with ``pipeline_input_dist`` Cin runs during the previous step's top MLP instead.
    backward: Tb + max(Cgrad, Bb) + Lb  -- the gradient all-to-all overlaps the bottom MLP's backward.
    sync:     DDP gradient all-reduce (+ data-parallel tables' all-reduce) runs whenever the comm stream is free
              during backward: exposed = max(0, sync - (Tb + max(0, Bb - Cgrad) + Lb)); FSDP forward gathers
              likewise behind Lf, the bottom MLP's spare time and Tf.
    TP collectives and MoE all-to-alls sit on the critical path (not overlapped).
    """
    train = task.kind == "train"
    lf, lb = emb.lookup_fwd_s, emb.lookup_bwd_s if train else 0.0
    cin, cout = emb.input_s, emb.output_s
    bf, bb, tf, tb = dense.bottom_fwd_s, dense.bottom_bwd_s, dense.top_fwd_s, dense.top_bwd_s
    cin_exposed = np.maximum(0.0, cin - (tf + tb)) if stack.pipeline_input_dist else cin + 0.0 * bf
    a2a_fwd = np.maximum(0.0, cin_exposed + cout - bf)
    cgrad = cout if train else 0.0
    a2a_bwd = np.maximum(0.0, cgrad - bb)
    fwd_idle = lf + np.maximum(0.0, bf - cin_exposed - cout) + tf
    fsdp_fwd = np.maximum(0.0, dense.fsdp_fwd_s - fwd_idle)
    sync = dense.sync_s + (emb.dp_allreduce_s if train else 0.0)
    bwd_idle = tb + np.maximum(0.0, bb - cgrad) + lb
    grad_sync = np.maximum(0.0, sync - bwd_idle) if train else 0.0 * bf
    time = {
        "lookup_fwd": lf + 0.0 * bf,
        "bottom_fwd": bf,
        "a2a_fwd": a2a_fwd,
        "fsdp_fwd": fsdp_fwd,
        "top_fwd": tf,
        "tp_comm": dense.tp_comm_s,
        "moe_a2a": dense.moe_a2a_s,
        "top_bwd": tb,
        "bottom_bwd": bb,
        "a2a_bwd": a2a_bwd,
        "lookup_bwd": lb + 0.0 * bf,
        "grad_sync": grad_sync,
        "optimizer": dense.optimizer_s,
    }
    hidden = {
        "a2a_fwd": cin + cout - a2a_fwd - (cin - cin_exposed),
        "input_dist_pipelined": cin - cin_exposed,
        "a2a_bwd": cgrad - a2a_bwd,
        "grad_sync": sync - grad_sync,
        "fsdp_fwd": dense.fsdp_fwd_s - fsdp_fwd,
    }
    return time, hidden


def step_time_s(time: dict[str, Arr]) -> Arr:
    return ordered_sum(time[k] for k in STEP_TERMS)  # left to right: one plan rounds as it does in a batch
