"""Brute-force verification of the training and steady-serving searches (search/family.py calls these):
enumerate the whole uniform space with the exact model and compare with the solver.

Training and serving problems alike: the brute force sorts every admissible candidate by the problem's objective
(the registry's integer column, model/objectives.py) and enumeration order, which is what CP-SAT must return.
Uneven / mixed pipeline stages are not enumerable (10^25 splits), so ``verify`` covers the uniform space.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from madmax_opt.core.errors import InfeasibleError
from madmax_opt.model.problem import Problem
from madmax_opt.search.cpsat import options as cpsat_options

if TYPE_CHECKING:
    from madmax_opt.search.solves import SearchOptions


def verify_training(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    """Training: the whole uniform space enumerated against the solver's own (pruned) space."""
    from madmax_opt.analysis.evaluator import Model
    from madmax_opt.search.solver import brute_force_order, candidates, solve
    from madmax_opt.search.space import enumerate_plans

    opts = cpsat_options(o.cpsat, time_limit_s=o.time_limit_s)
    model = Model(problem)
    t0 = time.perf_counter()
    c = candidates(model, enumerate_plans(problem))  # the whole space, no pruning
    order = brute_force_order(model, c, problem.objective)
    brute_s = time.perf_counter() - t0
    try:
        outcome = solve(problem, model=model, cpsat=opts)  # the solver's own (pruned) space
    except InfeasibleError as exc:
        return {"agree": len(order) == 0, "solver": f"infeasible: {exc}", "brute_force": len(order),
                "space": len(c.plans)}
    obj = c.objective(problem.objective)
    best_bf = int(order[0])
    sv = outcome.candidates
    best_sv = outcome.top[0]
    sv_obj = int(sv.objective(problem.objective)[best_sv])
    uneven = problem.space.uneven_stages  # stage splits (10^23 per base) are not enumerable: say what was checked
    return {
        "agree": sv_obj <= int(obj[best_bf]),
        "scope": "uniform plans only; uneven and mixed stage splits are not enumerated (solve may return one)"
        if uneven else "every uniform plan of the space",
        "objective": problem.objective,
        "space": len(c.plans),
        "solver_candidates": len(sv.plans),
        "admissible": len(order),
        "solver_status": outcome.status,
        "solver_objective": sv_obj,
        "brute_force_objective": int(obj[best_bf]),
        "solver_plan": sv.plans.plan(best_sv).model_dump(),
        "brute_force_plan": c.plans.plan(best_bf).model_dump(),
        "solver_step_time_s": float(sv.met.step_time_s[best_sv]),
        "brute_force_step_time_s": float(c.met.step_time_s[best_bf]),
        "solver_wall_s": outcome.wall_s,
        "brute_force_wall_s": brute_s,
    }


def verify_steady_serving(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    """Steady-state serving: every candidate of the serving space against the solver."""
    from madmax_opt.search.serving import (
        ServingModel,
        brute_force_order,
        candidates,
        plan_dict,
        solve_serving,
    )

    opts = cpsat_options(o.cpsat, time_limit_s=o.time_limit_s)
    model = ServingModel(problem)
    t0 = time.perf_counter()
    c = candidates(model)
    order = brute_force_order(model, c, problem.objective)
    brute_s = time.perf_counter() - t0
    try:
        outcome = solve_serving(problem, model=model, cpsat=opts, plans=c.plans)
    except InfeasibleError as exc:
        return {"agree": len(order) == 0, "solver": f"infeasible: {exc}", "brute_force": len(order),
                "space": len(c.plans)}
    obj = c.objective(problem.objective)
    best_bf, best_sv = int(order[0]), outcome.top[0]
    return {
        "agree": int(obj[best_sv]) <= int(obj[best_bf]),
        "objective": problem.objective,
        "space": len(c.plans),
        "admissible": len(order),
        "solver_status": outcome.status,
        "solver_objective": int(obj[best_sv]),
        "brute_force_objective": int(obj[best_bf]),
        "solver_plan": plan_dict(model, c, best_sv),
        "brute_force_plan": plan_dict(model, c, best_bf),
        "solver_wall_s": outcome.wall_s,
        "brute_force_wall_s": brute_s,
    }
