"""A lower bound on the step time (so on every objective) of the valid plans of a hardware option, unenumerated.

Every compute pass of a layer runs at most at the GPU's measured executed-FLOP ceiling (``ops.layer_ops``, the
"utilisation ceiling" rows: fwd + bwd-input + bwd-weight + recompute of a trainable layer take at least their FLOPs /
(peak x ceiling), fwd + bwd-input + recompute of a frozen one likewise). Every other step term is non-negative and
the bottleneck stage holds layers / pp layers, so a valid plan's step time is at least

    m x (L / pp) x F_layer x (mbs s / cp) / tp / (peak x ceiling) = B s L F_layer / (GPUs x peak x ceiling)

(m = B / (dp mbs) micro-batches, dp tp pp cp = GPUs), with F_layer = 3 x (weight-GEMM + attention FLOPs per token)
when every layer trains and 2 x weight-GEMM + 3 x attention FLOPs otherwise (routed-expert and recomputed FLOPs
left out: the bound only gets looser). Each of the step's terms is rounded once to 1 us, and every objective is
nondecreasing in the rounded step time at fixed hardware (``model/objectives.py``: proportional to it), so the
objective at the bound, rounded the same way (``solver.objective_floor``), bounds every admissible plan of the option
from below. ``prune.best_candidates`` skips an option whose bound exceeds what it could still change (exact).
"""

from __future__ import annotations

import numpy as np

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import US
from madmax_opt.model.compute import utilization_ceiling
from madmax_opt.model.training import STEP_TERMS
from madmax_opt.search.cpsat import INT_LIMIT

FLOAT_SLACK = 1e-9  # relative: far above the rounding of the float sums the bound is compared with


def step_floor_us(model: Model) -> IntArr:
    """Per hardware option, an integer no valid plan's rounded step time (``solver.Candidates.step_us``) is below."""
    wl, task = model.workload, model.problem.training_task
    gemm = float(sum(g.flops_per_token for g in wl.gemms))
    attn = float(wl.attn_flops_per_token)
    per_token_layer = (3.0 if wl.frozen_layers == 0 else 2.0) * gemm + 3.0 * attn  # FLOPs of one layer per token
    table = model.table
    peak = table.peak_flops(task.precision)
    ceiling = np.array([utilization_ceiling(o.gpu.name, task.precision).hfu for o in table.options])
    flops = float(task.global_batch) * float(wl.seq_len) * float(wl.layers) * per_token_layer
    with np.errstate(divide="ignore", invalid="ignore"):
        step_s = flops / (table.gpus * peak * ceiling)  # B s L F_layer / (GPUs x peak x ceiling)
    step_s = np.where(np.isfinite(step_s) & (step_s > 0), step_s, 0.0)
    # each of the len(STEP_TERMS) terms rounds by at most 0.5 us; saturated like the step (Candidates.step_us)
    floor_us = np.floor(step_s * US * (1.0 - FLOAT_SLACK)) - len(STEP_TERMS)
    return np.minimum(np.maximum(floor_us, 0.0), float(INT_LIMIT)).astype(np.int64)


__all__ = ["step_floor_us"]
