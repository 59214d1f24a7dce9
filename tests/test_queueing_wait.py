"""Waiting for a slot (model/queueing.py): Erlang C and the M/G/c wait-tail rate against hand-checked values, and
the TPOT hard bound against the reference simulation."""

from __future__ import annotations

import math

import numpy as np

from madmax_opt.analysis.serving_sim import simulate_replica
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.queueing import erlang_c, latency, mgc_tail_rate, service_table
from madmax_opt.search.serving_space import ServingModel, ServingPlan


def _erlang_c_direct(c: int, a: float) -> float:
    """Textbook form: C = (a^c / c!) (c / (c - a)) / (sum_{k<c} a^k / k! + (a^c / c!) (c / (c - a)))."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def test_erlang_c_textbook_values() -> None:
    got = erlang_c(np.array([1.0, 2.0, 10.0, 64.0]), np.array([0.7, 1.0, 8.0, 57.6]))
    assert abs(got[0] - 0.7) < 1e-12  # M/M/1: P(wait) = rho
    assert abs(got[1] - 1.0 / 3.0) < 1e-12  # M/M/2 at rho = 1/2: 1/3
    assert abs(got[2] - _erlang_c_direct(10, 8.0)) < 1e-12 and abs(got[2] - 0.4092) < 1e-4
    assert abs(got[3] - _erlang_c_direct(64, 57.6)) < 1e-10


def test_tail_rate_is_exact_for_exponential_service() -> None:
    # M/M/c: eta = c mu - lambda (Erlang C's exponential wait); exponential S by 20,000 equal-mass quantile atoms
    u = (np.arange(20_000) + 0.5) / 20_000
    service = -np.log1p(-u)[None, :]  # mu = 1
    for c, lam in ((1, 0.5), (4, 3.0), (16, 15.0)):
        eta = mgc_tail_rate(np.array([lam]), np.array([float(c)]), service, np.ones(20_000))
        assert abs(eta[0] - (c - lam)) < 0.01 * (c - lam)


def test_tail_rate_is_crommelin_for_deterministic_service() -> None:
    # M/D/1, S = 1, lambda = 0.5: x = 0.5 (e^x - 1), x = 1.25643 (hand-checked: e^1.25643 = 3.51286)
    eta = mgc_tail_rate(np.array([0.5]), np.array([1.0]), np.array([[1.0]]), np.array([1.0]))
    assert abs(eta[0] - 1.25643) < 1e-4
    # M/D/c: c ln z0 / S with z0^c = e^(lambda S (z0 - 1)); c = 8, S = 1, lambda = 6 -> z0 from its own bisection
    lo, hi = 1.0 + 1e-9, 10.0
    for _ in range(200):
        z = 0.5 * (lo + hi)
        lo, hi = (z, hi) if 8 * math.log(z) > 6.0 * (z - 1.0) else (lo, z)
    eta = mgc_tail_rate(np.array([6.0]), np.array([8.0]), np.array([[1.0]]), np.array([1.0]))
    assert abs(eta[0] - 8 * math.log(lo)) < 1e-6
    # heavy traffic: 2 (c / E[S] - lambda) / (1 + cs^2) (Kingman), here a two-point S with cs^2 = 0.16
    service, shares = np.array([[0.4, 1.2]]), np.array([0.25, 0.75])
    mean = 0.25 * 0.4 + 0.75 * 1.2
    cs2 = (0.25 * 0.16 + 0.75 * 1.44) / mean**2 - 1.0
    lam = 0.999 * 8 / mean
    eta = mgc_tail_rate(np.array([lam]), np.array([8.0]), service, shares)
    assert abs(eta[0] / (2 * (8 / mean - lam) / (1 + cs2)) - 1.0) < 0.01


def test_tpot_never_exceeds_the_iteration_bound_and_the_simulation_stays_below_it() -> None:
    model = ServingModel(problem_from_dict({"model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": 8},
                                            "task": {"kind": "inference", "prompt_len": 4096, "output_len": 128}}))
    st = service_table(model.terms, model.arrays([ServingPlan(tp=8, max_num_seqs=8)]), model.workload)
    rate = 0.9 * float(st.max_rate_per_replica()[0])
    c, m = float(st.cap[0]), float(st.outputs[0] - 1)
    bound = float(st.decode_s(st.cap)[0][0]) + (c - 1.0) * float(st.prefill_s[0]) / m
    sim = simulate_replica(st, rate, 6_000, 1)
    assert float(np.max(sim.tpot_s)) <= bound * (1 + 1e-9)
    assert float(latency(st, np.array([rate])).tpot_s[0, -1]) <= bound * (1 + 1e-6)


def _erlang_c_exact(c: int, a: float) -> float:
    """Erlang C in exact rational arithmetic (a given as a decimal): B = (a^c / c!) / sum_{k<=c} a^k / k!."""
    from fractions import Fraction

    fa = Fraction(a).limit_denominator(10**6)
    term, total = Fraction(1), Fraction(1)
    for k in range(1, c + 1):
        term = term * fa / k
        total += term
    b = term / total
    return float(b / (1 - fa / c * (1 - b)))


def test_erlang_c_at_hundreds_of_slots_matches_exact_arithmetic() -> None:
    # large caps (max_num_seqs 256 / 1024) near and below saturation: the log-space sum over the terms that matter
    cases = [(256, 240.0), (256, 250.5), (1024, 1000.0), (1024, 990.25), (300, 299.9)]
    got = erlang_c(np.array([float(c) for c, _ in cases]), np.array([a for _, a in cases]))
    for (c, a), g in zip(cases, got, strict=True):
        assert abs(g - _erlang_c_exact(c, a)) < 1e-12 * max(1.0, _erlang_c_exact(c, a)), (c, a)
