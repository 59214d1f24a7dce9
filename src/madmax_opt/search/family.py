"""The workload families and what each one does: the one place that dispatches on a problem's family.

A :class:`Family` says what the commands need from training, steady serving, online serving (Poisson arrivals)
and recommender (DLRM) problems: its plan type, the launch formats it emits (launch/registry.py kind), how it is
solved, verified and evaluated, and which studies apply. ``family_of(problem)`` reads ``problem.family``
(model/family_name.py) and returns its entry of :data:`FAMILIES`; callers (studies, fleet, launch, report, cli)
use the entry's attributes instead of asking the task what it is. The search entry points stay where they are
(search/solves.py, search/brute_force.py, search/serving.py, search/online.py, search/dlrm_search.py); the
entries import them when called. ``search/result.solve_result`` and ``search/verify.verify_problem`` are the
commands' entry points: they look the family up here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from madmax_opt.model.family_name import FamilyName
from madmax_opt.model.problem import DLRMProblem, Problem
from madmax_opt.model.spec import Plan
from madmax_opt.search.solves import SearchOptions

if TYPE_CHECKING:  # imported when a family's plans are read: a training solve never loads the serving space
    from madmax_opt.model.dlrm_spec import DLRMPlan
    from madmax_opt.search.serving_space import ServingPlan

LaunchKind = Literal["training", "serving"]


@dataclass(frozen=True)
class Family:
    """One workload family: its plans, launch formats, search verbs and the studies that apply (None or False marks
    a verb it does not have)."""

    name: FamilyName
    label: str  # the word users read in messages: online problems are serving problems
    plan_class: Callable[[], type[Plan] | type[DLRMPlan]]  # its plan type, imported on first use
    launch_kind: LaunchKind | None  # the launch formats it emits; None: none
    solve: Callable[[Any, SearchOptions], dict[str, Any]]  # the JSON object of ``solve --json``
    evaluate: Callable[[Any, Sequence[Any], str], list[Any]]  # (problem, plans, plan file) -> records, in order
    verify: Callable[[Any, SearchOptions], dict[str, Any]] | None = None  # solver vs brute force
    top_k: bool = True  # returns a ranked top-k (recommenders return one plan)
    sensitivity: bool = False
    timeline: bool = False
    pareto: bool = False  # throughput (or arrival rate) vs latency: serving only
    ops: bool = False  # evaluate --ops: the op table of one transformer layer (model/ops.py)
    rerank: bool = False  # solve --rerank / --plot: the top-k re-ranked by simulated step time (report/timeline.py)

    @property
    def plan_type(self) -> type[Plan] | type[DLRMPlan]:
        return self.plan_class()

    @property
    def serving(self) -> bool:
        """Whether its plans are serving plans (steady or online serving)."""
        return self.name in (FamilyName.SERVING, FamilyName.ONLINE)


def _training_plan() -> type[Plan]:
    return Plan


def _serving_plan() -> type[ServingPlan]:
    from madmax_opt.search.serving_space import ServingPlan

    return ServingPlan


def _recommender_plan() -> type[DLRMPlan]:
    from madmax_opt.model.dlrm_spec import DLRMPlan

    return DLRMPlan


# ------------------------------------------------------------------------------- the search entry points


def _solve_training(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search import solves

    return solves.solve_training(problem, o)


def _solve_serving(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search import solves

    return solves.solve_steady_serving(problem, o)


def _solve_online(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search import solves

    return solves.solve_online_serving(problem, o)


def _solve_recommender(problem: DLRMProblem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search.dlrm_search import dlrm_solve_result

    return dict(dlrm_solve_result(problem, o.time_limit_s, o.workers, cpsat=o.cpsat))


def _evaluate_training(problem: Problem, plans: Sequence[Plan], plan_file: str) -> list[Any]:
    from madmax_opt.analysis.evaluator import evaluate

    return list(evaluate(problem, list(plans)))


def _evaluate_serving(problem: Problem, plans: Sequence[Any], plan_file: str) -> list[Any]:
    from madmax_opt.search.serving import evaluate_serving

    return evaluate_serving(problem, list(plans))


def _evaluate_online(problem: Problem, plans: Sequence[Any], plan_file: str) -> list[Any]:
    from madmax_opt.search.online import evaluate_online

    return evaluate_online(problem, list(plans))


def _evaluate_recommender(problem: DLRMProblem, plans: Sequence[DLRMPlan], plan_file: str) -> list[Any]:
    from madmax_opt.search.dlrm_search import evaluate_dlrm

    return evaluate_dlrm(problem, list(plans), plan_file)


def _verify_training(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search import brute_force

    return brute_force.verify_training(problem, o)


def _verify_serving(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search import brute_force

    return brute_force.verify_steady_serving(problem, o)


def _verify_online(problem: Problem, o: SearchOptions) -> dict[str, Any]:
    from madmax_opt.search.online import verify_online  # the online search, not the steady-state one

    return verify_online(problem, o.cpsat)


FAMILIES: dict[FamilyName, Family] = {f.name: f for f in (
    Family(FamilyName.TRAINING, "training", _training_plan, "training", _solve_training, _evaluate_training,
           _verify_training, sensitivity=True, timeline=True, ops=True, rerank=True),
    Family(FamilyName.SERVING, "serving", _serving_plan, "serving", _solve_serving, _evaluate_serving,
           _verify_serving, sensitivity=True, timeline=True, pareto=True),
    Family(FamilyName.ONLINE, "serving", _serving_plan, "serving", _solve_online, _evaluate_online, _verify_online,
           sensitivity=True, timeline=True, pareto=True),
    Family(FamilyName.RECOMMENDER, "recommender", _recommender_plan, None, _solve_recommender, _evaluate_recommender,
           top_k=False),
)}


__all__ = ["FAMILIES", "Family", "LaunchKind", "SearchOptions", "family_of"]


def family_of(problem: Problem | DLRMProblem) -> Family:
    """The family of a resolved problem (``problem.family``)."""
    return FAMILIES[problem.family]
