"""Exact selection of the best enumerated plans, in numpy: what the uniform and serving searches run.

Those searches price and filter every plan of the space with the vectorised model, so what is left is a choice
among candidates that already meet every limit: the ``top_k`` smallest integer objectives, ties broken by
enumeration order (the same order ``assemble.brute_force`` defines). A sort proves that optimum; a CP-SAT model
over the same candidates (``assemble.pick_best``, kept as the cross-check of ``bench-solver``) proves nothing
more and costs the OR-Tools import (0.7 s with pandas) on every solve. CP-SAT runs where it models something:
uneven and mixed stages (search/stages.py), DLRM table placement and fleet allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import IntArr
from madmax_opt.search.assemble import IntObjective
from madmax_opt.search.cpsat import INT_LIMIT, check_range

METHOD = "enumeration"  # the solve summary's ``method`` for these searches (CP-SAT searches: "cp-sat")
UNEVEN_DP = "dynamic-programme"  # ``method`` of an uneven-stage search that needed no CP-SAT model (stages.py)


@dataclass(frozen=True)
class Selection:
    """The chosen candidates, best first, with the best objective (integer units) and how many were admissible."""

    top: list[int]
    objective: int
    admissible: int


def select_best(objective: IntObjective, ok: NDArray[np.bool_], group: IntArr, *, top_k: int = 1,
                file: str | None = None) -> Selection | None:
    """The ``top_k`` admissible candidates with the smallest objective, ties by position; None when none is admissible.

    The integer range is the one the solver has always applied (``pick_best``: objective x n + position below
    ``INT_LIMIT``, n = the ``top_k`` best of each ``group``), so the same problems are refused: ProblemError names
    the quantity and the field that drives it when the best objective is beyond it; worse candidates beyond it are
    never chosen."""
    values = objective.values
    idx = np.flatnonzero(ok)
    if not len(idx):
        return None
    vals = values[idx]
    best = int(vals.min())
    n = int(np.minimum(np.unique(group[idx], return_counts=True)[1], top_k).sum())
    limit = INT_LIMIT // (n + 1)
    check_range(float(best), limit, objective.quantity, field=objective.field, file=file, unit=objective.unit,
                scale=objective.per_unit)
    keep = vals < limit
    idx, vals = idx[keep], vals[keep]
    if len(idx) > top_k:  # only candidates up to the k-th smallest value can be in the top k (exact)
        kth = np.partition(vals, top_k - 1)[top_k - 1]
        near = vals <= kth
        idx, vals = idx[near], vals[near]
    order = idx[np.lexsort((idx, vals))][:top_k]
    return Selection([int(i) for i in order], best, int(ok.sum()))


__all__ = ["METHOD", "UNEVEN_DP", "Selection", "select_best"]
