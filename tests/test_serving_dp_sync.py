"""Attention-DP synchronisation (model/inference.dp_straggler_factor): a decode step of the attention replicas that
share an expert pool waits for the replica holding the most KV."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model import inference
from madmax_opt.model.inference import dp_straggler_factor, expected_max_std_normal
from madmax_opt.search.serving_space import ServingModel, ServingPlan


def _model(prompt: int = 4000, output: int = 1000) -> ServingModel:
    return ServingModel(problem_from_dict({
        "model": "deepseek-r1", "hardware": {"gpu": "h200-sxm", "gpus": 8},
        "task": {"kind": "inference", "prompt_len": prompt, "output_len": output, "precision": "fp8"},
        "stack": {"framework": "sglang"},
    }))


def test_expected_max_of_standard_normals_closed_forms() -> None:
    # E[max of 2] = 1 / sqrt(pi); E[max of 3] = 3 / (2 sqrt(pi)) (order statistics of the normal)
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1.0 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_std_normal(3) == pytest.approx(3.0 / (2.0 * math.sqrt(math.pi)), rel=1e-6)


def test_straggler_factor_by_hand() -> None:
    """One request shape p = 4000, o = 1000: c = p + U(0, o), E[c] = 4500, sd(c) = 1000 / sqrt(12); 2 ranks of
    16 sequences: 1 + (1 / sqrt(pi)) sd / (E[c] sqrt(16))."""
    sw = _model().workload
    got = dp_straggler_factor(sw, np.array([1.0, 2.0]), np.array([16.0, 16.0]))
    want = 1.0 + (1.0 / math.sqrt(math.pi)) * (1000.0 / math.sqrt(12.0)) / (4500.0 * 4.0)
    assert got == pytest.approx([1.0, want], rel=1e-6)


def test_straggler_factor_matches_sampling() -> None:
    """Brute force: 8 ranks of 16 sequences, each context p + U(0, o); mean over draws of the largest rank's keys
    over the mean rank's."""
    sw = _model().workload
    rng = np.random.default_rng(7)
    ctx = 4000.0 + rng.uniform(0.0, 1000.0, size=(200_000, 8, 16))
    sampled = float(np.mean(ctx.sum(axis=2).max(axis=1)) / (16 * 4500.0))
    assert dp_straggler_factor(sw, np.array([8.0]), np.array([16.0]))[0] == pytest.approx(sampled, rel=2e-4)


def test_decode_attention_of_attention_dp_plans_carries_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """dp 8 x tp 1 sharing ep 8 experts: the decode attention term is the factor times the one without it; a plan
    without attention DP (tp 8, ep 8) is unchanged."""
    m = _model()
    plans = m.arrays([ServingPlan(dp=8, tp=1, ep=8, batch=16, precision="fp8"),
                      ServingPlan(dp=1, tp=8, ep=8, batch=16, precision="fp8")])
    with_sync = m.terms(plans).step["attention"]
    monkeypatch.setattr(inference, "dp_straggler_factor", lambda sw, ranks, seqs: np.ones_like(ranks))
    without = m.terms(plans).step["attention"]
    factor = dp_straggler_factor(m.workload, np.array([8.0]), np.array([16.0]))[0]
    assert factor > 1.0
    assert with_sync[0] == pytest.approx(factor * without[0], rel=1e-12)
    assert with_sync[1] == without[1]
