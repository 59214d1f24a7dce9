"""The exact numpy selection of the uniform and serving searches chooses the plans the CP-SAT selection chose
(``assemble.pick_best``, kept as the cross-check) and a brute-force sort chooses, ties and ranges included."""

from __future__ import annotations

import numpy as np
import pytest

from madmax_opt.core.errors import ProblemError
from madmax_opt.search.assemble import IntObjective, Limit, admissible_mask, brute_force, pick_best
from madmax_opt.search.cpsat import INT_LIMIT, CpSatOptions
from madmax_opt.search.selection import select_best


@pytest.mark.parametrize("seed", range(40))
def test_selection_equals_cpsat_and_brute_force_on_random_spaces(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    values = rng.integers(0, 8, n).astype(np.int64)  # few distinct values: many ties, broken by position
    group = rng.integers(0, 4, n).astype(np.int64)
    limits = [Limit(rng.integers(0, 10, n).astype(np.int64), int(rng.integers(3, 10)))]
    ok = admissible_mask(rng.random(n) < 0.7, limits)
    obj = IntObjective(values, "x", None)
    top_k = int(rng.integers(1, 6))
    new = select_best(obj, ok, group, top_k=top_k)
    old = pick_best(obj, ok, group, limits, cpsat=CpSatOptions(), top_k=top_k)
    if not ok.any():
        assert new is None and old is None
        return
    assert new is not None and old is not None
    assert new.top == old.top == brute_force(values, ok)[:top_k].tolist()
    assert new.objective == old.objective == int(values[ok].min())
    assert new.admissible == int(ok.sum())


def test_the_integer_range_refuses_the_same_problems() -> None:
    """Objective x n + position must stay below INT_LIMIT, n = each group's top-k kept (as pick_best had it): a
    best plan beyond it is refused naming the field; a worse one beyond it is never chosen."""
    limit = INT_LIMIT // 3  # two groups, top-1 each: n = 2
    obj = IntObjective(np.array([limit, limit + 5], dtype=np.int64), "the step time", "task.global_batch", "s", 1e6)
    with pytest.raises(ProblemError, match=r"the step time .*integer range.*task\.global_batch"):
        select_best(obj, np.ones(2, bool), np.array([0, 1]))
    obj = IntObjective(np.array([limit - 1, limit, 7], dtype=np.int64), "x", None)
    pick = select_best(obj, np.ones(3, bool), np.array([0, 1, 2]), top_k=3)  # n = 3: INT_LIMIT // 4, below both
    ref = pick_best(obj, np.ones(3, bool), np.array([0, 1, 2]), [], cpsat=CpSatOptions(), top_k=3)
    assert pick is not None and ref is not None and pick.top == ref.top == [2]
