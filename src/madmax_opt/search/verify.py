"""Brute-force verification: enumerate the whole space with the evaluator and compare with the solver."""

from __future__ import annotations

import time
from typing import Any

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.io.problem import Problem
from madmax_opt.search.solver import brute_force_order, candidates, solve


def verify_problem(problem: Problem, time_limit_s: float = 60.0) -> dict[str, Any]:
    """Solver optimum vs brute-force optimum on the same rounded integer objective (and the float one)."""
    model = Model(problem)
    t0 = time.perf_counter()
    c = candidates(model)
    order = brute_force_order(model, c, problem.objective)
    brute_s = time.perf_counter() - t0
    try:
        outcome = solve(problem, model=model, time_limit_s=time_limit_s, plans=c.plans)
    except InfeasibleError as exc:
        return {"agree": len(order) == 0, "solver": f"infeasible: {exc}", "brute_force": len(order), "space": len(c.plans)}
    obj = c.objective(problem.objective)
    best_bf = int(order[0])
    best_sv = outcome.top[0]
    return {
        "agree": int(obj[best_sv]) <= int(obj[best_bf]),
        "space": len(c.plans),
        "admissible": len(order),
        "solver_status": outcome.status,
        "solver_objective": int(obj[best_sv]),
        "brute_force_objective": int(obj[best_bf]),
        "solver_plan": c.plans.plan(best_sv).model_dump(),
        "brute_force_plan": c.plans.plan(best_bf).model_dump(),
        "solver_step_time_s": float(c.met.step_time_s[best_sv]),
        "brute_force_step_time_s": float(c.met.step_time_s[best_bf]),
        "solver_wall_s": outcome.wall_s,
        "brute_force_wall_s": brute_s,
    }
