"""Naming the constraint that excludes every uneven / mixed pipeline (search/stage_limits.py), with the best value an
uneven plan reaches without the constraints (exit 3 via InfeasibleError in search/solver.py)."""

from __future__ import annotations

import numpy as np

from madmax_opt.analysis.evaluator import Model, staged_record
from madmax_opt.core.units import US
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.stage_limits import StepLimits, binding
from madmax_opt.search.stages import UnevenResult, _bases, solve_uneven, stage_hardware


def explain_uneven(
    model: Model, limits: StepLimits, time_limit_s: float, cpsat: CpSatOptions | None = None
) -> str | None:
    """When no uneven plan meets ``limits``: the constraint that binds, named with the fastest uneven plan (against
    the throughput floor) and the cheapest run (against the budget), each found by the uneven search without the
    limits; None when no uneven plan exists at all (another rule binds)."""
    best: dict[str, UnevenResult] = {}
    for objective, wanted in (("throughput", limits.max_step_us), ("cost", limits.budget_usd)):
        if wanted is not None:
            best[objective] = solve_uneven(model, np.inf, time_limit_s, objective=objective, cpsat=cpsat)
    if any(r.plan is None or r.step_us is None for r in best.values()):
        return None
    bases = _bases(model)
    if len(bases) == 0:
        return None
    price = model.table.price_per_gpu_hour  # mixed: the cheapest system any stage may use, on every stage
    per_gpu = price[stage_hardware(model, bases.take([0]))].min() if model.problem.space.mixed_stages else \
        price[bases.hw]
    least = float(np.min(bases.gpus * per_gpu))
    fastest = best.get("throughput")
    cheapest_usd = None
    if "cost" in best:
        r = best["cost"]
        assert r.plan is not None and r.step_us is not None
        cheapest_usd = limits.run_usd(r.step_us / US, float(staged_record(model, r.plan)["cost_per_hour_usd"]))
    return binding(limits, None if fastest is None or fastest.step_us is None else fastest.step_us / US, cheapest_usd,
                   int(bases.gpus.min()), least)
