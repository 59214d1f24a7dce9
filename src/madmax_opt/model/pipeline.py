"""Pipeline-parallel schedule terms: step time from per-stage micro-batch times, bubble, in-flight micro-batches."""

from __future__ import annotations

import numpy as np

from madmax_opt.core.numeric import Arr


def bubble_time_s(pp: Arr, vpp: Arr, t_mean: Arr) -> Arr:
    """Idle time of the warm-up and cool-down phases: (p - 1)/v micro-batch times of an average stage; the step is
    m x t(bottleneck) + this (1F1B / interleaved, Narayanan et al. 2021), kept per term by training.stage_terms."""
    return (pp - 1) / vpp * t_mean


def in_flight_layer_factor(n_micro: Arr, pp: Arr, vpp: Arr) -> Arr:
    """Micro-batches of activations the first stage holds at once (in units of its whole stage's layers).

    1F1B keeps min(p, m) micro-batches in flight on the first stage; interleaving raises that to
    p (1 + (p - 1)/(p v)) (Korthikanti et al. 2022, Sec. 4.2.3). See ``stage_in_flight`` for every stage.
    """
    return stage_in_flight(np.zeros_like(pp), n_micro, pp, vpp)


def stage_in_flight(stage: Arr, n_micro: Arr, pp: Arr | float, vpp: Arr | float) -> Arr:
    """Micro-batches of activations pipeline rank ``stage`` holds at its peak, in units of its whole stage.

    1F1B (v = 1): warm-up p - r - 1 forwards, so min(p - r, m) micro-batches.
    Interleaved (v > 1; Megatron-Core ``get_pp_rank_microbatches``, micro-batch group p): warm-up
    2 (p - r - 1) + (v - 1) p chunk forwards (capped at all m v chunks), each chunk 1/v of the stage:
    min(2 (p - r - 1) + (v - 1) p + 1, m v) / v. On rank 0 that is p (1 + (p - 1)/(p v)) (Korthikanti), on the
    last rank p - (p - 1)/v: interleaving fills every rank, not only the first.
    """
    one_f_one_b = np.minimum(pp - stage, n_micro)
    chunks = 2.0 * (pp - stage - 1.0) + (vpp - 1.0) * pp + 1.0
    interleaved = np.minimum(chunks, n_micro * vpp) / vpp
    return np.where(vpp > 1, interleaved, one_f_one_b)
