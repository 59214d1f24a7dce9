"""Solver optimality against brute-force enumeration on random small problems (fixed seed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.analysis.evaluator import Model, to_records
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.solver import ROUNDING_TOLERANCE_S, brute_force_order, candidates, solve, solve_records
from strategies import small_hardware, small_models


@st.composite
def small_problems(draw: Any) -> dict[str, Any]:
    model = draw(small_models([4, 6, 8, 12, 16]))
    hardware = draw(small_hardware(3))
    space: dict[str, Any] = {
        "cp": draw(st.sampled_from([1, [1, 2]])),
        "mbs": draw(st.sampled_from([[1, 2], [1, 2, 4]])),
    }
    if draw(st.booleans()):
        space["recompute"] = draw(st.sampled_from([["none", "full"], "full", ["none", "selective", "full"]]))
    constraints: dict[str, Any] = {}
    if draw(st.booleans()):
        constraints["max_gpus"] = draw(st.sampled_from([4, 8, 16]))
    if draw(st.booleans()):
        constraints["max_cost_per_hour"] = draw(st.sampled_from([20.0, 60.0, 200.0]))
    return {
        "model": model,
        "hardware": hardware,
        "task": {
            "seq_len": draw(st.sampled_from([512, 1024, 2048])),
            "global_batch": draw(st.sampled_from([16, 32, 64])),
        },
        "stack": {"flash_attention": draw(st.booleans())},
        "space": space,
        "objective": draw(st.sampled_from(["throughput", "cost"])),
        "constraints": constraints,
    }


@settings(max_examples=240, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=small_problems(), k=st.sampled_from([1, 3]))
def test_solver_matches_brute_force(data: dict[str, Any], k: int) -> None:
    problem = problem_from_dict(data)
    model = Model(problem)
    c = candidates(model)
    order = brute_force_order(model, c, problem.objective)
    if len(order) == 0:
        with pytest.raises(InfeasibleError):
            solve(problem, model=model, plans=c.plans)
        return
    out = solve(problem, model=model, plans=c.plans, top_k=k)
    obj = c.objective(problem.objective)
    assert out.status == "optimal"
    # exact on the rounded integers: the optimum and the k best objective values equal brute force's
    assert out.objective == int(obj[order[0]])
    assert [int(obj[i]) for i in out.top] == [int(obj[i]) for i in order[:k]]
    assert out.top == [int(i) for i in order[:k]]  # ties break by enumeration order, as in brute force
    assert len(set(out.top)) == len(out.top)
    # every returned plan is valid for the float evaluator and within the rounding tolerance of brute force
    recs = to_records(model, c.plans.take(out.top))
    assert all(r["feasible"] for r in recs)
    if problem.objective == "throughput":
        assert recs[0]["step_time_s"] <= c.met.step_time_s[order[0]] + ROUNDING_TOLERANCE_S


def test_top_k_and_determinism() -> None:
    data = {
        "model": "llama2-7b",
        "hardware": {"system": "dgx-h100", "gpus": [16, 32]},
        "task": {"seq_len": 4096, "global_batch": 256},
    }
    problem = problem_from_dict(data)
    o1, r1 = solve_records(problem, top_k=5)
    _o2, r2 = solve_records(problem_from_dict(data), top_k=5)
    assert [r["plan"] for r in r1] == [r["plan"] for r in r2]
    steps = [r["step_time_s"] for r in r1]
    assert steps == sorted(steps)
    assert o1.status == "optimal"


def test_constraints_bind() -> None:
    base = {
        "model": "llama2-7b",
        "hardware": {"system": "dgx-h100", "gpus": [8, 16, 32, 64]},
        "task": {"seq_len": 4096, "global_batch": 256},
    }
    _, free = solve_records(problem_from_dict(base))
    assert free[0]["hardware"]["gpus"] == 64  # throughput grows with GPUs here
    capped = dict(base, constraints={"max_gpus": 16})
    _, rec = solve_records(problem_from_dict(capped))
    assert rec[0]["hardware"]["gpus"] == 16
    budget = dict(base, constraints={"max_cost_per_hour": 100.0})  # 16 x 4.92 = 78.7 $/h fits, 32 GPUs do not
    _, rec = solve_records(problem_from_dict(budget))
    assert rec[0]["cost_per_hour_usd"] <= 100.0 and rec[0]["hardware"]["gpus"] == 16
    too_fast = dict(base, constraints={"min_throughput": 1e9})
    with pytest.raises(InfeasibleError, match="min_throughput"):
        solve_records(problem_from_dict(too_fast))


def test_cost_objective_prefers_cheaper_per_token() -> None:
    data = {
        "model": "llama2-7b",
        "hardware": [{"system": "dgx-h100", "gpus": [8, 64]}, {"system": "dgx-a100", "gpus": [8, 64]}],
        "task": {"seq_len": 4096, "global_batch": 256},
        "objective": "cost",
    }
    problem = problem_from_dict(data)
    model = Model(problem)
    c = candidates(model)
    order = brute_force_order(model, c, "cost")
    _, rec = solve_records(problem)
    usd = c.met.usd_per_million_tokens[order[0]]
    assert rec[0]["usd_per_million_tokens"] == pytest.approx(float(usd), rel=1e-6)
    assert (
        rec[0]["usd_per_million_tokens"]
        <= float(np.min(c.met.usd_per_million_tokens[c.met.feasible])) * 1.0001
    )


def test_model_that_fits_nowhere_is_explained() -> None:
    data = {
        "model": "llama3-405b",
        "hardware": {"system": "dgx-v100", "gpus": 8},
        "task": {"seq_len": 8192, "global_batch": 64},
    }
    with pytest.raises(InfeasibleError, match=r"needs at least .* GB per GPU.*memory capacity"):
        solve_records(problem_from_dict(data))
