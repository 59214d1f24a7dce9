"""Robust choice: which returned training plans the error bars cannot tell from the best, and the plan with the
best worst case (``solve --robust``, or ``objective: {robust: true}`` in the problem file).

Every training objective is proportional to the step time (tokens per step are fixed: model/objectives.py), so a
record's step-time interval [lo, hi] x predicted (core/intervals.py, from the residuals of the calibration level
that priced it) bounds its objective value v at [v lo, v hi]. A plan is indistinguishable from the best when
v lo <= v_best hi_best (the intervals overlap); the robust choice minimises the worst case v hi. Candidates: the
returned top plans and, over several systems, each system's best (``options``). Plans on one hardware option
share a calibration and so its error: for them the overlap test is conservative (their order rarely flips).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from madmax_opt.analysis.records import Record
from madmax_opt.model.groups import Groups
from madmax_opt.model.objectives import objective_values, stage_rates
from madmax_opt.model.plan_settings import PARALLEL_DEGREES
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan


def objective_value(problem: Problem, rec: Record) -> float:
    """The value the problem's objective minimises for one training record."""
    systems = {o.system.name: o.system for o in problem.hardware}
    plan = rec["plan"]
    if plan.get("stage_systems"):  # a mixed pipeline: each stage's GPUs on its own system
        degrees = Plan(**{k: plan[k] for k in PARALLEL_DEGREES if k in plan})
        names, per = list(plan["stage_systems"]), Groups.of_plan(degrees).stage
    else:
        names, per = [str(plan.get("system") or rec["hardware"]["system"])], float(rec["hardware"]["gpus"])
    listed = tuple(systems[n] for n in dict.fromkeys(names))
    index = {s.name: j for j, s in enumerate(listed)}
    rates = stage_rates(np.array([1.0 / rec["tokens_per_s"]]), listed, [index[n] for n in names], per,
                        problem.training_task.train_tokens)  # a uniform plan: one "stage" of all its GPUs
    return float(objective_values(problem.objective, rates)[0])


def factors(rec: Record) -> tuple[float, float]:
    """(lo, hi) of the record's step-time interval as factors on the prediction; (1, 1) without one."""
    iv = rec.get("interval")
    if not iv or "step_time_s" not in iv:
        return 1.0, 1.0
    lo, hi = iv["step_time_s"]
    return lo / rec["step_time_s"], hi / rec["step_time_s"]


def robust_summary(problem: Problem, candidates: list[Record]) -> dict[str, Any]:
    """Per candidate (best first; None where infeasible): the objective value and its interval; the 0-based
    candidates indistinguishable from the best, and the one with the best worst case (None without a feasible
    candidate). Numbers, strings and lists only (sweep rows refuse true/false)."""
    value: list[float | None] = []
    low: list[float | None] = []
    worst: list[float | None] = []
    for r in candidates:
        v = objective_value(problem, r) if r["feasible"] else None
        lo, hi = factors(r)
        value.append(v)
        low.append(None if v is None else v * lo)
        worst.append(None if v is None else v * hi)
    feasible = [i for i, v in enumerate(value) if v is not None]
    out: dict[str, Any] = {"objective": problem.objective, "value": value, "best_case": low, "worst_case": worst,
                           "indistinguishable_from_best": [], "robust_choice": None}
    if feasible:
        best_worst = worst[feasible[0]]
        out["indistinguishable_from_best"] = [i for i in feasible if low[i] <= best_worst]  # type: ignore[operator]
        out["robust_choice"] = min(feasible, key=lambda i: (worst[i], i))
    return out


def _key(rec: Record) -> tuple[Any, ...]:
    return (tuple(sorted((k, str(v)) for k, v in rec["plan"].items())), rec["hardware"]["system"],
            rec["hardware"]["gpus"])


def with_robust(problem: Problem, result: dict[str, Any], robust: bool) -> dict[str, Any]:
    """``result`` (a training solve) with its ``robust`` summary; with ``robust`` (``solve --robust``) or the
    problem's ``objective: {robust: true}`` its best (and the head of top) is the candidate with the best worst
    case."""
    robust = robust or problem.robust
    top: list[Record] = list(result["top"])
    seen = {_key(r) for r in top}
    extra = [row["best"] for row in result.get("options", []) if row.get("best") and _key(row["best"]) not in seen]
    candidates = top + extra
    summary = robust_summary(problem, candidates)
    chosen_by = "robust worst case" if robust else "predicted value"
    out = {**result, "robust": {**summary, "best_chosen_by": chosen_by, "top": len(top)}}
    k = summary["robust_choice"]
    if robust and k is not None and k != 0:
        chosen = candidates[k]
        out["best"] = chosen
        out["top"] = [chosen, *[r for i, r in enumerate(top) if i != k]]
        base = result.get("baseline")
        if base and base["feasible"]:
            out["speedup_vs_baseline"] = chosen["tokens_per_s"] / base["tokens_per_s"]
    return out
