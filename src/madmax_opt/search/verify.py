"""``madmax-opt verify``: the solver's optimum against brute force over the same space, by the problem's family
(search/family.py; the training and steady-serving checks are search/brute_force.py, online serving's
search/online.py; recommenders have none)."""

from __future__ import annotations

from typing import Any

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.problem import Problem
from madmax_opt.search.cpsat import CpSatOptions


def verify_problem(problem: Problem, time_limit_s: float = 60.0, cpsat: CpSatOptions | None = None) -> dict[str, Any]:
    """Solver optimum vs brute-force optimum on the same rounded integer objective, by the problem's family
    (search/family.py; recommenders have no verify)."""
    from madmax_opt.search.family import SearchOptions, family_of

    verify = family_of(problem).verify
    if verify is None:
        raise ProblemError(f"verify does not apply to {family_of(problem).label} problems", file=problem.source)
    return verify(problem, SearchOptions(time_limit_s=time_limit_s, cpsat=cpsat))
