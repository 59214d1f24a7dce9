"""Mixed-stage bounds (search/stage_bounds.py with several systems per stage and GPU type supplies): never above an
exact base optimum, the same result with and without them, and few CP-SAT models on the mixed-pipeline example
(before them: 149 CP-SAT models, ~4.3 s of search on the 2-core machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from madmax_opt.analysis.evaluator import Model
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search import stage_compositions, stages
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.solver import solve_records
from madmax_opt.search.stage_bounds import least_max_mixed

ROOT = Path(__file__).resolve().parents[1]


def _mixed(gpus: int, pp: list[int], h100_supply: int, layers: int, global_batch: int, dp: list[int]) -> dict[str, Any]:
    """A100s and a few H100s (tp 4): the best plans put some stages on H100s."""
    return {
        "model": {"layers": layers, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 32000},
        "hardware": [{"system": "dgx-a100", "gpus": gpus},
                     {"system": "dgx-h100", "gpus": gpus, "supply": h100_supply}],
        "task": {"seq_len": 2048, "global_batch": global_batch},
        "space": {"dp": dp, "tp": 4, "pp": pp, "cp": 1, "zero": [0, 1], "sp": True, "recompute": ["none", "full"],
                  "uneven_stages": True, "mixed_stages": True},
    }


CASES = [_mixed(16, [2, 4], 8, 10, 32, [1]), _mixed(16, [4], 8, 12, 64, [1]), _mixed(32, [4, 8], 16, 24, 64, [1, 2])]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = stages.cpsat_run

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "cpsat_run", counted)
    return calls


def test_least_max_mixed_by_hand() -> None:
    inf = np.inf
    # two stages, layers 0..4; option 0 (plentiful): 1..3 layers at 20, 40, 60; option 1 (one stage): 10, 20, 30
    slow = [inf, 20, 40, 60, inf]
    fast = [inf, 10, 20, 30, inf]
    g = np.array([[[slow, slow], [fast, fast]]])
    assert least_max_mixed(g, 4, [([1], np.array([2]))]).tolist() == [20.0]  # 2 + 2 layers, both fast
    assert least_max_mixed(g, 4, [([1], np.array([1]))]).tolist() == [30.0]  # fast 3 + slow 1 (tmax 30)
    assert least_max_mixed(g, 6, [([1], np.array([1]))]).tolist() == [60.0]  # fast 3 + slow 3
    assert least_max_mixed(g, 4, [([1], np.array([0]))]).tolist() == [40.0]  # slow only: 2 + 2
    # option 0 limited to no stage, option 1 to one: two stages cannot be placed
    assert least_max_mixed(g, 2, [([0], np.array([0])), ([1], np.array([1]))]).tolist() == [inf]


@pytest.mark.parametrize("data", CASES[:2])
def test_mixed_bounds_never_exceed_the_exact_base_optimum(data: dict[str, Any]) -> None:
    model = Model(problem_from_dict(data))
    bases = stages._bases(model)
    modes = sorted(set(stages.enumerate_plans(model.problem).recompute.tolist()))
    _, total = stages._lower_bounds_us(model, bases)
    hws = stages.stage_hardware(model, bases.take([0]))
    per_base = [stage_compositions.stage_supply(model, bases.take([j]), hws) for j in range(len(bases))]
    supply_arg = [(g, np.array([s[i][1] for s in per_base])) for i, (g, _) in enumerate(per_base[0])]
    assert supply_arg  # the H100 supply limits the stages on H100s
    bound = stages.strong_bounds(model, bases, total, modes, hw_choices=hws, supply=supply_arg)
    solved = 0
    for j in range(len(bases)):
        base = bases.take([j])
        p = int(base.pp[0])
        status, step_us, _, _ = stages._solve_base(stages._candidates(model, base, modes, hws), p,
                                                   model.workload.layers, np.inf, CpSatOptions(), per_base[j],
                                                   vpp=int(base.vpp[0]))
        if status == "infeasible":
            continue
        assert status == "optimal" and step_us is not None
        assert bound[j] <= step_us * p * int(base.vpp[0]) + 1e-6
        solved += 1
    assert solved >= 3


@pytest.mark.parametrize("data", CASES)
def test_mixed_bounds_change_no_result(data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    out, rec = solve_records(problem_from_dict(data))
    assert out.uneven is not None and out.search == "mixed" and out.uneven.status == "optimal"
    with_bounds = len(calls)
    monkeypatch.setattr(stages, "strong_bounds", lambda model, b, total, modes, **_: np.full(len(b), -np.inf))
    ref_out, ref = solve_records(problem_from_dict(data))
    assert ref_out.uneven is not None and len(calls) - with_bounds >= with_bounds
    assert rec[0]["plan"] == ref[0]["plan"] and rec[0]["step_time_s"] == ref[0]["step_time_s"]
    assert out.objective == ref_out.objective and out.uneven.status == ref_out.uneven.status


def test_mixed_pipeline_example_needs_few_cp_sat_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """problems/gpt3-175b-mixed-pipeline.yaml: the plan found before the mixed bounds, proven optimal without a
    CP-SAT model (was 149 of 368 bases before the mixed bounds, 5 before the two passes and the split bound's exact
    maxima: tests/test_mixed_speed.py)."""
    calls = _counting(monkeypatch)
    data = yaml.safe_load((ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml").read_text())
    out, rec = solve_records(problem_from_dict(data))
    assert out.uneven is not None and out.uneven.status == "optimal" and out.search == "mixed"
    assert out.uneven.bases_solved + out.uneven.bases_pruned == 368
    assert len(calls) == 0 and out.uneven.bases_solved <= 13
    plan = rec[0]["plan"]
    # four 17-layer stages on H100s and four 7-layer stages on A100s (objective 13817119.375 since the A100 refit,
    # validation.refine_grid: gemm_eff 0.89 -> 0.895, layer_overhead_s 0.4 -> 0.425 ms). The order of the stages is
    # a tie: the one-pass search returned [17, 7, 7, 7, 7, 17, 17, 17] on [h, a, a, a, a, h, h, h], the two passes
    # the dynamic programme's split, of the same objective
    h, a = "dgx-h100", "dgx-a100"
    assert sorted(zip(plan["stage_layers"], plan["stage_systems"], strict=True)) == [(7, a)] * 4 + [(17, h)] * 4
    assert (plan["dp"], plan["pp"], plan["zero"]) == (4, 8, 1) and plan["stage_recompute"] == ["none"] * 8
    assert out.objective == 13817119.375 and out.summary()["gap"] == 0.0
