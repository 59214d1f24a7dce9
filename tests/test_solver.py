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
from madmax_opt.search.space import enumerate_plans
from strategies import small_hardware, small_models


@st.composite
def small_problems(draw: Any) -> dict[str, Any]:
    model = draw(small_models([4, 6, 8, 12, 16]))
    hardware = draw(small_hardware(3))
    space: dict[str, Any] = {"cp": draw(st.sampled_from([1, [1, 2]]))}
    mbs = draw(st.sampled_from([[1, 2], [1, 2, 4], None]))  # None: the default, every divisor of the batch
    if mbs is not None:
        space["mbs"] = mbs
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
    # the default candidates (plans proven infeasible or slower than each option's best dropped, unevaluated) lose
    # nothing: the whole space, evaluated and brute-forced, has the same optimum and the same feasible optimum plan
    full = candidates(model, enumerate_plans(problem))
    full_order = brute_force_order(model, full, problem.objective)
    assert int(full.objective(problem.objective)[full_order[0]]) == int(obj[order[0]])
    assert solve(problem, model=model, top_k=k).objective == out.objective
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


# ------------------------------------------------ the default space: every vpp and micro-batch size Megatron runs


def _gpt3(gpus: int, space: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": "gpt3-175b",
        "hardware": {"system": "dgx-a100", "gpus": gpus},
        "task": {"seq_len": 2048, "global_batch": 1536},
        "space": space or {},
    }


def test_default_space_is_every_valid_vpp_and_mbs() -> None:
    """Counted independently: per shape, vpp in the divisors of L/pp and mbs in the divisors of B/dp."""
    data = _gpt3(512, {"tp": 8, "cp": 1, "zero": 1, "recompute": "none", "sp": True})
    plans = enumerate_plans(problem_from_dict(data))
    expected = set()
    for pp in (1, 2, 4, 8, 16, 32, 64):  # pp | 96 layers and pp | 512 / tp
        if 96 % pp or 64 % pp:
            continue
        dp = 64 // pp
        for v in range(1, 97):
            if 96 % (pp * v) or (pp == 1 and v > 1):
                continue
            for b in range(1, 1537):
                if (1536 // dp) % b == 0:
                    expected.add((dp, pp, v, b))
    got = {(int(plans.dp[i]), int(plans.pp[i]), int(plans.vpp[i]), int(plans.mbs[i])) for i in range(len(plans))}
    assert got == expected
    assert {(16, 4, 24, 3), (8, 8, 12, 6)} <= got  # interleave 24, mbs 3 and 6 are in the default space


@pytest.mark.parametrize("gpus", [512, 4096])
def test_default_solve_beats_every_plan_of_the_widened_space(gpus: int) -> None:
    """Issue 16: vpp up to 24 and mbs 3 and 6 (as another tool searches) cannot beat the default solve."""
    default = problem_from_dict(_gpt3(gpus))
    out, recs = solve_records(default)
    wide = problem_from_dict(_gpt3(gpus, {"vpp": list(range(1, 25)), "mbs": [1, 2, 3, 4, 6, 8]}))
    model = Model(wide)
    c = candidates(model)
    order = brute_force_order(model, c, "throughput")
    assert out.status == "optimal" and len(order) > 0
    assert out.objective is not None and out.objective <= int(c.step_us[order[0]])  # rounded integers
    assert recs[0]["step_time_s"] <= float(c.met.step_time_s[c.met.feasible].min()) + 2 * ROUNDING_TOLERANCE_S
    if gpus == 4096:  # the old default (vpp 1, 2, 4; mbs 1, 2, 4, 8) is beaten by more than 10 %
        old = problem_from_dict(_gpt3(gpus, {"vpp": [1, 2, 4], "mbs": [1, 2, 4, 8]}))
        _, old_recs = solve_records(old)
        assert recs[0]["step_time_s"] < 0.92 * old_recs[0]["step_time_s"]


# ------------------------------------------------ the summary describes the search that returned the plan


def _uneven405(space: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "llama3-405b",
        "hardware": {"system": "dgx-h100", "gpus": 1024},
        "task": {"seq_len": 8192, "global_batch": 512},
        "space": {"tp": 8, "uneven_stages": True, **space},
    }


def test_summary_of_an_uneven_plan_is_the_uneven_search() -> None:
    out, recs = solve_records(problem_from_dict(_uneven405({"pp": 16, "vpp": 1})))  # 126 layers: no uniform plan
    s = out.summary()
    u = out.uneven
    assert u is not None and recs[0]["plan"]["stage_layers"] is not None
    assert s["search"] == "uneven" and s["objective"] == u.objective and s["wall_s"] == u.wall_s
    assert s["booleans"] == u.booleans and s["candidates"] == u.bases_solved + u.bases_pruned
    assert s["gap"] == 0.0 and s["best_bound"] == s["objective"]  # proven optimal, never negative
    assert s["total_wall_s"] >= s["wall_s"]
    n_micro = 512 / (recs[0]["plan"]["dp"] * recs[0]["plan"]["mbs"])
    assert abs(s["objective"] / 1e6 - recs[0]["step_time_s"]) <= u.tolerance_s(n_micro, 16)


def test_summary_of_a_uniform_winner_is_the_uniform_search() -> None:
    data = _gpt3(512, {"pp": 8, "tp": 8, "vpp": 1, "uneven_stages": True})
    out, recs = solve_records(problem_from_dict(data))
    s = out.summary()
    assert recs[0]["plan"]["stage_layers"] is None and s["search"] == "uniform"
    assert out.uneven is not None and out.uneven.status == "no-improvement"
    assert s["booleans"] == out.model_size and s["candidates"] == out.candidates.evaluated  # plans evaluated
    assert s["gap"] >= 0.0 and s["total_wall_s"] >= s["wall_s"] + out.uneven.wall_s * 0.99


def test_even_split_that_ties_is_reported_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    """An uneven search that returns the even split of the best uniform plan (its rounding a few us lower) must not
    be reported as an uneven plan."""
    from madmax_opt.search import solver, stages
    from madmax_opt.search.stages import UnevenResult

    data = _gpt3(512, {"pp": 8, "tp": 8, "vpp": 1, "uneven_stages": True})
    problem = problem_from_dict(data)
    _, base_recs = solve_records(problem_from_dict({**data, "space": {**data["space"], "uneven_stages": False}}))
    best = base_recs[0]["plan"]
    even = solver.Plan(**{**best, "stage_layers": [12] * 8, "stage_recompute": [best["recompute"]] * 8})
    step_us = base_recs[0]["step_time_s"] * 1e6 - 1.0  # "better" by rounding only

    def fake(*args: Any, **kwargs: Any) -> UnevenResult:
        return UnevenResult(even, step_us, "optimal", 1, 0, 0.01, 10, step_us, step_us)

    monkeypatch.setattr(stages, "solve_uneven", fake)  # solver imports it from there when uneven stages are on
    out, recs = solve_records(problem)
    assert recs[0]["plan"]["stage_layers"] is None and out.summary()["search"] == "uniform"
    assert recs[0]["step_time_s"] == base_recs[0]["step_time_s"]


def test_gap_is_never_negative() -> None:
    from madmax_opt.core.errors import InternalError
    from madmax_opt.search.assemble import solver_summary

    # float noise in CP-SAT's bound (1e-8 relative, as the 405B uneven solve reported) is clamped to 0
    assert solver_summary(21997656.5625, 21997656.5625 * (1 + 2.4e-10), 0.1, 1, 1)["gap"] == 0.0
    assert solver_summary(100, 90.0, 0.1, 1, 1)["gap"] == pytest.approx(0.1)
    with pytest.raises(InternalError):  # a bound far above the solution is a bug, not noise
        solver_summary(100, 110.0, 0.1, 1, 1)


def test_a_space_too_large_to_enumerate_is_refused_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.search import space

    data = _gpt3(512)
    n = len(enumerate_plans(problem_from_dict(data)))
    monkeypatch.setattr(space, "MAX_PLANS", n - 1)
    with pytest.raises(ProblemError, match=r"space.*restrict space\.mbs"):
        enumerate_plans(problem_from_dict(data))
    monkeypatch.setattr(space, "MAX_PLANS", 10 * n)  # counted before duplicates go, so a little above n
    assert len(enumerate_plans(problem_from_dict(data))) == n
