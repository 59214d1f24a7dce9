"""Co-design at catalog scale (search/prune.best_candidates): the space streamed a batch of hardware options at a
time, vpp > 1 plans built only where the vpp bound lets them through, and only every option's top plans kept.
The answer must be the one of the whole pruned space (``space_candidates``, the previous implementation) bit for
bit, and the optimum that of brute force over the whole space."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.analysis.evaluator import Model
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.plan import PlanArrays
from madmax_opt.search import prune
from madmax_opt.search.prune import enumeration_order, space_candidates
from madmax_opt.search.solver import Candidates, brute_force_order, candidates, solve
from madmax_opt.search.space import enumerate_plans
from strategies import small_hardware, small_models

SYSTEMS = ("dgx-a100", "dgx-h100", "gb200-nvl72", "mi300x-platform", "l40s-server")
CATALOG_SLICE = {
    "model": "llama2-7b",
    "hardware": [{"system": s, "gpus": [8, 32]} for s in SYSTEMS],
    "task": {"seq_len": 4096, "global_batch": 64},
}


def _rows(plans: PlanArrays, index: list[int]) -> list[tuple[int, ...]]:
    cols = [plans.hw, plans.dp, plans.tp, plans.pp, plans.cp, plans.vpp, plans.mbs, plans.zero, plans.recompute,
            plans.sp, plans.ep]
    return [tuple(int(c[i]) for c in cols) for i in index]


def _same_answer(data: dict[str, Any], k: int) -> None:
    """Streamed top-k (plans, objective, bound, model size) == the previous implementation's on the whole pruned
    space; optimum == brute force over the whole space."""
    problem = problem_from_dict(data)
    model = Model(problem)
    old_c = Candidates(*space_candidates(model, k))
    if not len(brute_force_order(model, old_c, problem.objective)):
        return
    old = solve(problem, model=model, plans=old_c.plans, top_k=k)  # pick_best on every pruned candidate
    new = solve(problem, model=model, top_k=k)
    assert _rows(new.candidates.plans, new.top) == _rows(old_c.plans, old.top)
    assert (new.objective, new.best_bound, new.model_size, new.status) == (
        old.objective, old.best_bound, old.model_size, old.status)
    full = candidates(model, enumerate_plans(problem))
    best = brute_force_order(model, full, problem.objective)[0]
    assert new.objective == int(full.objective(problem.objective)[best])
    assert new.candidates.evaluated is not None and new.candidates.evaluated <= len(full.plans)


@pytest.mark.parametrize("batch", [1, 1 << 17])  # every option its own batch; all options in one
@pytest.mark.parametrize(("objective", "constraints", "k"), [
    ("throughput", {}, 3),
    ("cost", {"max_cost_per_hour": 200.0}, 2),
    ("energy", {"max_gpus": 16}, 1),
])
def test_streamed_top_k_equals_whole_space(monkeypatch: pytest.MonkeyPatch, batch: int, objective: str,
                                           constraints: dict[str, Any], k: int) -> None:
    monkeypatch.setattr(prune, "BATCH_PLANS", batch)
    _same_answer({**CATALOG_SLICE, "objective": objective, "constraints": constraints}, k)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(model=small_models([4, 6, 8, 12, 16]), hardware=small_hardware(3), k=st.sampled_from([1, 3]),
       batch=st.sampled_from([1, 50, 1 << 17]), objective=st.sampled_from(["throughput", "cost"]),
       vpp=st.sampled_from([None, [1, 2], [2]]), flash=st.booleans())
def test_streamed_top_k_on_random_problems(model: Any, hardware: Any, k: int, batch: int, objective: str,
                                           vpp: list[int] | None, flash: bool) -> None:
    space = {"cp": [1, 2]} | ({"vpp": vpp} if vpp else {})
    data = {"model": model, "hardware": hardware, "task": {"seq_len": 1024, "global_batch": 32},
            "stack": {"flash_attention": flash}, "space": space, "objective": objective}
    old_batch = prune.BATCH_PLANS
    prune.BATCH_PLANS = batch
    try:
        _same_answer(data, k)
    finally:
        prune.BATCH_PLANS = old_batch


def test_enumeration_order_is_lexicographic() -> None:
    """``enumerate_plans`` order = by option, then (tp, pp, cp, vpp, mbs, zero, recompute, sp, ep), also with the
    no-op rewrites (sp at tp 1, ZeRO at dp x cp 1) and restricted knobs: the key that merges streamed batches."""
    for space in ({}, {"sp": True, "zero": [1, 3]}, {"vpp": [2, 1, 4], "recompute": ["full", "none"]}):
        plans = enumerate_plans(problem_from_dict({**CATALOG_SLICE, "space": space}))
        assert np.array_equal(enumeration_order(plans, np.zeros(len(plans), dtype=np.int64)),
                              np.arange(len(plans)))


def test_vpp_siblings_rebuild_the_space() -> None:
    """The vpp = 1 plans and all their vpp > 1 siblings are exactly the default space (so building siblings only
    where the bound allows evaluates the plans ``space_candidates`` evaluates)."""
    problem = problem_from_dict(CATALOG_SLICE)
    one = enumerate_plans(problem, vpp_one=True)
    assert np.all(one.vpp == 1)
    more = prune._siblings(one, np.flatnonzero(one.pp > 1), problem.model.layers)
    every = PlanArrays.concat([one, more])
    every = every.take(enumeration_order(every, np.zeros(len(every), dtype=np.int64)))
    whole = enumerate_plans(problem)
    assert _rows(every, list(range(len(every)))) == _rows(whole, list(range(len(whole))))


def test_infeasible_still_names_the_constraint() -> None:
    """No admissible plan: the explanation comes from the whole pruned space, not from the (empty) kept top."""
    from madmax_opt.core.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match=r"max_cost_per_hour=1\.0"):
        solve(problem_from_dict({**CATALOG_SLICE, "constraints": {"max_cost_per_hour": 1.0}}))
