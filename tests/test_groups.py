"""Process-group sizes (model/groups.py) against the sizes worked out by hand from the degrees."""

from __future__ import annotations

import numpy as np

from madmax_opt.model.groups import Groups
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import Plan


def test_groups_of_one_plan_by_hand() -> None:
    # 64 GPUs: tp 4, pp 2, cp 2, dp 4, ep 2 -> gradients over dp x cp = 8 ranks, experts' over 8 / 2 = 4
    g = Groups.of_plan(Plan(dp=4, tp=4, pp=2, cp=2, ep=2))
    assert (g.gradient, g.expert_dp, g.expert_dp_stride, g.world) == (8.0, 4.0, 16.0, 64.0)
    # a pipeline stage holds dp x tp x cp = 32 GPUs (64 / pp); the expert-parallel ranks are tp x cp = 8 apart
    assert (g.stage, g.expert_stride) == (32.0, 8.0)


def test_groups_of_plan_arrays_match_each_plan() -> None:
    plans = [Plan(dp=8, tp=1, pp=1, cp=1, ep=8), Plan(dp=2, tp=8, pp=4, cp=1, ep=1), Plan(dp=3, tp=2, pp=1, cp=4)]
    arrays = PlanArrays.from_plans(plans, [0, 0, 0])
    g = Groups.of(arrays)
    assert g.world.tolist() == [float(p.gpus) for p in plans] == arrays.gpus.astype(float).tolist()
    assert g.gradient.tolist() == [8.0, 2.0, 12.0]
    assert g.expert_dp.tolist() == [1.0, 2.0, 12.0]
    assert g.expert_dp_stride.tolist() == [8.0, 8.0, 8.0]
    assert g.stage.tolist() == [float(p.gpus // p.pp) for p in plans] == [8.0, 16.0, 24.0]
    assert g.expert_stride.tolist() == [1.0, 8.0, 8.0]
    for i, p in enumerate(plans):
        one = Groups.of_plan(p)
        assert (one.gradient, one.expert_dp, one.world) == (g.gradient[i], g.expert_dp[i], g.world[i])
    assert g.dp.dtype == np.float64
