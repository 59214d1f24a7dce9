"""Mixed stages (search/stages.py): how many stages each system's supply holds, and the stage counts per system
(compositions) with the objective's rate of each, cheapest first: at fixed hardware every objective is rate x step
time, and in mixed mode the rate depends on how many stages each system gets (cost, energy).
"""

from __future__ import annotations

import itertools

import numpy as np

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.model.groups import Groups
from madmax_opt.model.objectives import Rates
from madmax_opt.model.plan import PlanArrays
from madmax_opt.search.objectives import rate_per_second, training_units

Composition = tuple[dict[int, int] | None, float]  # stages per hardware choice (None: not fixed), rate


def stage_supply(model: Model, base: PlanArrays, hw_choices: list[int]) -> list[tuple[list[int], int]]:
    """Per GPU type with a supply: (its hardware choices, how many stages of dp*tp*cp GPUs the supply holds)."""
    if not model.problem.space.mixed_stages:
        return []
    per_stage = int(Groups.of(base).stage[0])
    out = []
    hw_by_gpu: dict[str, list[int]] = {}
    for hw in hw_choices:
        hw_by_gpu.setdefault(model.problem.hardware[hw].gpu.name, []).append(hw)
    for gpu, hws in hw_by_gpu.items():
        limits = [o.supply for o in model.problem.hardware if o.gpu.name == gpu and o.supply is not None]
        if limits:
            out.append((hws, min(limits) // per_stage))
    return out


def compositions(
    model: Model, base: PlanArrays, hws: list[int], supply: list[tuple[list[int], int]], objective: str,
    priced: bool = False,
) -> list[Composition]:
    """(stages per hardware choice, objective units per us of step time), cheapest rate first. A single entry with
    no fixed counts when the rate does not depend on where the stages run (one option, or time objectives) and,
    when ``priced`` (a budget), neither does the $/h."""
    pr = model.problem
    p, per_stage = int(base.pp[0]), int(Groups.of(base).stage[0])
    tokens = pr.training_task.global_batch * model.workload.seq_len
    unit = training_units(objective, float(tokens))
    systems = tuple(pr.hardware[h].system for h in hws)
    combos = [np.bincount(np.array(c, dtype=np.int64), minlength=len(hws))
              for c in itertools.combinations_with_replacement(range(len(hws)), p)]
    combos = [k for k in combos if all(sum(int(k[hws.index(h)]) for h in group) <= allowed for group, allowed in supply)]
    if not combos:
        return []
    k = np.array(combos, dtype=np.float64)
    on = per_stage * k  # GPUs on each hardware choice
    rates = Rates(np.full(len(k), 1.0 / tokens), systems,
                  tuple((np.full(len(k), j), on[:, j]) for j in range(len(hws))), pr.training_task.train_tokens)
    per_us = rate_per_second(objective, rates, unit) / US
    price = [s.price_per_gpu_hour for s in systems]
    if len(hws) == 1 or (np.all(per_us == per_us[0]) and not (priced and any(x != price[0] for x in price))):
        return [(None, float(per_us[0]))]
    order = np.lexsort((np.arange(len(k)), per_us))
    return [({h: int(combos[i][j]) for j, h in enumerate(hws)}, float(per_us[i])) for i in order]
