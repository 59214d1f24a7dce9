"""Collective communication times (alpha-beta model over a hierarchy of network tiers), vectorised.

A process group of ``n`` ranks whose neighbours are ``stride`` ranks apart is laid over the tiers of a system
(tier 0 = scale-up domain, e.g. an NVLink node; the last tier = scale-out network). ``k_i`` members of the group
share one domain of tier i; the group spans ``r_i = k_i / k_(i-1)`` domains of tier i-1 inside each tier-i domain.
Collectives run hierarchically (NCCL's intra-node/inter-node phases; Thakur et al. 2005 for the ring formulas):

    all-reduce(S):        sum_i [ 2 (r_i-1)/r_i * S_i / B_i + alpha_i ],  S_i = S / k_(i-1)
    all-gather / RS(S):   sum_i [   (r_i-1)/r_i * S_i / B_i + alpha_i ]   (S = full, gathered size)
    all-to-all(S):        max_i [ (k_i - k_(i-1))/n * S / B_i ] + sum_i alpha_i
    p2p(S):               S / B_j + alpha_j,  j = innermost tier holding the whole chain of n ranks

with B_i = bandwidth x efficiency (NCCL bus bandwidth) per GPU in one direction, and alpha_i a per-collective
latency for each tier that the group crosses (10 us NVLink / 20 us IB in the common analytical setting of
docs/reference/hardware.md). Every function works on numpy arrays (one entry per plan) and on scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr

Num = NDArray[Any] | float  # an array (one entry per plan) or a scalar, float or integer


@dataclass(frozen=True)
class Tiers:
    """Per-plan tier parameters, each of shape (n_tiers, n_plans); the last tier has size = inf."""

    size: Arr
    bw: Arr  # effective bytes/s per GPU, one direction (bandwidth x efficiency)
    latency_s: Arr


def members_per_domain(n: Num, stride: Num, tiers: Tiers) -> list[Arr]:
    """k_i = min(n, max(k_(i-1), floor(D_i / stride))): members of the group in one domain of D_i GPUs.

    The outermost tier holds the whole group (k = n). The returned arrays are read-only views (the last may be
    ``n`` itself).
    """
    n = np.asarray(n, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    ks: list[Arr] = []
    k_prev: Arr | float = 1.0
    for size in tiers.size[:-1]:
        ks.append(np.minimum(np.maximum(np.floor(size / stride), k_prev), n))
        k_prev = ks[-1]
    shape = np.shape(ks[-1]) if ks else np.broadcast_shapes(n.shape, stride.shape, np.shape(tiers.size[-1]))
    ks.append(n if n.shape == shape else np.broadcast_to(n, shape))
    return ks


@dataclass(frozen=True)
class Group:
    """The cost coefficients of one process group (per plan): collectives are then one multiply-add.

    A ring phase over tier i moves (r_i - 1)/r_i * S/k_(i-1) = S (1/k_(i-1) - 1/k_i) bytes per pass, so
    ``s_per_byte`` = sum_i (1/k_(i-1) - 1/k_i) / B_i and ``latency_s`` = sum_i alpha_i [k_i > k_(i-1)].
    """

    s_per_byte: Arr
    latency_s: Arr

    @staticmethod
    def of(n: Num, stride: Num, tiers: Tiers) -> Group:
        s_per_byte: Arr | float = 0.0
        latency: Arr | float = 0.0
        inv_prev: Arr | float = 1.0
        k_prev: Arr | float = 1.0
        for i, k in enumerate(members_per_domain(n, stride, tiers)):
            inv = 1.0 / k
            s_per_byte = s_per_byte + (inv_prev - inv) / tiers.bw[i]  # + 0 where no new domain of tier i
            latency = latency + (k > k_prev) * tiers.latency_s[i]
            inv_prev, k_prev = inv, k
        return Group(np.asarray(s_per_byte), np.asarray(latency))

    def all_reduce_s(self, size_bytes: Num) -> Arr:
        """Hierarchical ring all-reduce: 2 passes (reduce-scatter + all-gather) per tier."""
        return 2.0 * size_bytes * self.s_per_byte + self.latency_s

    def all_gather_s(self, size_bytes: Num) -> Arr:
        """All-gather or reduce-scatter whose gathered (unsharded) buffer is ``size_bytes``: one pass."""
        return size_bytes * self.s_per_byte + self.latency_s

    reduce_scatter_s = all_gather_s  # the same one pass, ``size_bytes`` the unsharded buffer


def all_reduce_s(size_bytes: Num, n: Num, stride: Num, tiers: Tiers) -> Arr:
    """Hierarchical ring all-reduce of ``size_bytes`` per rank (reduce-scatter + all-gather per tier)."""
    return Group.of(n, stride, tiers).all_reduce_s(size_bytes)


def all_gather_s(size_bytes: Num, n: Num, stride: Num, tiers: Tiers) -> Arr:
    """All-gather (or reduce-scatter) whose gathered (unsharded) buffer is ``size_bytes``."""
    return Group.of(n, stride, tiers).all_gather_s(size_bytes)


reduce_scatter_s = all_gather_s


def all_to_all_s(size_bytes: Num, n: Num, stride: Num, tiers: Tiers) -> Arr:
    """All-to-all where each rank sends ``size_bytes`` in total, spread evenly over the n ranks."""
    worst = np.zeros(np.broadcast(size_bytes, n, stride).shape)
    lat = np.zeros_like(worst)
    k_prev = np.ones_like(worst)
    for i, k in enumerate(members_per_domain(n, stride, tiers)):
        worst = np.maximum(worst, (k - k_prev) / n * size_bytes / tiers.bw[i])
        lat = lat + np.where(k > k_prev, tiers.latency_s[i], 0.0)
        k_prev = k
    return worst + lat


def p2p_s(size_bytes: Num, stride: Num, tiers: Tiers, n: Num = 2.0) -> Arr:
    """Point-to-point send between neighbours of a chain of ``n`` ranks ``stride`` apart (pipeline stages).

    A chain that does not fit in one domain has a hop that leaves it, and the slowest hop sets the pace of a
    synchronous pipeline: the innermost tier whose domain holds all n * stride ranks is the one used.
    """
    t = size_bytes / tiers.bw[-1] + tiers.latency_s[-1]
    for i in range(len(tiers.size) - 2, -1, -1):  # innermost tier that holds the whole chain wins
        inside = n * stride <= tiers.size[i]
        t = np.where(inside, size_bytes / tiers.bw[i] + tiers.latency_s[i], t)
    return t
