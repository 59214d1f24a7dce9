"""The result of a solve as users see it (``madmax-opt solve --json``, sweep rows): status, best and top-k
records, solver summary, baseline and speedup; training and serving problems alike."""

from __future__ import annotations

from typing import Any

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.analysis.records import TrainingSolveResult
from madmax_opt.model.problem import Problem
from madmax_opt.search.cpsat import CpSatOptions


def solve_result(
    problem: Problem, top_k: int, time_limit: float, workers: int, cpsat: CpSatOptions | None = None
) -> dict[str, Any]:
    """The JSON object of ``solve --json``."""
    from madmax_opt.search import serving
    from madmax_opt.search.solver import solve_records

    if problem.task.kind == "inference" and getattr(problem.task, "arrival_rate", None) is not None:
        from madmax_opt.search.online import solve_online  # online serving: Poisson arrivals, percentiles

        return solve_online(problem, top_k)
    if problem.task.kind == "inference":  # serving plans
        return serving.solve_result(problem, top_k, time_limit, workers, cpsat=cpsat)
    outcome, records = solve_records(problem, top_k=top_k, time_limit_s=time_limit, workers=workers, cpsat=cpsat)
    baseline = evaluate(problem, [problem.baseline])[0] if problem.baseline else None
    speedup = None
    if baseline and baseline["feasible"]:
        speedup = records[0]["tokens_per_s"] / baseline["tokens_per_s"]
    summary = outcome.summary()  # describes the search that produced the returned plan
    out: TrainingSolveResult = {  # typed: mypy checks the keys of the training solve JSON
        "status": outcome.status,
        "objective": problem.objective,
        "best": records[0],
        "top": records,
        "solver": summary,
        "baseline": baseline,
        "speedup_vs_baseline": speedup,
    }
    return dict(out)
