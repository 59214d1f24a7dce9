"""Pruned uniform candidates (search/prune.py): merged memory rounds give the same candidates, bit for bit, as
round by round; a shared plan subset (sensitivity) is pruned like the space, in few model passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from madmax_opt.analysis.evaluator import Model
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.plan import PlanArrays
from madmax_opt.search import prune
from madmax_opt.search.solver import solve_records
from madmax_opt.studies.sensitivity import shared_plans, variant_problem

SEVENTY_B = {"model": "llama2-70b", "hardware": {"system": "dgx-h100", "gpus": 2048},
             "task": {"seq_len": 4096, "global_batch": 2048}}


def _candidates(model: Model, plans: PlanArrays | None, keep_best: int) -> tuple[dict[str, Any], dict[str, Any]]:
    kept, met = prune.space_candidates(model, keep_best, plans)
    t = met.terms
    cols = {k: v for k, v in kept.__dict__.items() if isinstance(v, np.ndarray)}
    terms = {"step": t.step_time_s, "memory": t.memory.total, "invalid": t.invalid,
             **{f"time.{k}": v for k, v in t.time.items()}}
    return cols, terms


def _passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    terms = Model.terms

    def counted(self: Model, plans: PlanArrays) -> Any:
        sizes.append(len(plans))
        return terms(self, plans)

    monkeypatch.setattr(Model, "terms", counted)
    return sizes


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("keep_best", [1, 3])
def test_merged_rounds_same_candidates_bitwise(monkeypatch: pytest.MonkeyPatch, subset: bool, keep_best: int) -> None:
    problem = problem_from_dict(SEVENTY_B)
    model = Model(problem)
    plans = shared_plans(problem) if subset else None
    merged = _candidates(model, plans, keep_best)
    monkeypatch.setattr(prune, "MERGE_PLANS", 0)  # one model pass per memory round
    alone = _candidates(model, plans, keep_best)
    for a, b in zip(merged, alone, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k  # same plans, same order, same bits


def test_shared_plans_pruned_in_few_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sensitivity passes the shared plans to the solver: they are pruned like the space (memory rounds merged into
    one pass, the vpp > 1 plans bounded), not all evaluated, and the optimum is the one of the whole space."""
    problem = problem_from_dict(SEVENTY_B)
    plans = shared_plans(problem)
    vp = variant_problem(problem, {"hbm_capacity": 0.5})
    sizes = _passes(monkeypatch)
    rec = solve_records(vp, plans=plans)[1][0]
    solve_passes = sizes[:-1]  # the last pass re-evaluates the returned plan (to_records)
    assert len(solve_passes) <= 2
    assert sum(solve_passes) < len(plans) // 2
    monkeypatch.undo()
    assert rec == solve_records(vp)[1][0]
