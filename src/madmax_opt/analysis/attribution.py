"""Bottleneck attribution: which resource bounds each part of a plan's step, as shares of step time summing to 1.

Every additive term of the step (``training.STEP_TERMS``) goes to the resource that bounds it:

    compute     -> compute (FLOP/s) and hbm_bandwidth, split by the part that scales with 1/HBM bandwidth
    optimizer   -> hbm_bandwidth (the Adam step streams 34 B per parameter)
    *_comm      -> intra_node_comm (tier 0, the scale-up/NVLink domain) and inter_node_comm (outer tiers), split
                   by the part that scales with each tier's time (bandwidth^-1 and latency)
    recompute, zero3_comm -> memory_capacity (time paid only to fit in HBM: recomputation, ZeRO-3 gathers)
    bubble      -> pipeline_bubble;  overhead -> overhead (kernel launches)

The splits use the evaluator itself, not a copy of its formulas: each time term is positively homogeneous of
degree 1 in the resource time scales (bytes/bandwidth, FLOPs/peak, latencies), so by Euler's theorem
T_k = sum_r lambda_r dT_k/dlambda_r; the part of T_k due to resource r is that derivative at lambda = 1, taken by a
central difference on hardware whose resource r is (1 +- eps) times slower. A collective that crosses nodes is
thereby split between its intra- and inter-node phases (collectives.members_per_domain decides the phases).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from madmax_opt.core.numeric import Arr, ordered_sum
from madmax_opt.model.hardware import HardwareOption, HardwareTable
from madmax_opt.model.training import TrainingTerms

# terms_at(table, blocks): the time terms of the same plans evaluated on each of the ``blocks`` consecutive copies
# of the problem's hardware options that ``table`` holds (one batch: plans x blocks, block-major)
TermsAt = Callable[[HardwareTable, int], dict[str, Arr]]

CATEGORIES: tuple[str, ...] = (
    "compute", "hbm_bandwidth", "intra_node_comm", "inter_node_comm", "pipeline_bubble", "memory_capacity",
    "overhead",
)
WHOLE_TERMS: dict[str, str] = {  # terms bound by one resource as a whole
    "optimizer": "hbm_bandwidth",
    "recompute": "memory_capacity",
    "zero3_comm": "memory_capacity",
    "bubble": "pipeline_bubble",
    "overhead": "overhead",
}
WORK_TERMS: tuple[str, ...] = ("compute",)  # split between FLOP/s and HBM bandwidth
COMM_TERMS: tuple[str, ...] = ("tp_comm", "cp_comm", "pp_comm", "dp_comm")  # split between network tiers
RESOURCES: tuple[str, ...] = ("hbm", "intra", "inter")
EPS = 1e-6  # relative time-scale step of the central differences (the terms are piecewise linear in it)


def _slower(option: HardwareOption, resource: str, lam: float) -> HardwareOption:
    """``option`` with one resource ``lam`` times slower: HBM bandwidth, tier 0, or the tiers outside it."""
    system, gpu = option.system, option.gpu
    if resource == "hbm":
        gpu = gpu.model_copy(update={"hbm_bw": gpu.hbm_bw / lam})
    else:
        has_scale_up = system.tiers[0].size is not None
        tiers = [
            t.model_copy(update={"bw": t.bw / lam, "latency_s": t.latency_s * lam})
            if (i == 0 and has_scale_up) == (resource == "intra")
            else t
            for i, t in enumerate(system.tiers)
        ]
        system = system.model_copy(update={"tiers": tiers})
    return dataclasses.replace(option, system=system, gpu=gpu)  # same GPU name and fits: same trust record


def _parts(terms_at: TermsAt, options: Sequence[HardwareOption], n_plans: int) -> dict[str, dict[str, Arr]]:
    """dT_k/dlambda_r at lambda = 1 for every resource r and term k: the part of each term that scales with r."""
    steps = [(r, lam) for r in RESOURCES for lam in (1.0 + EPS, 1.0 - EPS)]
    table = HardwareTable(tuple(_slower(o, r, lam) for r, lam in steps for o in options))
    time = terms_at(table, len(steps))

    def block(j: int, k: str) -> Arr:
        return time[k][j * n_plans : (j + 1) * n_plans]

    return {r: {k: (block(2 * i, k) - block(2 * i + 1, k)) / (2.0 * EPS) for k in time} for i, r in enumerate(RESOURCES)}


def attribute(time: dict[str, Arr], options: Sequence[HardwareOption], terms_at: TermsAt) -> dict[str, Arr]:
    """Seconds of the step bound by each category (``CATEGORIES``), per plan; they add up to the step time."""
    zero = np.zeros_like(time["compute"])
    out = {c: zero.copy() for c in CATEGORIES}
    parts = _parts(terms_at, options, len(zero))
    for k, t in time.items():
        if k in WHOLE_TERMS:
            out[WHOLE_TERMS[k]] += t
        elif k in COMM_TERMS or k.endswith("_comm"):
            a, b = np.maximum(parts["intra"][k], 0.0), np.maximum(parts["inter"][k], 0.0)
            share_intra = np.divide(a, a + b, out=np.zeros_like(t), where=(a + b) > 0.0)
            out["intra_node_comm"] += t * share_intra  # no tier part (never for t > 0): all inter-node
            out["inter_node_comm"] += t * (1.0 - share_intra)
        else:  # compute, and any work term added later: what does not scale with HBM bandwidth is FLOP-bound
            memory_bound = np.clip(parts["hbm"][k], 0.0, t)
            out["hbm_bandwidth"] += memory_bound
            out["compute"] += t - memory_bound
    return out


def bottleneck_shares(
    terms: TrainingTerms, options: Sequence[HardwareOption], terms_at: TermsAt
) -> list[dict[str, float]]:
    """Per plan, ``{category: share of the step time}``; the shares sum to 1 (the terms are distributed whole)."""
    seconds = attribute(terms.time, options, terms_at)
    total = ordered_sum(seconds[c] for c in CATEGORIES)  # a left fold: bitwise the same in any batch
    return [{c: float(seconds[c][i] / total[i]) for c in CATEGORIES} for i in range(len(total))]


def main_bottleneck(shares: dict[str, float]) -> str:
    """The category with the largest share."""
    return max(shares, key=lambda c: shares[c])
