"""Before a plan is emitted: the evaluator's validity and memory checks, named by the evaluator's own rule.

A plan the evaluator calls invalid (a shape rule: dp x tp x pp = GPUs, tp divides the heads, dp x mbs divides the
global batch, ep on a dense model, stage layers summing to the model's, prefill_replicas below dp, a precision the
GPU lacks, ...) is refused (exit 2); a valid plan that does not fit in memory (or uses more GPUs than the supply)
is infeasible (exit 3). Missed latency or throughput targets are not launch errors: the server still starts.
The rules are the evaluator's (``model.training.INVALID_REASONS``, ``model.serving_workload.INVALID_REASONS``);
nothing is recomputed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.model import serving_workload, training
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.search.family import family_of
from madmax_opt.search.serving import to_records
from madmax_opt.search.serving_space import ServingModel, as_serving_plan, candidates


@dataclass(frozen=True)
class PlanCheck:
    """Why the evaluator rejects a plan: ``invalid`` (a rule of the plan's shape) or ``infeasible`` (memory)."""

    kind: Literal["invalid", "infeasible"]
    rule: str


def plan_check(problem: Problem, plan: Plan) -> PlanCheck | None:
    """The evaluator's verdict on ``plan`` (None: valid and fits). A plan the evaluator cannot read at all (a GPU
    count no hardware option has, fp4 on a GPU without fp4, ep on a dense model) raises its ProblemError."""
    if family_of(problem).serving:
        return _serving_check(problem, plan)
    rec = evaluate(problem, [plan])[0]
    reason = rec["infeasible_reason"]
    if rec["feasible"] or reason is None:
        return None
    shape_rules = {r for code, r in training.INVALID_REASONS.items() if code != training.MEMORY_REASON}
    return PlanCheck("invalid" if reason in shape_rules else "infeasible", reason)


def _serving_check(problem: Problem, plan: Plan) -> PlanCheck | None:
    model = ServingModel(problem)
    sp = as_serving_plan(plan, problem)
    # validity and memory do not depend on the batch (the memory rule is one sequence); arrays() takes batch or 1
    c = candidates(model, model.arrays([sp]))
    code = int(c.terms.invalid[0])
    if code == 0:
        return None
    if code == serving_workload.MEMORY_REASON:
        return PlanCheck("infeasible", str(to_records(model, c)[0]["infeasible_reason"]))
    return PlanCheck("invalid", serving_workload.INVALID_REASONS[code])


def check_before_emit(problem: Problem, plan: Plan, plan_file: str, at: str = "", force: bool = False) -> None:
    """Raise the one-line error of a plan the evaluator rejects, naming the plan file (``at``: ``[i]`` of a list)
    and the rule: ProblemError (exit 2) when invalid, InfeasibleError (exit 3) when it does not fit, unless
    ``force`` (which never overrides invalidity)."""
    try:
        verdict = plan_check(problem, plan)
    except ProblemError as exc:  # the evaluator names the problem file and plan.FIELD: the plan file holds it
        if exc.field is None or not (exc.field == "plan" or exc.field.startswith("plan.")):
            raise
        field = ".".join(x for x in (at, exc.field.removeprefix("plan").lstrip(".")) if x)
        raise ProblemError(exc.message, file=plan_file, field=field or None) from None
    if verdict is None:
        return
    where = f"{plan_file}: {at}: " if at else f"{plan_file}: "
    if verdict.kind == "invalid":
        raise ProblemError(f"invalid plan (the evaluator's rule): {verdict.rule}", file=plan_file, field=at or None)
    if not force:
        raise InfeasibleError(f"{where}infeasible plan: {verdict.rule} (--force emits it anyway)")
