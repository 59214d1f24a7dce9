"""What each transformer family's solve runs (search/family.py calls these): training, steady-state serving and
online serving, each with the best plan of every system when the problem lists several (co-design), and the
options every family's solve and verify take."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.problem import Problem
from madmax_opt.search.cpsat import CpSatOptions

if TYPE_CHECKING:
    from madmax_opt.analysis.records import TrainingSolveResult
    from madmax_opt.search.serving_space import ServingCandidates, ServingModel


@dataclass(frozen=True)
class SearchOptions:
    """What a family's solve and verify take: the CLI's --top-k, --time-limit, --workers, the command's CP-SAT
    options (None: from time limit and workers) and --robust (training)."""

    top_k: int = 1
    time_limit_s: float = 60.0
    workers: int = 1
    cpsat: CpSatOptions | None = None
    robust: bool = False


def solve_online_serving(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    """Online serving: Poisson arrivals, percentiles (search/online.py); each system's best with several."""
    from madmax_opt.search.online import solve_online

    # several systems: each system's best from the same search (search/online.py online_options)
    return solve_online(problem, o.top_k, cpsat=o.cpsat, workers=o.workers, each_system=_systems(problem) > 1)


def solve_steady_serving(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    """Steady-state serving plans (search/serving.py); each system's best with several."""
    from madmax_opt.search import serving

    result, model, c = serving.solve_result_with(problem, o.top_k, o.time_limit_s, o.workers, cpsat=o.cpsat)
    if _systems(problem) > 1:
        result["options"] = _serving_options(problem, result, model, c)
    return result


def solve_training(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    """Training plans (search/solver.py): best, top-k, baseline and speedup; each system's best with several."""
    from madmax_opt.analysis.evaluator import evaluate
    from madmax_opt.search.robust import with_robust
    from madmax_opt.search.solver import solve_records

    outcome, records = solve_records(problem, top_k=o.top_k, time_limit_s=o.time_limit_s, workers=o.workers,
                                     cpsat=o.cpsat)
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
    result = dict(out)
    if _systems(problem) > 1:
        result["options"] = _training_options(problem, outcome)
    return with_robust(problem, result, o.robust)


# ------------------------------------------------------------------- co-design: the best plan of each system


def _systems(problem: Problem) -> int:
    return len({o.system.name for o in problem.hardware})


def compare_systems(
    problem: Problem,
    objective: NDArray[np.int64],
    order: NDArray[np.int64],
    hw: NDArray[np.int64],
    optimum: float | None,
    record: Callable[[int], dict[str, Any]],
    why_not: Callable[[str], str],
) -> list[dict[str, Any]]:
    """The best admissible plan on each system the problem lists (over its GPU counts) and how far its objective is
    from the optimum: ``vs_optimum`` = objective / optimum - 1 (every objective is minimised: +0.68 = 68 % more
    $ or seconds per token). ``order``: admissible candidates best first (the brute-force reference order), so the
    first one of each system is that system's best; ``optimum``: the solve's objective in the same integer units."""
    names = [o.system.name for o in problem.hardware]
    first: dict[str, int] = {}
    for i, h in zip(order.tolist(), hw[order].tolist(), strict=True):
        first.setdefault(names[h], int(i))
    best = min([float(objective[i]) for i in first.values()] + ([optimum] if optimum is not None else []))
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(names):
        if name in first:
            i = first[name]
            rows.append({"system": name, "best": record(i), "objective": float(objective[i]),
                         "vs_optimum": float(objective[i]) / best - 1.0 if best > 0 else 0.0, "reason": None})
        else:
            rows.append({"system": name, "best": None, "objective": None, "vs_optimum": None, "reason": why_not(name)})
    rows.sort(key=lambda r: (r["vs_optimum"] is None, r["vs_optimum"] or 0.0))
    return rows


def _training_options(problem: Problem, outcome: Any) -> list[dict[str, Any]]:
    from madmax_opt.analysis.evaluator import Model, to_records
    from madmax_opt.core.errors import InfeasibleError
    from madmax_opt.search.solver import brute_force_order, candidates, explain_infeasible

    model = Model(problem)
    c = outcome.candidates

    def why_not(system: str) -> str:
        try:
            sub = Model(problem.on_system(system))
            return explain_infeasible(sub, candidates(sub))
        except (InfeasibleError, ProblemError) as exc:
            return str(exc)

    order = brute_force_order(model, c, problem.objective)
    names = [o.system.name for o in problem.hardware]
    first: dict[str, int] = {}  # each system's best (compare_systems' rule), its records made in one evaluation
    for i, h in zip(order.tolist(), c.plans.hw[order].tolist(), strict=True):
        first.setdefault(names[h], int(i))
    at = list(first.values())
    records = dict(zip(at, to_records(model, c.plans.take(at)), strict=True)) if at else {}
    return compare_systems(problem, c.objective(problem.objective), order, c.plans.hw, outcome.objective,
                           lambda i: dict(records[i]), why_not)


def _serving_options(problem: Problem, result: dict[str, Any], model: ServingModel,
                     c: ServingCandidates) -> list[dict[str, Any]]:
    """Each system's best plan among the candidates the solve priced (``model``, ``c``: the solve's own)."""
    from madmax_opt.core.errors import InfeasibleError
    from madmax_opt.search import serving

    def why_not(system: str) -> str:
        try:
            sub = serving.ServingModel(problem.on_system(system))
            return serving.explain_infeasible(sub, serving.candidates(sub))
        except (InfeasibleError, ProblemError) as exc:
            return str(exc)

    return compare_systems(problem, c.objective(problem.objective), serving.brute_force_order(model, c,
                           problem.objective), c.plans.hw, result["solver"]["objective"],
                           lambda i: serving.to_records(model, c, [i])[0], why_not)
