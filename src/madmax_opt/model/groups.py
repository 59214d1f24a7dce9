"""Process-group sizes of a plan (or of every plan in a plan array), derived once from its degrees.

Megatron-Core rank order tp-cp-ep-dp-pp (``megatron/core/parallel_state.py``, RankGenerator order "tp-cp-ep-dp-pp"):
    tensor parallel        tp                       (consecutive ranks)
    context parallel       cp
    data parallel          dp
    gradient (and ZeRO)    dp * cp                  (gradients are reduced, and ZeRO shards, over dp x cp)
    pipeline stage         dp * tp * cp             (the GPUs of one stage; the p2p stride between stages)
    expert parallel        ep                       (inside dp x cp, stride tp * cp)
    expert data parallel   dp * cp / ep             (stride tp * cp * ep)
    pipeline parallel      pp
    world                  dp * tp * pp * cp        (ep subdivides dp x cp, it adds no GPUs)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from madmax_opt.core.numeric import Arr
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import Plan

N = TypeVar("N", float, Arr)  # one plan's sizes (floats) or a column per plan


@dataclass(frozen=True)
class Groups(Generic[N]):
    """The parallel degrees of a plan and every process-group size derived from them."""

    dp: N
    tp: N
    pp: N
    cp: N
    ep: N

    @staticmethod
    def of(plans: PlanArrays) -> Groups[Arr]:
        """The groups of every plan in ``plans`` (float columns, as the cost model computes)."""
        return Groups(
            dp=plans.dp.astype(float), tp=plans.tp.astype(float), pp=plans.pp.astype(float),
            cp=plans.cp.astype(float), ep=plans.ep.astype(float),
        )

    @staticmethod
    def of_plan(plan: Plan) -> Groups[float]:
        """The groups of one plan."""
        return Groups(dp=float(plan.dp), tp=float(plan.tp), pp=float(plan.pp), cp=float(plan.cp), ep=float(plan.ep))

    @property
    def gradient(self) -> N:
        """dp * cp: the group gradients are reduced over (and ZeRO / FSDP shards over)."""
        return self.dp * self.cp

    @property
    def stage(self) -> N:
        """dp * tp * cp: the GPUs of one pipeline stage (and the rank stride between neighbouring stages)."""
        return self.dp * self.tp * self.cp

    @property
    def expert_stride(self) -> N:
        """tp * cp: the rank stride of the expert-parallel group (its ranks are consecutive inside dp x cp)."""
        return self.tp * self.cp

    @property
    def expert_dp(self) -> N:
        """dp * cp / ep: the expert-data-parallel group routed-expert gradients are reduced over."""
        return self.gradient / self.ep

    @property
    def expert_dp_stride(self) -> N:
        """tp * cp * ep: the rank stride of the expert-data-parallel group."""
        return self.tp * self.cp * self.ep

    @property
    def world(self) -> N:
        """dp * tp * pp * cp: the GPUs of the plan."""
        return self.dp * self.tp * self.pp * self.cp
