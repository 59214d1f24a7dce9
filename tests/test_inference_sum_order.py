"""A serving plan's numbers do not depend on the other plans evaluated with it (model/inference.py adds its terms
with core/numeric.ordered_sum)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from madmax_opt.core.numeric import ordered_sum
from madmax_opt.io.problem import load_problem
from madmax_opt.search import serving
from madmax_opt.search.serving import candidates

PROBLEM = Path(__file__).resolve().parents[1] / "problems" / "serve-llama2-70b-dgx-h100.yaml"


def test_ordered_sum_adds_left_to_right() -> None:
    terms = [np.array([1e16]), np.array([1.0]), np.array([-1e16])] + [np.array([1.0])] * 9
    assert ordered_sum(terms)[0] == ((1e16 + 1.0) - 1e16) + 9.0
    wide = np.stack(terms)[:, [0, 0]]  # the same terms for two plans
    assert ordered_sum(list(wide))[0] == ordered_sum(terms)[0]


def test_a_plan_alone_and_in_a_batch_price_to_the_bit() -> None:
    model = serving.ServingModel(load_problem(PROBLEM))
    plan = serving.ServingPlan(dp=32, tp=2, pp=2, ep=1, batch=192, precision="bf16", system="dgx-h100")
    other = serving.ServingPlan(dp=16, tp=4, pp=1, ep=1, batch=64, precision="bf16", system="dgx-h100")
    alone = candidates(model, model.arrays([plan])).terms
    mixed = candidates(model, model.arrays([other, plan, other])).terms
    for field in ("tpot_s", "ttft_s", "output_tokens_per_s", "decode_step_s", "prefill_s"):
        assert getattr(alone, field)[0] == getattr(mixed, field)[1], field
