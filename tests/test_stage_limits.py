"""The uneven / mixed-stage search honours constraints.min_throughput, deadline_hours, budget_usd, max_gpus and
max_cost_per_hour as the uniform search does (search/stage_limits.py), and names the constraint when none is met (exit 3). 10 layers on 4 stages:
no uniform plan exists, so every returned plan comes from the stage search. The limits are set 0.1 % beyond the
unconstrained optimum (the solver's per-stage rounding is below 25 us of a ~0.1 s step)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from madmax_opt.core.errors import InfeasibleError
from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.solver import solve_records

TOKENS = 1e9  # task.train_tokens
MIXED = {  # A100s, and H100s for at most 2 of the 4 stages (tp 4, dp 1: 4 GPUs per stage)
    "model": {"layers": 10, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 32000},
    "hardware": [{"system": "dgx-a100", "gpus": 16}, {"system": "dgx-h100", "gpus": 16, "supply": 8}],
    "task": {"seq_len": 2048, "global_batch": 32, "train_tokens": TOKENS},
    "space": {"dp": [1], "tp": 4, "pp": [4], "vpp": 1, "cp": 1, "zero": [0], "sp": True,
              "recompute": ["none", "full"], "uneven_stages": True, "mixed_stages": True},
}
A100 = {**MIXED, "hardware": [{"system": "dgx-a100", "gpus": 16}], "space": {**MIXED["space"], "mixed_stages": False}}


def _solve(data: dict[str, Any], **constraints: float) -> dict[str, Any]:
    _, recs = solve_records(problem_from_dict({**data, "constraints": constraints} if constraints else data))
    return recs[0]


def _run_usd(rec: dict[str, Any]) -> float:
    """train_tokens / tokens per s / 3600 s/h hours x $/h."""
    return TOKENS / rec["tokens_per_s"] / SECONDS_PER_HOUR * rec["cost_per_hour_usd"]


def test_throughput_floor_and_deadline_bind_the_stage_search() -> None:
    best = _solve(A100)
    assert best["plan"]["stage_layers"] is not None  # only uneven splits: 10 layers on 4 stages
    tps = best["tokens_per_s"]
    assert _solve(A100, min_throughput=tps * 0.999)["plan"] == best["plan"]
    with pytest.raises(InfeasibleError, match=re.escape(f"min_throughput={tps * 1.001:.4g} tokens/s: the fastest "
                                                        f"uneven plan reaches {tps:.4g} tokens/s")):
        _solve(A100, min_throughput=tps * 1.001)
    hours = TOKENS / (tps * 1.001) / SECONDS_PER_HOUR  # needs 0.1 % more than the fastest plan reaches
    with pytest.raises(InfeasibleError, match=re.escape(f"binding constraint: deadline_hours={hours:g}")):
        _solve(A100, deadline_hours=hours)
    assert _solve(A100, deadline_hours=TOKENS / (tps * 0.999) / SECONDS_PER_HOUR)["plan"] == best["plan"]


def test_budget_binds_the_mixed_stage_search() -> None:
    fastest = _solve(MIXED)  # throughput: H100 stages, at a higher $/h
    cheapest = _solve(MIXED | {"objective": "cost"})
    assert _run_usd(cheapest) < _run_usd(fastest)
    budget = (_run_usd(cheapest) + _run_usd(fastest)) / 2  # excludes the fastest plan
    within = _solve(MIXED, budget_usd=budget)
    assert _run_usd(within) <= budget < _run_usd(fastest)
    assert within["tokens_per_s"] <= fastest["tokens_per_s"]
    assert within["tokens_per_s"] >= cheapest["tokens_per_s"]  # the cheapest plan meets the budget too
    with pytest.raises(InfeasibleError, match=re.escape(f"budget_usd={_run_usd(cheapest) * 0.999:g} (task.train_tokens "
                                                        "1e+09 at the plan's $/h): the cheapest uneven plan's run "
                                                        f"costs ${_run_usd(cheapest):.4g}")):
        _solve(MIXED, budget_usd=_run_usd(cheapest) * 0.999)


def test_gpus_and_hourly_cost_limit_the_stage_search() -> None:
    a100_per_hour = 16 * problem_from_dict(A100).hardware[0].system.price_per_gpu_hour  # 16 GPUs at the list price
    assert _solve(A100, max_gpus=16)["plan"]["stage_layers"] is not None
    with pytest.raises(InfeasibleError, match="max_gpus=8: the smallest uneven pipeline has 16 GPUs"):
        _solve(A100, max_gpus=8)
    with pytest.raises(InfeasibleError, match=re.escape(f"max_cost_per_hour={a100_per_hour - 1.0}: the cheapest "
                                                        f"uneven pipeline costs at least ${a100_per_hour:.2f}/h")):
        _solve(A100, max_cost_per_hour=a100_per_hour - 1.0)
    fastest = _solve(MIXED)
    assert fastest["cost_per_hour_usd"] > a100_per_hour  # H100 stages cost more per hour
    capped = _solve(MIXED, max_cost_per_hour=fastest["cost_per_hour_usd"] - 1.0)
    assert capped["cost_per_hour_usd"] <= fastest["cost_per_hour_usd"] - 1.0
    assert capped["tokens_per_s"] < fastest["tokens_per_s"]
