"""Options skipped whole by their objective floor (search/option_bound.py, solver.objective_floor,
prune.best_candidates): the floor is a true lower bound of every valid plan of its option (brute force over whole
spaces), and skipping changes neither the top-k nor any system's best plan (what ``solve`` reports per system with
several)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.analysis.evaluator import Model
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search import prune
from madmax_opt.search.option_bound import step_floor_us
from madmax_opt.search.selection import select_best
from madmax_opt.search.solver import Candidates, admissible, brute_force_order, candidates, objective_floor
from madmax_opt.search.space import enumerate_plans
from strategies import small_hardware, small_models

OBJECTIVES = ("throughput", "cost", "energy", "time_to_train")
SYSTEMS = ("dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72", "mi300x-platform", "l40s-server", "dgx-v100")
TASK = {"seq_len": 2048, "global_batch": 64, "train_tokens": 1.0e10}
CASES: dict[str, dict[str, Any]] = {
    "pretrain": {"model": "llama2-7b", "hardware": [{"system": s, "gpus": [8, 32]} for s in SYSTEMS], "task": TASK},
    "frozen layers": {"model": "llama2-7b", "hardware": [{"system": s, "gpus": [8]} for s in SYSTEMS[:4]],
                      "task": {**TASK, "kind": "finetune", "frozen_layers": 20}},
    "lora": {"model": "llama2-7b", "hardware": [{"system": s, "gpus": [8]} for s in SYSTEMS[:4]],
             "task": {**TASK, "kind": "finetune", "lora_rank": 16}},
    "fp8": {"model": "llama2-7b", "hardware": [{"system": s, "gpus": [8, 16]} for s in ("dgx-h100", "dgx-b200")],
            "task": {**TASK, "precision": "fp8"}},
    "moe": {"model": "mixtral-8x7b", "hardware": [{"system": s, "gpus": [16]} for s in ("dgx-h100", "dgx-b200")],
            "task": TASK, "space": {"ep": [1, 2, 4]}},
}


def _check_floor(data: dict[str, Any]) -> None:
    """Every valid plan of the whole space: rounded step >= the step floor, each objective >= its floor."""
    problem = problem_from_dict(data)
    model = Model(problem)
    full = candidates(model, enumerate_plans(problem))
    valid = full.met.terms.invalid == 0
    hw = full.plans.hw[valid]
    step_floor = step_floor_us(model)
    assert np.all(full.step_us[valid] >= step_floor[hw])
    assert np.all(step_floor > 0)
    for kind in OBJECTIVES:
        assert np.all(full.objective(kind)[valid] >= objective_floor(model, kind)[hw]), kind


@pytest.mark.parametrize("case", list(CASES))
def test_floor_bounds_every_valid_plan(case: str) -> None:
    _check_floor(CASES[case])


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(model=small_models([4, 8, 12]), hardware=small_hardware(3), flash=st.booleans(),
       recompute=st.sampled_from([None, ["full"], ["selective", "none"]]))
def test_floor_bounds_random_problems(model: Any, hardware: Any, flash: bool, recompute: list[str] | None) -> None:
    space = {"cp": [1, 2]} | ({"recompute": recompute} if recompute else {})
    _check_floor({"model": model, "hardware": hardware, "task": {"seq_len": 1024, "global_batch": 32, "train_tokens": 1.0e9},
                  "stack": {"flash_attention": flash}, "space": space})


def _answers(model: Model, c: Candidates, k: int) -> tuple[list[tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The top-k plans and each system's best plan (first in brute-force order, as ``solves.compare_systems``)."""
    objective = model.problem.objective
    pick = select_best(c.int_objective(objective), admissible(model, c), c.plans.hw, top_k=k)
    assert pick is not None

    def row(i: int) -> tuple[int, ...]:
        p = c.plans
        return tuple(int(x[i]) for x in (p.hw, p.dp, p.tp, p.pp, p.cp, p.vpp, p.mbs, p.zero, p.recompute, p.sp))

    names = [o.system.name for o in model.problem.hardware]
    best: dict[str, tuple[int, ...]] = {}
    for i in brute_force_order(model, c, objective).tolist():
        best.setdefault(names[int(c.plans.hw[i])], row(i))
    return [row(i) for i in pick.top], best


@pytest.mark.parametrize("batch", [1, 2000, 1 << 17])  # every option alone; a few together; all in one
@pytest.mark.parametrize(("objective", "constraints", "k"), [
    ("throughput", {}, 1),
    ("throughput", {"max_gpus": 16}, 3),
    ("cost", {"max_cost_per_hour": 200.0}, 2),
    ("energy", {}, 1),
    ("time_to_train", {"budget_usd": 1.0e6}, 2),
])
def test_skipping_keeps_top_and_each_system_best(monkeypatch: pytest.MonkeyPatch, batch: int, objective: str,
                                                 constraints: dict[str, Any], k: int) -> None:
    monkeypatch.setattr(prune, "BATCH_PLANS", batch)
    data = {**CASES["pretrain"], "hardware": [{"system": s, "gpus": [8, 16, 32]} for s in SYSTEMS],
            "objective": objective, "constraints": constraints}
    problem = problem_from_dict(data)
    model = Model(problem)

    def score(p: Any, met: Any) -> Any:
        c = Candidates(p, met)
        return c.objective(objective), admissible(model, c)

    every = Candidates(*prune.best_candidates(model, k, score))
    skipped = Candidates(*prune.best_candidates(model, k, score, objective_floor(model, objective)))
    assert _answers(model, skipped, k) == _answers(model, every, k)
    assert skipped.evaluated is not None and every.evaluated is not None
    if objective == "throughput" and not constraints and batch < 1 << 17:  # over several batches, the floor
        # (growing as the cluster shrinks) leaves options unread
        assert len(np.unique(skipped.plans.hw)) < len(np.unique(every.plans.hw))
        assert skipped.evaluated < every.evaluated
