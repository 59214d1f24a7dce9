"""Online serving under Poisson arrivals: analytic percentiles vs the seeded simulation, and the arrival-rate
search (p99 targets change the plan; the search equals an independent per-plan brute force)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from madmax_opt.analysis.serving_sim import simulate_replica
from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.queueing import LATENCY_TARGETS, latency, max_rate, service_table
from madmax_opt.search.online import admissible, online_candidates, online_plans, solve_online
from madmax_opt.search.serving_space import ServingModel, ServingPlan

TASK: dict[str, Any] = {"kind": "inference", "prompt_len": 1024, "output_len": 256}


def serving_model(gpus: Any = 8, **task: Any) -> ServingModel:
    return ServingModel(problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": gpus},
                                           "task": {**TASK, **task}}))


def table_of(model: ServingModel, plans: list[ServingPlan]) -> Any:
    arr = model.arrays(plans)
    return service_table(model.terms, arr, model.workload)


# plan, utilisation (rate / stability limit), chat requests: up to 60 % of the limit and where slots are rarely all
# busy (P(wait) < 1 %). Beyond (80-90 % load, queueing for a slot, prompts of 4096 tokens) the errors are larger
# and measured in results/validation/online_serving.md (studies/online_validation.py).
CASES = [
    (ServingPlan(tp=8, max_num_seqs=256), 0.3),
    (ServingPlan(tp=8, max_num_seqs=256), 0.6),
    (ServingPlan(tp=8, max_num_seqs=8), 0.3),
    (ServingPlan(tp=4, pp=2, max_num_seqs=64), 0.3),
    (ServingPlan(tp=4, pp=2, max_num_seqs=64), 0.6),
    (ServingPlan(tp=4, dp=2, max_num_seqs=16), 0.3),
]


@pytest.mark.parametrize(("plan", "utilisation"), CASES)
def test_percentiles_match_the_reference_simulation_within_5_percent(plan: ServingPlan, utilisation: float) -> None:
    st = table_of(serving_model(), [plan])
    rate = utilisation * float(st.max_rate_per_replica()[0])
    sim = simulate_replica(st, rate, requests=30_000, seed=1).percentiles()
    lat = latency(st, np.array([rate]))
    assert lat.wait_probability[0] < 0.01
    for name in LATENCY_TARGETS:
        assert lat.metric(name)[0] == pytest.approx(sim[name], rel=0.05), name


def test_simulation_is_seeded_and_little_holds() -> None:
    st = table_of(serving_model(), [ServingPlan(tp=8, max_num_seqs=64)])
    rate = 0.5 * float(st.max_rate_per_replica()[0])
    a = simulate_replica(st, rate, requests=5000, seed=3)
    b = simulate_replica(st, rate, requests=5000, seed=3)
    assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.tpot_s, b.tpot_s)
    # Little's law on the analytic side: running = rate x (E[o] - 1) x mean iteration
    lat = latency(st, np.array([rate]))
    assert lat.running[0] == pytest.approx(rate * 255 * lat.iteration_s[0], rel=1e-3)
    assert a.running_mean == pytest.approx(lat.running[0], rel=0.05)


def test_latencies_grow_with_the_rate_and_diverge_at_the_stability_limit() -> None:
    st = table_of(serving_model(), [ServingPlan(tp=8, max_num_seqs=128)] * 4)
    lim = st.max_rate_per_replica()
    lat = latency(st, lim * np.array([0.2, 0.5, 0.8, 1.01]))
    assert np.all(np.diff(lat.ttft_s[:3, 2]) > 0) and np.all(np.diff(lat.tpot_s[:3, 1]) > 0)
    assert not lat.stable[3] and np.isinf(lat.ttft_s[3, 2])
    # the stability limit is the closed form's throughput at the cap, with o - 1 decode rounds per request
    t_c = st.decode_s(st.cap)[0]
    assert lim[0] == pytest.approx(128 / (255 * t_c[0] + 128 * st.prefill_s[0]))


def test_a_p99_ttft_target_changes_the_chosen_plan() -> None:
    free = solve_online(serving_model(arrival_rate=2.0).problem)["best"]
    target = 0.3
    tight = solve_online(serving_model(arrival_rate=2.0, ttft_p99_s=target).problem)["best"]
    assert free["plan"] != tight["plan"]
    assert tight["at_arrival_rate"]["ttft_p99_s"] <= target
    # the unconstrained optimum carries more requests per GPU, but misses the p99 target at its own limit
    assert free["max_rate_per_gpu"] > tight["max_rate_per_gpu"]
    model = serving_model(arrival_rate=2.0, ttft_p99_s=target)
    p = free["plan"]
    st = table_of(model, [ServingPlan(dp=p["dp"], tp=p["tp"], pp=p["pp"], max_num_seqs=p["max_num_seqs"])])
    at_rate = tight["max_rate_per_gpu"] * 8 / st.replicas
    assert latency(st, at_rate).ttft_s[0, 2] > target


@pytest.mark.parametrize(("gpus", "tps"), [
    (4, [2, 4]),
    pytest.param([4, 8], [4, 8], marks=pytest.mark.slow),
])
def test_arrival_rate_search_equals_an_independent_brute_force(gpus: Any, tps: list[int]) -> None:
    model = ServingModel(problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": gpus},
                                            "task": {**TASK, "arrival_rate": 1.0, "ttft_p99_s": 0.4, "tpot_p90_s": 0.04},
                                            "space": {"tp": tps, "pp": 1}}))
    result = solve_online(model.problem, top_k=3)
    plans = online_plans(model)
    oc = online_candidates(model, plans)
    ok = admissible(model, oc)
    targets = model.task.latency_targets()
    best: tuple[float, int] | None = None
    for i in range(len(plans)):  # one plan at a time, its own bisection
        row = plans.take([i])
        if model.terms(row).invalid[0] != 0:
            continue
        rate = float(max_rate(service_table(model.terms, row, model.workload), targets)[0])
        if rate < model.task.arrival_rate or not ok[i]:
            continue
        key = (round(float(plans.gpus[i]) / rate * 1e6), i)
        best = key if best is None or key < best else best
    assert best is not None
    i = best[1]
    assert result["best"]["plan"]["tp"] == int(plans.tp[i]) and result["best"]["plan"]["pp"] == int(plans.pp[i])
    assert result["best"]["plan"]["max_num_seqs"] == int(oc.table.cap[i])
    assert result["best"]["hardware"]["gpus"] == int(plans.gpus[i])
    assert result["solver"]["objective"] == best[0]


def test_percentile_targets_need_an_arrival_rate() -> None:
    with pytest.raises(ProblemError, match="ttft_p99_s: percentile targets need arrival_rate"):
        problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": 8},
                           "task": {**TASK, "ttft_p99_s": 0.5}})


def test_arrival_rate_with_disaggregation_is_a_one_line_error() -> None:
    with pytest.raises(ProblemError, match="arrival_rate with disaggregated: true is not modelled"):
        problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": 8},
                           "task": {**TASK, "arrival_rate": 2.0, "disaggregated": True}})


def test_evaluate_reports_percentiles_at_the_arrival_rate() -> None:
    from madmax_opt.search.online import evaluate_online

    model = serving_model(arrival_rate=4.0, ttft_p99_s=0.3)
    plan = ServingPlan(tp=8, max_num_seqs=64)
    rec = evaluate_online(model.problem, [plan])[0]
    st = table_of(model, [plan])
    lat = latency(st, np.array([4.0]))
    assert rec["at_arrival_rate"]["ttft_p99_s"] == pytest.approx(float(lat.ttft_s[0, 2]))
    assert rec["feasible"] == (rec["max_rate"] >= 4.0) == (float(lat.ttft_s[0, 2]) <= 0.3)


def _bisected_max_rate(st: Any, targets: dict[str, float], steps: int = 30) -> Any:
    """The reference: plain bisection on the percentiles themselves (latency(), each quantile bisected to float
    resolution by the caller's monkeypatch)."""
    lam_max = st.max_rate_per_replica() * (1.0 - 1e-6)
    lo, hi = np.zeros_like(lam_max), lam_max.copy()
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lat = latency(st, mid, only=targets)
        ok = lat.stable.copy()
        for name, limit in targets.items():
            ok &= lat.metric(name) <= limit
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo * st.replicas


def test_vectorised_rate_search_equals_bisection_on_the_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    from madmax_opt.model import queueing_math

    model = serving_model(8)
    plans = [ServingPlan(tp=8, max_num_seqs=256), ServingPlan(tp=4, dp=2, max_num_seqs=64),
             ServingPlan(tp=4, pp=2, max_num_seqs=1024), ServingPlan(tp=2, dp=4, max_num_seqs=16)]
    st = table_of(model, plans)
    for targets in ({"ttft_p99_s": 0.3, "tpot_p90_s": 0.04}, {"ttft_p50_s": 0.2}, {"tpot_s": 0.03, "ttft_s": 0.5}):
        got = max_rate(st, targets)
        with monkeypatch.context() as m:
            m.setattr(queueing_math, "BISECT_STEPS", 60)  # quantiles to float resolution: q_p <= L exactly
            want = _bisected_max_rate(st, targets)
        # the same 30 halvings of the stability limit (2^-30 = 9e-10 of it)
        assert np.allclose(got, want, rtol=1e-6, atol=0.0), (targets, got, want)


def test_edge_rates_and_single_token_outputs_give_no_numpy_warnings() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = solve_online(serving_model([8, 16], arrival_rate=1e-300).problem)
        single = solve_online(serving_model(8, output_len=1, arrival_rate=5.0, ttft_p99_s=0.5).problem)
        big = online_candidates(serving_model(1024, arrival_rate=1.0, ttft_p99_s=1e-6))  # nothing carries it
    assert tiny["best"]["max_rate"] > 0 and tiny["best"]["at_arrival_rate"]["utilisation"] < 1e-290
    at = single["best"]["at_arrival_rate"]
    assert at["tpot_p90_s"] == 0.0 and at["ttft_p99_s"] <= 0.5  # one output token: no time between tokens
    assert np.all(big.max_rate == 0.0) and np.all(big.gpu_us_per_request == 2**50)


def test_tpot_target_with_single_token_outputs_and_cpsat_options_are_refused_by_name() -> None:
    from madmax_opt.search.cpsat import CpSatOptions

    with pytest.raises(ProblemError, match=r"tpot_p90_s.*output_len 1"):
        solve_online(serving_model(8, output_len=1, arrival_rate=5.0, tpot_p90_s=0.05).problem)
    p = serving_model(8, arrival_rate=5.0).problem
    for opts, name in ((CpSatOptions(params="linearization_level: 2"), "--solver-params"),
                       (CpSatOptions(export_model=__import__("pathlib").Path("m.txt")), "--export-model"),
                       (CpSatOptions(workers=2), "--workers")):
        with pytest.raises(ProblemError, match=name):
            solve_online(p, cpsat=opts)


def test_verify_checks_the_online_search_against_every_candidate() -> None:
    from madmax_opt.search.verify import verify_problem

    p = problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": [8, 16]},
                           "task": {**TASK, "arrival_rate": 5.0, "ttft_p99_s": 0.4, "tpot_p90_s": 0.05},
                           "space": {"tp": [4, 8], "pp": [1, 2]}})
    report = verify_problem(p)
    assert report["agree"] and report["solver_objective"] == report["brute_force_objective"]
    assert report["solver_plan"] == solve_online(p)["best"]["plan"]
