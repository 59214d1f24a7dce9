"""Sensitivity on a mixed-stage plan (studies/sensitivity.py): energy per token counts each stage's GPUs at its own
system's power (a mixed plan matches no single hardware option; this crashed with StopIteration)."""

from __future__ import annotations

from madmax_opt.core.units import J_PER_KWH
from madmax_opt.io import catalog
from madmax_opt.io.problem import load_problem
from madmax_opt.studies.sensitivity import _kwh_per_million_tokens


def test_energy_of_a_mixed_stage_plan_sums_each_stage_at_its_systems_power() -> None:
    problem = load_problem("problems/gpt3-175b-mixed-pipeline.yaml")
    h100 = catalog.lookup("system", "dgx-h100", file=None, field="s").power_w_per_gpu
    a100 = catalog.lookup("system", "dgx-a100", file=None, field="s").power_w_per_gpu
    stages = ["dgx-h100"] * 3 + ["dgx-a100"] * 4 + ["dgx-h100"]  # 8 stages of 256 / 8 = 32 GPUs
    rec = {"plan": {"stage_systems": stages}, "hardware": {"system": "dgx-h100+dgx-a100", "gpus": 256},
           "tokens_per_s": 1.0e5}
    watts = 32 * (4 * h100 + 4 * a100)  # by hand: 4 stages of each type
    assert abs(_kwh_per_million_tokens(problem, rec) - watts / 1.0e5 * 1e6 / J_PER_KWH) < 1e-9
    uniform = {"plan": {}, "hardware": {"system": "dgx-a100", "gpus": 256}, "tokens_per_s": 1.0e5}
    assert abs(_kwh_per_million_tokens(problem, uniform) - 256 * a100 / 1.0e5 * 1e6 / J_PER_KWH) < 1e-9
