"""Sensitivity studies: factor 1.0 is the base exactly, better hardware never loses throughput, the CLI, the bench."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import run_main
from madmax_opt.analysis.evaluator import Model, evaluate, metrics
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.io.derive import HARDWARE_PARAMETERS
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.search.solver import ROUNDING_TOLERANCE_S, solve_records
from madmax_opt.search.space import enumerate_plans
from madmax_opt.studies.sensitivity import (
    Study,
    Variant,
    run_sensitivity,
    shared_plans,
    solve_optimum,
    variant_problem,
)
from strategies import small_hardware, small_models

SMALL = Path(__file__).resolve().parent / "data" / "small.yaml"
SEVENTY_B = {"model": "llama2-70b", "hardware": {"system": "dgx-h100", "gpus": 2048},
             "task": {"seq_len": 4096, "global_batch": 2048}}




# ------------------------------------------------------------------------------------ factor 1.0 = base


MIXED = {
    "model": "llama2-7b",
    "hardware": [{"system": "dgx-a100", "gpus": [8, 16]}, {"system": "dgx-h100", "gpus": 8}],
    "task": {"seq_len": 2048, "global_batch": 64},
    "objective": "cost",
    "constraints": {"max_cost_per_hour": 60.0},
}


@pytest.mark.parametrize("data", [SEVENTY_B, MIXED], ids=["llama2-70b-2048xh100", "mixed-cost"])
def test_every_factor_one_reproduces_the_base_optimum_exactly(data: dict[str, Any]) -> None:
    problem = problem_from_dict(data)
    plain = solve_records(problem)[1][0]
    study = run_sensitivity(problem, HARDWARE_PARAMETERS, [1.0])
    assert study.base.record == plain
    assert len(study.variants) == 10
    for v in study.variants:
        assert v.record == plain, v.param  # the whole record, names included: == on floats is bitwise
        assert study.gain(v) == 0.0
        assert v.fixed_plan is not None and v.fixed_plan["step_time_s"] == plain["step_time_s"]
    all_at_once = variant_problem(problem, scale={p: 1.0 for p in HARDWARE_PARAMETERS})
    assert solve_records(all_at_once)[1][0] == plain


def test_shared_enumeration_gives_the_same_optimum_as_a_fresh_one() -> None:
    problem = problem_from_dict(SEVENTY_B)
    plans = shared_plans(problem)
    assert len(plans) < len(enumerate_plans(problem))  # the reuse drops plans no variant can make valid
    for param, factor in (("nic_bandwidth", 2.0), ("hbm_capacity", 0.5), ("peak_flops", 4.0), ("price", 2.0)):
        vp = variant_problem(problem, scale={param: factor})
        assert solve_records(vp, plans=plans)[1][0] == solve_records(vp)[1][0], param


@pytest.mark.parametrize("path", [SMALL, Path(__file__).resolve().parents[1] / "problems" / "serve-llama2-70b-dgx-h100.yaml"],
                         ids=["training", "serving"])
def test_price_and_power_carry_the_base_plan_over_exactly(path: Path) -> None:
    """The shortcut for parameters no time term or constraint uses gives the record a full re-solve gives."""
    problem = load_problem(path)
    study = run_sensitivity(problem, ["price", "power"], [0.5, 3.0])
    assert study.solves == 1 and not any(v.solved for v in study.variants)
    for v in study.variants:
        vp = variant_problem(problem, scale={v.param: v.factor})
        assert v.record == solve_optimum(vp, None, {}), (v.param, v.factor)
    budget = dataclasses.replace(problem, constraints=problem.constraints.model_copy(update={"max_cost_per_hour": 1e6}))
    assert all(v.solved for v in run_sensitivity(budget, ["price"], [2.0]).variants)  # a budget uses the price


def test_parallel_variants_give_the_same_study() -> None:
    problem = load_problem(SMALL)
    one = run_sensitivity(problem, ["nic_bandwidth", "hbm_capacity"], [0.5, 2.0])
    two = run_sensitivity(problem, ["nic_bandwidth", "hbm_capacity"], [0.5, 2.0], jobs=2)
    assert [(v.param, v.factor, v.record, v.fixed_plan) for v in one.variants] == [
        (v.param, v.factor, v.record, v.fixed_plan) for v in two.variants
    ]


# ------------------------------------------------------------------------------------ monotonicity

IMPROVING: dict[str, list[float]] = {
    "nic_bandwidth": [1.5, 2.0, 4.0],
    "nic_latency": [0.5, 0.25],
    "nvlink_bandwidth": [1.5, 2.0, 4.0],
    "nvlink_latency": [0.5, 0.25],
    "nvlink_domain": [2.0, 4.0],
    "hbm_capacity": [1.25, 1.5, 2.0],
    "hbm_bandwidth": [1.5, 2.0, 4.0],
    "peak_flops": [1.5, 2.0, 4.0],
    "power": [0.5],
    "price": [0.5],
}


@st.composite
def small_problems(draw: Any) -> dict[str, Any]:
    model = draw(small_models([4, 8, 12, 16]))
    hardware = draw(small_hardware(2))
    constraints: dict[str, Any] = {}
    if draw(st.booleans()):
        constraints["max_gpus"] = draw(st.sampled_from([8, 16]))
    if draw(st.booleans()):
        constraints["max_cost_per_hour"] = draw(st.sampled_from([30.0, 100.0]))
    return {
        "model": model,
        "hardware": hardware,
        "task": {"seq_len": draw(st.sampled_from([1024, 2048, 4096])), "global_batch": draw(st.sampled_from([16, 64]))},
        "stack": {"flash_attention": draw(st.booleans()), "tp_comm_overlap": draw(st.booleans())},
        "space": {"cp": draw(st.sampled_from([1, [1, 2]])), "mbs": [1, 2, 4]},
        "objective": "throughput",
        "constraints": constraints,
    }


def _optimum(problem: Problem) -> dict[str, Any] | None:
    try:
        return solve_records(problem)[1][0]
    except InfeasibleError:
        return None


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=small_problems(), param=st.sampled_from(sorted(IMPROVING)), pick=st.integers(0, 2))
def test_improving_one_resource_never_lowers_the_reoptimised_throughput(
    data: dict[str, Any], param: str, pick: int
) -> None:
    """If P is the base optimum and Q the variant's, step'(Q) <= step'(P) + 2 tol <= step(P) + 2 tol: each plan's
    integer step is within ROUNDING_TOLERANCE_S of its float step, and step'(P) <= step(P) for better hardware."""
    factor = IMPROVING[param][pick % len(IMPROVING[param])]
    problem = problem_from_dict(data)
    base = _optimum(problem)
    if base is None:
        return
    better = _optimum(variant_problem(problem, scale={param: factor}))
    assert better is not None, f"{param} x{factor} lost every feasible plan"
    assert better["step_time_s"] <= base["step_time_s"] + 2 * ROUNDING_TOLERANCE_S, (param, factor)
    assert better["tokens_per_s"] >= base["tokens_per_s"] * (1 - 2 * ROUNDING_TOLERANCE_S / base["step_time_s"])


PLAN_MONOTONE = [p for p in IMPROVING if p != "nvlink_domain"]


@pytest.mark.parametrize("system", ["dgx-h100", "dc-a", "gb200-nvl72", "cloud-b-nc24rs-v3"])
@pytest.mark.parametrize("param", PLAN_MONOTONE)
def test_every_plan_gets_no_slower_and_stays_valid_on_better_hardware(system: str, param: str) -> None:
    """Brute force over the whole plan space (the domain changes the space itself, tested above)."""
    problem = problem_from_dict({"model": "llama2-7b", "hardware": {"system": system, "gpus": 32},
                                 "task": {"seq_len": 2048, "global_batch": 128}})
    plans = enumerate_plans(problem)
    base = metrics(Model(problem), plans)
    for factor in IMPROVING[param]:
        var = metrics(Model(variant_problem(problem, scale={param: factor})), plans)
        assert not (base.feasible & ~var.feasible).any()
        worse = base.feasible & (var.step_time_s > base.step_time_s * (1 + 1e-12))  # 1e-12: float re-association
        assert not worse.any(), plans.plan(int(np.flatnonzero(worse)[0]))


def test_every_plan_gets_no_slower_with_faster_flops() -> None:
    problem = problem_from_dict({"model": "llama2-7b", "hardware": {"system": "dgx-h100", "gpus": 32},
                                 "task": {"seq_len": 2048, "global_batch": 128}})
    plans = enumerate_plans(problem)
    base = metrics(Model(problem), plans)
    var = metrics(Model(variant_problem(problem, scale={"peak_flops": 2.0})), plans)
    assert not (base.feasible & (var.step_time_s > base.step_time_s * (1 + 1e-12))).any()


# ------------------------------------------------------------------------------------ study arithmetic


def _study(points: dict[float, float | None]) -> Study:
    """A study of one parameter whose optimum reaches ``points[factor]`` tokens/s (None: infeasible)."""
    problem = load_problem(SMALL)

    def variant(factor: float, tokens: float | None) -> Variant:
        record = None if tokens is None else {"tokens_per_s": tokens}
        return Variant("nic_bandwidth", factor, "ok" if tokens else "infeasible", record=record)

    return Study(problem, ["nic_bandwidth"], sorted(points), variant(1.0, 100.0),
                 [variant(f, t) for f, t in sorted(points.items())], 0.0, 1 + len(points))


def test_gain_marginal_gain_and_elasticity_by_hand() -> None:
    study = _study({0.25: 50.0, 0.5: 80.0, 2.0: 120.0, 4.0: 132.0, 8.0: None})
    by_factor = {v.factor: v for v in study.variants}
    assert study.gain(by_factor[2.0]) == pytest.approx(0.2)
    assert study.marginal(by_factor[2.0]) == pytest.approx((0.2, np.log(1.2) / np.log(2.0)))
    assert study.marginal(by_factor[4.0]) == pytest.approx((0.1, np.log(1.1) / np.log(2.0)))  # over the 2x point
    assert study.marginal(by_factor[0.5]) == pytest.approx((-0.2, np.log(0.8) / np.log(0.5)))
    assert study.marginal(by_factor[0.25]) == pytest.approx((50 / 80 - 1, np.log(50 / 80) / np.log(0.5)))
    assert study.gain(by_factor[8.0]) is None and study.marginal(by_factor[8.0]) == (None, None)


def test_a_domain_the_tiers_cannot_nest_is_reported_not_solved() -> None:
    problem = problem_from_dict({"model": "llama2-7b", "hardware": {"system": "cloud-b-nc24rs-v3", "gpus": 8},
                                 "task": {"seq_len": 2048, "global_batch": 16}})
    study = run_sensitivity(problem, ["nvlink_domain"], [0.25, 0.5, 2.0])
    status = {v.factor: v.status for v in study.variants}
    assert status == {0.25: "not_applicable", 0.5: "ok", 2.0: "ok"}  # 4 GPUs x 0.25 = 1: no domain of one GPU
    assert "NVLink domain of 1 GPUs" in (study.variants[0].reason or "")
    assert study.solves == 3


def test_memory_variants_report_the_base_plan_that_no_longer_fits() -> None:
    study = run_sensitivity(problem_from_dict(SEVENTY_B), ["hbm_capacity"], [0.5])
    v = study.variants[0]
    assert v.fixed_plan is not None and not v.fixed_plan["feasible"]
    assert study.fixed_plan_gain(v) is None
    assert v.record is not None and v.record["feasible"]  # re-optimised: another plan fits


# ------------------------------------------------------------------------------------ command line


def test_cli_writes_json_markdown_and_tornado(tmp_path: Path) -> None:
    result = run_main("sensitivity", SMALL, "--params", "nic_bandwidth,peak_flops,price", "--factors", "0.5,2",
                      "--out", tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["params"] == ["nic_bandwidth", "peak_flops", "price"] and out["factors"] == [0.5, 2.0]
    assert [(r["param"], r["factor"]) for r in out["variants"]] == [
        (p, f) for p in ("nic_bandwidth", "peak_flops", "price") for f in (0.5, 2.0)
    ]
    base = out["base"]["record"]
    for row in out["variants"]:
        assert row["gain"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"] - 1, rel=1e-12)
        assert abs(sum(row["bottleneck_shares"].values()) - 1) <= 1e-12
    price = {r["factor"]: r for r in out["variants"] if r["param"] == "price"}
    assert price[2.0]["gain"] == 0.0 and price[2.0]["plan_change"] == "same"
    assert price[2.0]["usd_per_million_tokens"] == pytest.approx(2 * base["usd_per_million_tokens"], rel=1e-12)
    assert json.loads((tmp_path / "small-sensitivity.json").read_text())["variants"] == out["variants"]
    md = (tmp_path / "small-sensitivity.md").read_text()
    assert "| peak_flops | 2 |" in md
    assert (tmp_path / "small-sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "nic_bw"], "--params: unknown parameter 'nic_bw'; allowed: nic_bandwidth"),
        (["--factors", "two"], "--factors: 'two' is not a comma-separated list of numbers"),
        (["--factors", "0,2"], "--factors: factor 0 is out of range; allowed: numbers from 0.001 to 1000"),
    ],
)
def test_cli_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_main("sensitivity", SMALL, "--out", tmp_path, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


# ------------------------------------------------------------------------------------ benchmark


@pytest.mark.slow
def test_ten_parameters_by_four_factors_of_a_70b_problem_within_60_s() -> None:
    t0 = time.perf_counter()
    study = run_sensitivity(problem_from_dict(SEVENTY_B), HARDWARE_PARAMETERS, [0.25, 0.5, 2.0, 4.0])
    wall = time.perf_counter() - t0
    assert len(study.variants) == 40 and all(v.status == "ok" for v in study.variants)
    assert wall <= 60.0, wall


# ------------------------------------------------------------------------------------ co-design study


def test_codesign_study_reports_reoptimised_gains_and_the_best_investment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study writer on two small workloads (one training, one serving) on one system."""
    from madmax_opt.studies import codesign

    monkeypatch.setattr(codesign, "SYSTEMS", ("dgx-h100",))
    monkeypatch.setattr(codesign, "WORKLOADS", (
        ("Llama-2 7B pre-training", {"model": "llama2-7b", "task": {"seq_len": 2048, "global_batch": 64}}, 16),
        ("Llama-2 7B serving", {"model": "llama2-7b", "task": {"kind": "inference", "prompt_len": 512,
                                                                "output_len": 128, "tpot_s": 0.1}}, 8),
    ))
    path = codesign.write_codesign_study(tmp_path)
    text = path.read_text()
    problem = codesign.workload_problem(codesign.WORKLOADS[0][1], "dgx-h100", 16)
    base, rows = codesign.investment_rows(problem)
    assert base is not None
    flops = next(r for r in rows if r["investment"] == "2x FLOP/s")
    doubled = solve_records(variant_problem(problem, scale={"peak_flops": 2.0}))[1][0]
    assert flops["gain"] == pytest.approx(doubled["tokens_per_s"] / base["tokens_per_s"] - 1, rel=1e-12)
    assert f"| 2x FLOP/s | {doubled['tokens_per_s']:,.0f} | {flops['gain']:+.1%} |" in text
    kept = evaluate(variant_problem(problem, scale={"peak_flops": 2.0}), [Plan(**dict(base["plan"], system=None))])[0]
    assert flops["fixed_plan_gain"] == pytest.approx(kept["tokens_per_s"] / base["tokens_per_s"] - 1, rel=1e-12)
    best = max((r for r in rows if not r["investment"].startswith("context")), key=lambda r: r["gain"])
    assert f"- **Llama-2 7B pre-training on dgx-h100**: {best['investment']} pays most" in text
    assert "### Llama-2 7B serving on dgx-h100 x 8" in text
    for stem in ("llama-2-7b-pre-training-dgx-h100", "llama-2-7b-serving-dgx-h100"):
        assert (tmp_path / "codesign" / f"{stem}.png").exists()
        assert f"codesign/{stem}.png" in text
