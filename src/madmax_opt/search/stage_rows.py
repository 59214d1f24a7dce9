"""The candidate rows of one base of the uneven-stage search (``stages.py``): every (stage, layers, recompute,
hardware) with its rounded times, for the rows that fit in memory.

A row's layer costs depend on its recompute mode and hardware only, so ``training.layer_costs`` runs once per
(mode, hardware) and ``training.stage_costs`` broadcasts them over the axes [stage, layers, mode, hardware]: the
stage (first / last extras, activations in flight) and the layer count along their own axes. stage_costs is
elementwise, so every row is the same float as over fully expanded rows, at a fraction of the work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.model.pipeline import stage_in_flight
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import min_stage_layers
from madmax_opt.model.training import layer_costs, stage_costs
from madmax_opt.search.stage_bounds import take_lc


def candidates(
    model: Model, base: PlanArrays, modes: list[int], hw_choices: list[int] | None = None
) -> dict[str, NDArray[np.float64]]:
    """All (stage, layers, recompute, hardware) rows for one base with rounded times, fitting in memory, in the
    order of the axes [stage, layers, recompute, hardware]."""
    p = int(base.pp[0])
    layers = model.workload.layers
    hws = np.array(hw_choices if hw_choices is not None else [int(base.hw[0])])
    grid = (p, layers - p + 1, len(modes), len(hws))
    r, w = (a.ravel() for a in np.meshgrid(np.array(modes), hws, indexing="ij"))
    per_rw = base.take(np.zeros(len(r), dtype=np.int64))  # one layer_costs row per (mode, hardware)
    per_rw = PlanArrays(**{**per_rw.__dict__, "recompute": r.astype(np.int64), "hw": w.astype(np.int64)})
    pr = model.problem
    lc = take_lc(layer_costs(model.workload, pr.training_task, pr.stack, model.table, per_rw),
                 np.arange(len(r)).reshape(1, 1, len(modes), len(hws)))
    sf = np.arange(p, dtype=np.float64)[:, None, None, None]
    n = np.arange(1, layers - p + 2, dtype=np.float64)[None, :, None, None]
    sc = stage_costs(
        lc,
        pr.stack,
        model.table.hbm_bw[lc.plans.hw],
        n,
        (sf == 0) * 1.0,
        (sf == p - 1) * 1.0,
        stage_in_flight(sf, lc.n_micro, float(p), float(base.vpp[0])),
    )

    def full(values: NDArray[Any]) -> NDArray[Any]:
        return np.broadcast_to(values, grid).ravel()

    capacity = model.table.hbm_bytes[lc.plans.hw] * (1.0 - pr.stack.memory_reserve_fraction)
    s = full(np.arange(p)[:, None, None, None])
    fewest = np.array([min_stage_layers(int(i), p, int(base.vpp[0])) for i in range(p)])  # a layer per chunk
    fits = full(sc.memory.total <= capacity) & (full(n) >= fewest[s])
    t_us = np.rint(full(sc.per_micro_batch_s) * US)  # rounded once per candidate
    return {
        "stage": s[fits],
        "layers": full(n.astype(np.int64))[fits],
        "recompute": full(lc.plans.recompute)[fits],
        "hw": full(lc.plans.hw)[fits],
        "t_us": t_us[fits],
        "dp_us": np.rint(full(sc.dp_exposed_s) * US)[fits],
        "opt_us": np.rint(full(sc.optimizer_s) * US)[fits],
        "n_micro": lc.n_micro.ravel()[:1],
    }


def rounding_us(n_micro: float, pp: int) -> float:
    """How far the rows' rounding (each time to 1 us) can move a plan's step time, us: each stage time enters
    m + (p - 1) times, the DP sync and the optimizer once, each off by at most 0.5 us."""
    return (n_micro + pp + 2) * 0.5
