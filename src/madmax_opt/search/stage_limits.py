"""The problem's constraints on an uneven / mixed pipeline: min_throughput, deadline_hours, budget_usd, max_gpus and
max_cost_per_hour.

The uniform search (search/solver.py ``limits``) keeps a plan when its rounded step time is at most the step the
throughput floor allows (``max_step_us``) and its run, priced by ``run_cost_usd`` at that step time, fits the budget.
The uneven search applies the same two tests to its step time p v T / (p v) (stages.stage_model): both are upper
limits on the integer objective p v T of a base, given the deployment's $/h (one option: its price x GPUs; mixed
stages: per_stage x the prices of the stages' systems, fixed by a composition, stage_compositions.compositions).
max_gpus and max_cost_per_hour exclude a deployment as search/assemble.cluster_limits does (GPUs; $/h in integer
cents).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import SECONDS_PER_HOUR, US
from madmax_opt.model.groups import Groups
from madmax_opt.model.objectives import run_cost_usd
from madmax_opt.model.plan import PlanArrays
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
    max_gpus: int | None = None
    max_cost_per_hour: float | None = None

    @property
    def active(self) -> bool:
        return any(x is not None for x in (self.max_step_us, self.budget_usd, self.max_gpus, self.max_cost_per_hour))

    @property
    def priced(self) -> bool:
        """Whether a deployment's $/h matters (a budget or a $/h limit)."""
        return self.budget_usd is not None or self.max_cost_per_hour is not None

    def deployment_ok(self, gpus: int, usd_per_hour: float) -> bool:
        """max_gpus and max_cost_per_hour as assemble.cluster_limits applies them (integer cents per hour)."""
        if self.max_gpus is not None and gpus > self.max_gpus:
            return False
        return self.max_cost_per_hour is None or round(usd_per_hour * 100) <= round(self.max_cost_per_hour * 100)

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
    return StepLimits(max_step_us, constraints.budget_usd, task.train_tokens, tokens_per_step, words,
                      constraints.max_gpus, constraints.max_cost_per_hour)


def binding(limits: StepLimits, fastest_s: float | None, cheapest_usd: float | None, fewest_gpus: int,
            least_usd_per_hour: float) -> str:
    """The constraint no uneven plan meets, named with the best value an uneven plan reaches (``fastest_s``: the
    fastest plan's step; ``cheapest_usd``: the cheapest run; the smallest pipeline and the least $/h of any)."""
    reasons = []
    if limits.max_gpus is not None and fewest_gpus > limits.max_gpus:
        reasons.append(f"max_gpus={limits.max_gpus}: the smallest uneven pipeline has {fewest_gpus} GPUs")
    if limits.max_cost_per_hour is not None and not limits.deployment_ok(0, least_usd_per_hour):
        reasons.append(f"max_cost_per_hour={limits.max_cost_per_hour}: the cheapest uneven pipeline costs at least "
                       f"${least_usd_per_hour:.2f}/h")
    if limits.max_step_us is not None and fastest_s is not None and fastest_s * US > limits.max_step_us:
        reasons.append(f"{limits.floor_words}: the fastest uneven plan reaches {limits.tokens_per_step / fastest_s:.4g} "
                       "tokens/s")
    if limits.budget_usd is not None and cheapest_usd is not None and cheapest_usd > limits.budget_usd:
        reasons.append(f"budget_usd={limits.budget_usd:g} (task.train_tokens {limits.train_tokens:.4g} at the plan's "
                       f"$/h): the cheapest uneven plan's run costs ${cheapest_usd:.4g}")
    detail = "; ".join(reasons) or "the constraints together exclude every uneven plan"
    return f"no feasible plan meets the constraints (binding constraint: {detail})"


def usd_per_hour(model: Model, base: PlanArrays, hws: list[int], counts: dict[int, int] | None) -> float:
    """$/h of ``base``'s pipeline: its option's price x GPUs, or with stages per hardware choice fixed (mixed),
    dp tp cp GPUs per stage at each stage's price (evaluator._mixed_hardware); unfixed mixed stages share a price."""
    pr = model.problem
    if not pr.space.mixed_stages:
        return float(model.table.price_per_gpu_hour[int(base.hw[0])] * base.gpus[0])
    per_stage = int(Groups.of(base).stage[0])
    stages = counts or {hws[0]: int(base.pp[0])}
    return float(sum(pr.hardware[h].system.price_per_gpu_hour * per_stage * k for h, k in stages.items()))
