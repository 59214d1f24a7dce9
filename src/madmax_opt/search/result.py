"""The result of a solve as users see it (``madmax-opt solve --json``, sweep rows): status, best and top-k
records, solver summary, baseline and speedup, by the problem's family (search/family.py; the transformer
families' solves are search/solves.py)."""

from __future__ import annotations

from typing import Any

from madmax_opt.model.problem import DLRMProblem, Problem
from madmax_opt.search.cpsat import CpSatOptions


def solve_result(
    problem: Problem | DLRMProblem, top_k: int, time_limit: float, workers: int, cpsat: CpSatOptions | None = None,
    robust: bool = False,
) -> dict[str, Any]:
    """The JSON object of ``solve --json``, from the problem's family (search/family.py); training results carry
    ``robust`` (search/robust.py), and with ``robust`` their best is the candidate with the best worst case within
    the error bars."""
    from madmax_opt.search.family import SearchOptions, family_of

    return family_of(problem).solve(problem, SearchOptions(top_k, time_limit, workers, cpsat, robust))
