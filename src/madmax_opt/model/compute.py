"""Compute-time terms: GEMMs with shape-aware efficiency, attention kernels and memory-bound ops (vectorised)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]


def gemm_efficiency(dim: Arr, eff_max: Arr, half_dim: Arr) -> Arr:
    """eff = eff_max * d / (d + d_half): small per-GPU GEMM dimensions fill fewer tiles/SMs (saturating fit)."""
    return eff_max * dim / (dim + half_dim)


def gemm_time_s(flops: Arr, dim: Arr, peak_flops: Arr, eff_max: Arr, half_dim: Arr) -> Arr:
    """t = FLOPs / (peak x eff(d)), d = smallest per-GPU dimension of the GEMM."""
    return flops / (peak_flops * gemm_efficiency(dim, eff_max, half_dim))


def memory_bound_time_s(bytes_moved: Arr, hbm_bw_achieved: Arr) -> Arr:
    """t = bytes / (HBM bandwidth x hbm_eff) for elementwise/normalisation kernels."""
    return bytes_moved / hbm_bw_achieved
