"""Rates, the objectives' one input (model/objectives.py): a deployment's systems and the GPUs on each, from which
every catalog quantity is summed; a mixed pipeline's stages each count on their own system."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from madmax_opt.io import catalog
from madmax_opt.io.problem import load_problem
from madmax_opt.model.objectives import Rates, objective_values, uniform_rates
from madmax_opt.search.robust import objective_value

ROOT = Path(__file__).resolve().parents[1]
H100, A100 = catalog.systems()["dgx-h100"], catalog.systems()["dgx-a100"]


def test_a_deployment_over_two_systems_sums_each_part_by_hand() -> None:
    # candidate 0: 3 GPUs on H100 + 5 on A100; candidate 1: 8 on A100 + none on H100
    r = Rates(np.array([0.5, 0.25]), (H100, A100),
              ((np.array([0, 0]), np.array([3.0, 0.0])), (np.array([1, 1]), np.array([5.0, 8.0]))))
    assert r.gpus.tolist() == [8.0, 8.0]
    assert r.watts.tolist() == [3 * 1275.0 + 5 * 812.5, 8 * 812.5]  # data/systems.yaml power_w_per_gpu
    assert r.usd_per_hour.tolist() == pytest.approx([3 * 4.92 + 5 * 1.80, 8 * 1.80])  # price_per_gpu_hour
    assert objective_values("energy", r).tolist() == [0.5 * (3 * 1275.0 + 5 * 812.5), 0.25 * 8 * 812.5]


def test_uniform_rates_index_the_systems() -> None:
    r = uniform_rates(np.array([1.0, 1.0]), [H100, A100], np.array([1, 0]), np.array([16.0, 8.0]))
    assert r.watts.tolist() == [16 * 812.5, 8 * 1275.0]
    assert r.usd_per_hour.tolist() == pytest.approx([16 * 1.80, 8 * 4.92])


@pytest.mark.parametrize("objective", ["energy", "cost"])
def test_robust_values_a_mixed_pipeline_on_each_stage_system(objective: str) -> None:
    """A mixed pipeline's energy counts each stage's GPUs at its own system's power (once: the first stage's
    system on every GPU, 256 x 1275 W instead of 128 x 1275 + 128 x 812.5 W on the example's optimum)."""
    problem = dataclasses.replace(load_problem(ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml"),
                                  objective=objective)
    stages = ["dgx-h100", "dgx-a100", "dgx-a100"]
    per_stage = 4 * 8 * 1  # dp x tp x cp
    price = per_stage * (4.92 + 2 * 1.80)
    rec = {"plan": {"dp": 4, "tp": 8, "cp": 1, "pp": 3, "system": "dgx-h100", "stage_systems": stages},
           "hardware": {"system": "dgx-h100+dgx-a100", "gpus": 3 * per_stage}, "tokens_per_s": 1000.0,
           "cost_per_hour_usd": price}
    want = (per_stage * (1275.0 + 2 * 812.5) if objective == "energy" else price / 3600.0) / 1000.0
    assert objective_value(problem, rec) == pytest.approx(want, rel=1e-12)
