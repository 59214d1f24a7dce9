"""Plans as columns of integer arrays (one entry per plan): the evaluator's and the enumerator's currency."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from madmax_opt.core.numeric import IntArr
from madmax_opt.model.plan_settings import degree_settings
from madmax_opt.model.spec import RECOMPUTE_MODES, Plan

KNOBS: tuple[str, ...] = degree_settings()  # the Plan model's degrees, modes and flags, in declaration order


@dataclass(frozen=True)
class PlanArrays:
    """Struct of arrays. ``recompute`` is an index into RECOMPUTE_MODES; ``hw`` into the problem's options."""

    dp: IntArr
    tp: IntArr
    pp: IntArr
    cp: IntArr
    vpp: IntArr
    mbs: IntArr
    zero: IntArr
    recompute: IntArr
    sp: IntArr
    hw: IntArr
    ep: IntArr = field(default=None)  # type: ignore[arg-type]  # expert parallelism (MoE); omitted = 1

    def __post_init__(self) -> None:
        if self.ep is None:
            object.__setattr__(self, "ep", np.ones_like(self.dp))

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def gpus(self) -> IntArr:
        return self.dp * self.tp * self.pp * self.cp

    def slice(self, start: int, stop: int) -> PlanArrays:
        """Plans start..stop-1 as views (no copy)."""
        return PlanArrays(**{f.name: getattr(self, f.name)[start:stop] for f in fields(self)})

    def take(self, index: IntArr | Sequence[int]) -> PlanArrays:
        idx = np.asarray(index, dtype=np.int64)
        return PlanArrays(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[PlanArrays]) -> PlanArrays:
        return PlanArrays(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(PlanArrays)}
        )

    @staticmethod
    def from_plans(plans: Iterable[Plan], hw_index: Sequence[int]) -> PlanArrays:
        plans = list(plans)

        def col(values: Iterable[int]) -> IntArr:
            return np.array(list(values), dtype=np.int64)

        return PlanArrays(
            dp=col(p.dp for p in plans),
            tp=col(p.tp for p in plans),
            pp=col(p.pp for p in plans),
            cp=col(p.cp for p in plans),
            vpp=col(p.vpp for p in plans),
            mbs=col(p.mbs for p in plans),
            zero=col(p.zero for p in plans),
            recompute=col(RECOMPUTE_MODES.index(p.recompute) for p in plans),
            sp=col(int(p.sp) for p in plans),
            hw=col(hw_index),
            ep=col(p.ep for p in plans),
        )

    def plan(self, i: int, system: str | None = None) -> Plan:
        return Plan(
            dp=int(self.dp[i]),
            tp=int(self.tp[i]),
            pp=int(self.pp[i]),
            cp=int(self.cp[i]),
            vpp=int(self.vpp[i]),
            mbs=int(self.mbs[i]),
            zero=int(self.zero[i]),
            recompute=RECOMPUTE_MODES[int(self.recompute[i])],
            sp=bool(self.sp[i]),
            ep=int(self.ep[i]),
            system=system,
        )
