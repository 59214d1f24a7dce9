"""Pipeline-parallel schedule terms: step time from per-stage micro-batch times, bubble, in-flight micro-batches."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]


def pipeline_time_s(n_micro: Arr, pp: Arr, vpp: Arr, t_max: Arr, t_mean: Arr) -> Arr:
    """1F1B / interleaved: T = m * t_max + (p - 1)/v * t_mean (Narayanan et al. 2021, bubble (p-1)/(v m))."""
    return n_micro * t_max + bubble_time_s(pp, vpp, t_mean)


def bubble_time_s(pp: Arr, vpp: Arr, t_mean: Arr) -> Arr:
    """Idle time of the warm-up and cool-down phases: (p - 1)/v micro-batch times of an average stage."""
    return (pp - 1) / vpp * t_mean


def in_flight_layer_factor(n_micro: Arr, pp: Arr, vpp: Arr) -> Arr:
    """Micro-batches whose activations stage 0 holds at once, times the interleaving overhead.

    1F1B keeps min(p, m) micro-batches in flight on the first stage; interleaving multiplies that by
    (1 + (p - 1)/(p v)) (Korthikanti et al. 2022, Sec. 4.2.3).
    """
    interleave = np.where(vpp > 1, 1.0 + (pp - 1) / (pp * vpp), 1.0)
    return np.minimum(pp, n_micro) * interleave
