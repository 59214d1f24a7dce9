"""The problem's step-time constraints on an uneven / mixed pipeline: min_throughput, deadline_hours, budget_usd.

The uniform search (search/solver.py ``limits``) keeps a plan when its rounded step time is at most the step the
throughput floor allows (``max_step_us``) and its run, priced by ``run_cost_usd`` at that step time, fits the budget.
The uneven search applies the same two tests to its step time p v T / (p v) (stages.stage_model): both are upper
limits on the integer objective p v T of a base, given the deployment's $/h (one option: its price x GPUs; mixed
stages: per_stage x the prices of the stages' systems, fixed by a composition, stages._compositions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from madmax_opt.core.units import SECONDS_PER_HOUR, US
from madmax_opt.model.objectives import run_cost_usd
from madmax_opt.model.spec import Constraints, Task


@dataclass(frozen=True)
class StepLimits:
    """What the constraints allow an uneven plan: ``max_step_us`` (the throughput floor's step, None: no floor) and
    ``budget_usd`` over a run of ``train_tokens`` at ``tokens_per_step`` (None: no budget)."""

    max_step_us: int | None = None
    budget_usd: float | None = None
    train_tokens: float | None = None
    tokens_per_step: float = 1.0
    floor_words: str = ""  # the throughput floor as the problem states it (min_throughput or deadline_hours)

    @property
    def active(self) -> bool:
        return self.max_step_us is not None or self.budget_usd is not None

    def run_usd(self, step_s: float, usd_per_hour: float) -> float:
        """US$ of the run: train_tokens / (tokens/step / step_s) / 3600 s/h hours x $/h (solver.run_usd)."""
        assert self.train_tokens is not None, "budget_usd needs task.train_tokens (checked when loading)"
        return float(run_cost_usd(self.train_tokens * step_s / self.tokens_per_step / SECONDS_PER_HOUR, usd_per_hour))

    def max_objective(self, pv: int, usd_per_hour: float) -> int | None:
        """The largest p v T (integer us x p v) the constraints allow on a deployment of ``usd_per_hour``."""
        caps = []
        if self.max_step_us is not None:  # step_us = p v T / (p v) <= max_step_us
            caps.append(pv * self.max_step_us)
        if self.budget_usd is not None:
            if usd_per_hour <= 0:  # a free deployment meets any budget
                return min(caps) if caps else None
            top = math.floor(self.budget_usd / usd_per_hour * SECONDS_PER_HOUR * self.tokens_per_step
                             / (self.train_tokens or 1.0) * US * pv)
            # the budget test as the uniform search applies it (run_usd > budget excludes), at p v T / (p v)
            while top >= 0 and self.run_usd(top / pv / US, usd_per_hour) > self.budget_usd:
                top -= 1
            while self.run_usd((top + 1) / pv / US, usd_per_hour) <= self.budget_usd:
                top += 1
            caps.append(top)
        return min(caps) if caps else None


def step_limits(task: Task, constraints: Constraints, tokens_per_step: float,
                max_step_us: int | None) -> StepLimits:
    """``StepLimits`` of a problem; ``max_step_us``: the uniform search's step for the throughput floor (None: no
    floor), so that both searches apply one integer limit."""
    floor = constraints.throughput_floor(task.train_tokens)
    deadline = constraints.deadline_floor(task.train_tokens)
    words = ""
    if floor is not None:  # the constraint the user wrote that binds (solver.explain_infeasible words it alike)
        words = (f"deadline_hours={constraints.deadline_hours:g} (task.train_tokens {task.train_tokens:.4g} in "
                 f"{constraints.deadline_hours:g} h needs {floor:.4g} tokens/s)" if deadline is not None
                 and deadline >= floor else f"min_throughput={floor:.4g} tokens/s")
    return StepLimits(max_step_us, constraints.budget_usd, task.train_tokens, tokens_per_step, words)


def binding(limits: StepLimits, fastest_s: float | None, cheapest_usd: float | None) -> str:
    """The constraint no uneven plan meets, named with the best value an uneven plan reaches (``fastest_s``: the
    fastest plan's step; ``cheapest_usd``: the cheapest run)."""
    reasons = []
    if limits.max_step_us is not None and fastest_s is not None and fastest_s * US > limits.max_step_us:
        reasons.append(f"{limits.floor_words}: the fastest uneven plan reaches {limits.tokens_per_step / fastest_s:.4g} "
                       "tokens/s")
    if limits.budget_usd is not None and cheapest_usd is not None and cheapest_usd > limits.budget_usd:
        reasons.append(f"budget_usd={limits.budget_usd:g} (task.train_tokens {limits.train_tokens:.4g} at the plan's "
                       f"$/h): the cheapest uneven plan's run costs ${cheapest_usd:.4g}")
    detail = "; ".join(reasons) or "the constraints together exclude every uneven plan"
    return f"no feasible plan meets the constraints (binding constraint: {detail})"
