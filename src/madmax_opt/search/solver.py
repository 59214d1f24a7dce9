"""Training search: enumerate candidates with the exact cost model, round their terms, select the best exactly.

Design (docs/reference/solver-notes.md, "enumerate, then assemble"; the assembly of one plan is a sort): every cost term of the model depends on
5-7 of the 9 knobs, so the terms are computed for all candidates at once by the vectorised model
(``training.training_terms``), each additive term is rounded once to an integer (microseconds; the objectives in
their units, search/objectives.py), every plan is checked against the linear side constraints (GPU count, GPU
supply per type, $/hour budget, minimum throughput, run budget), and the best admissible plans are selected by an
exact sort (``selection.select_best``; ties by enumeration order). Within one hardware option every constraint is
monotone in the step time, so only the ``k`` best candidates of each option can be in the top-k; the rest are
pruned while the space streams (exact, not a heuristic). CP-SAT models are built by the uneven- and mixed-stage
search (search/stages.py), which the summary's ``method`` names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import (
    Metrics,
    Model,
    invalid_reason,
    metrics,
    staged_record,
    to_records,
)
from madmax_opt.analysis.records import TrainingRecord
from madmax_opt.core.errors import InfeasibleError, InternalError, ProblemError
from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import SECONDS_PER_HOUR, US
from madmax_opt.model.objectives import Rates, run_cost_usd, uniform_rates
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import INVALID_REASONS, MEMORY_REASON, STEP_TERMS
from madmax_opt.search.assemble import (
    IntObjective,
    Limit,
    admissible_mask,
    brute_force,
    cluster_limits,
    solver_summary,
    supplies,
)
from madmax_opt.search.cpsat import INT_LIMIT, CpSatOptions, time_limit_error, to_int, warn_if_unused
from madmax_opt.search.cpsat import options as cpsat_options
from madmax_opt.search.objectives import UUSD, integer_objective, training_units  # noqa: F401 (UUSD: re-export)
from madmax_opt.search.option_bound import step_floor_us
from madmax_opt.search.prune import ROUNDING_TOLERANCE_S, best_candidates, space_candidates
from madmax_opt.search.selection import METHOD, UNEVEN_DP, select_best
from madmax_opt.search.space import empty_space_reason

if TYPE_CHECKING:  # the uneven-stage search is imported when a space allows uneven stages
    from madmax_opt.search.stages import UnevenResult


@dataclass
class Candidates:
    """Enumerated plans with their float metrics and the rounded integer columns CP-SAT sees."""

    plans: PlanArrays
    met: Metrics
    evaluated: int | None = None  # plans the search evaluated to find these (None: these)
    step_us: IntArr = field(init=False)
    cost_cents_per_hour: IntArr = field(init=False)

    def __post_init__(self) -> None:
        terms = self.met.terms.time
        step = np.sum([to_int(terms[k] * US) for k in STEP_TERMS], axis=0)  # each term rounded once
        self.step_us = np.minimum(step, INT_LIMIT)  # saturated: a step beyond the range is refused when best
        hourly = self.met.cost_per_hour
        self.cost_cents_per_hour = to_int(hourly * 100)

    def rates(self) -> Rates:
        """The registry's inputs at the rounded step time (model/objectives.py)."""
        t = self.met.terms
        return uniform_rates(self.step_us / US / t.tokens_per_step, self.met.systems, self.plans.hw,
                             t.gpus.astype(np.float64), self.met.train_tokens)

    def int_objective(self, kind: str) -> IntObjective:
        """Objective ``kind`` per step in integer units (us, nano-$, mJ; time_to_train: ms of the run)."""
        return integer_objective(kind, self.rates(), training_units(kind, float(self.met.terms.tokens_per_step)))

    def objective(self, kind: str) -> IntArr:
        return self.int_objective(kind).values


def objective_floor(model: Model, kind: str) -> IntArr:
    """Per hardware option, an integer objective ``kind`` no admissible plan of it is below: that of a plan of the
    option at its step floor (``option_bound.step_floor_us``), with the rates and rounding of ``Candidates``."""
    problem = model.problem
    tokens_per_step = float(problem.training_task.global_batch * model.workload.seq_len)
    hw = np.arange(len(problem.hardware), dtype=np.int64)
    gpus = np.array([o.gpus for o in problem.hardware], dtype=np.float64)
    rates = uniform_rates(step_floor_us(model) / US / tokens_per_step, tuple(o.system for o in problem.hardware), hw,
                          gpus, problem.training_task.train_tokens)
    return integer_objective(kind, rates, training_units(kind, tokens_per_step)).values


def candidates(model: Model, plans: PlanArrays | None = None, keep_best: int = 1, top_only: bool = False) -> Candidates:
    """``plans`` evaluated; by default the problem's space less the plans proven infeasible or proven outside every
    hardware option's ``keep_best`` best (``space_candidates``); ``top_only``: only every option's ``keep_best``
    best admissible plans of the options that can hold a top-``keep_best`` plan or their system's best, the space
    streamed in bounded memory (``prune.best_candidates``; the others skipped by ``objective_floor``)."""
    if plans is not None:
        return Candidates(plans, metrics(model, plans))
    if top_only:
        objective = model.problem.objective

        def score(p: PlanArrays, met: Metrics) -> tuple[IntArr, NDArray[np.bool_]]:
            c = Candidates(p, met)
            return c.objective(objective), admissible(model, c)

        return Candidates(*best_candidates(model, keep_best, score, objective_floor(model, objective)))
    plans, met = space_candidates(model, keep_best)
    return Candidates(plans, met)


def limits(model: Model, c: Candidates) -> list[Limit]:
    """The problem's side constraints as linear limits over the candidates (same integers for CP-SAT and brute
    force): GPU count, $/hour, GPU supply per type, minimum throughput (as a maximum step time), the run's budget."""
    cons = model.problem.constraints
    out = cluster_limits(
        model.problem.hardware, c.plans.hw, c.plans.gpus, c.cost_cents_per_hour, cons.max_gpus, cons.max_cost_per_hour
    )
    if cons.throughput_floor(model.problem.training_task.train_tokens) is not None:  # min_throughput, deadline
        out.append(Limit(c.step_us, _max_step_us(model)))
    if cons.budget_usd is not None:  # 0/1 per candidate: over budget at its rounded step time
        out.append(Limit((run_usd(model, c, c.step_us / US) > cons.budget_usd).astype(np.int64), 0))
    return out


def run_usd(model: Model, c: Candidates, step_s: NDArray[np.float64]) -> NDArray[np.float64]:
    """US$ of the whole run per candidate: train_tokens / (tokens/step / step_s) / 3600 s/h hours x its $/h."""
    tokens = model.problem.training_task.train_tokens
    assert tokens is not None, "budget_usd needs task.train_tokens (checked when loading)"
    hours = tokens * step_s / c.met.terms.tokens_per_step / SECONDS_PER_HOUR
    return np.asarray(run_cost_usd(hours, c.met.cost_per_hour), dtype=np.float64)


def admissible(model: Model, c: Candidates) -> NDArray[np.bool_]:
    """Valid plans that meet every constraint: what brute force minimises over (same integers as CP-SAT)."""
    return admissible_mask(c.met.feasible, limits(model, c))


def _max_step_us(model: Model) -> int:
    task = model.problem.training_task
    floor = model.problem.constraints.throughput_floor(task.train_tokens)
    assert floor is not None
    tokens_per_step = task.global_batch * model.workload.seq_len
    return int(np.floor(tokens_per_step / floor * US))  # tokens/step_s >= min  <=>  step <= ...


def brute_force_order(model: Model, c: Candidates, objective: str) -> IntArr:
    """Admissible candidate indices sorted by (integer objective, enumeration order): the reference answer."""
    return brute_force(c.objective(objective), admissible(model, c))


@dataclass
class SolveOutcome:
    status: str  # optimal | feasible | infeasible
    top: list[int]  # candidate indices, best first
    objective: float | None  # integer units of the objective (uneven: a multiple of 1/(p v) of them)
    best_bound: float | None
    wall_s: float
    candidates: Candidates
    model_size: int  # Booleans in the CP-SAT model (0: the uniform search builds none)
    explanation: str | None = None
    uneven: UnevenResult | None = None  # uneven-pipeline search, when the space allows it
    search: str = "uniform"  # the search that produced the returned plan: uniform | uneven | mixed
    total_wall_s: float | None = None  # every search together (uniform + uneven)
    admissible: int | None = None  # uniform search: kept candidates that meet every limit

    @property
    def method(self) -> str:
        """How the returned plan was found: an exact numpy sort of the enumerated plans; for uneven stages, CP-SAT
        models, or none needed (the stage bounds and dynamic programmes of search/stage_split_bound.py decided)."""
        if self.search == "uniform":
            return METHOD
        return "cp-sat" if self.uneven is None or self.uneven.models else UNEVEN_DP

    def summary(self) -> dict[str, Any]:
        """The ``solver`` object of the solve JSON: objective, bound and gap of the returned plan; wall time and
        model size of the search that produced it (``search``); ``total_wall_s`` over all searches run."""
        c = self.candidates
        if self.search == "uniform" or self.uneven is None:
            size = len(c.plans) if c.evaluated is None else c.evaluated
        else:  # uneven: pipeline bases (each a CP-SAT model)
            size = self.uneven.bases_solved + self.uneven.bases_pruned
        out = solver_summary(self.objective, self.best_bound, self.wall_s, size, self.model_size)
        out["search"] = self.search
        out["method"] = self.method
        if self.search == "uniform":
            out["kept"], out["admissible"] = len(c.plans), self.admissible
        out["total_wall_s"] = self.total_wall_s if self.total_wall_s is not None else self.wall_s
        if self.uneven is not None:
            out["uneven"] = {"status": self.uneven.status, "bases_solved": self.uneven.bases_solved,
                             "bases_pruned": self.uneven.bases_pruned, "models_solved": self.uneven.models,
                             "booleans": self.uneven.booleans}
            out["uneven_wall_s"] = self.uneven.wall_s
        return out


def solve(
    problem: Problem,
    *,
    top_k: int = 1,
    time_limit_s: float = 60.0,
    workers: int = 1,
    seed: int = 0,
    cpsat: CpSatOptions | None = None,
    model: Model | None = None,
    plans: PlanArrays | None = None,
    prune: bool = False,
) -> SolveOutcome:
    """Find the optimal plan (and hardware option) for ``problem``; raise InfeasibleError with the reason.

    ``plans``: search these plans of the space instead (``top`` indexes them); with ``prune`` they are first pruned
    like the space (``prune.space_candidates``; ``top`` then indexes ``candidates.plans``)."""
    t0 = time.perf_counter()
    cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers, seed=seed)  # checked; no CP-SAT model here
    model = model or Model(problem)
    c = candidates(model, plans, keep_best=top_k, top_only=True) if plans is None or not prune else Candidates(
        *space_candidates(model, top_k, plans))
    lims = limits(model, c)

    pick = select_best(c.int_objective(problem.objective), admissible_mask(c.met.feasible, lims), c.plans.hw,
                       top_k=top_k, file=problem.source)
    if pick is None:  # explained on the pruned space (the kept top plans hold no infeasible ones)
        raise InfeasibleError(explain_infeasible(model, c if c.evaluated is None else candidates(model)))
    return SolveOutcome(
        status="optimal",  # an exact sort of every admissible candidate
        top=pick.top,
        objective=pick.objective,
        best_bound=pick.objective,
        wall_s=time.perf_counter() - t0,
        candidates=c,
        model_size=0,
        admissible=pick.admissible,
    )


def cross_check(outcome: SolveOutcome, records: list[TrainingRecord]) -> None:
    """Every returned plan, re-evaluated in floating point, must match its rounded integer step time."""
    for i, rec in zip(outcome.top, records, strict=True):
        rounded_s = outcome.candidates.step_us[i] / US
        if not rec["feasible"] or abs(rec["step_time_s"] - rounded_s) > ROUNDING_TOLERANCE_S + 1e-9:
            raise InternalError(
                f"solver/evaluator mismatch on {rec['plan']}: evaluator {rec['step_time_s']:.6f} s, "
                f"solver {rounded_s:.6f} s (tolerance {ROUNDING_TOLERANCE_S * 1e6:.1f} us)"
            )


def solve_records(
    problem: Problem,
    *,
    top_k: int = 1,
    time_limit_s: float = 60.0,
    workers: int = 1,
    seed: int = 0,
    cpsat: CpSatOptions | None = None,
    plans: PlanArrays | None = None,
) -> tuple[SolveOutcome, list[TrainingRecord]]:
    """Solve, re-evaluate every returned plan with the exact evaluator, and (if enabled) search uneven stages.

    With ``space.uneven_stages`` the best uneven pipeline that beats the best uniform plan on the problem's
    objective is put first.
    """
    t0 = time.perf_counter()
    opts = cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers, seed=seed)
    if problem.space.uneven_stages:  # CP-SAT's libraries load on the other core during the uniform search
        from madmax_opt.search.ortools_import import prefetch

        prefetch()
    model = Model(problem)
    try:
        outcome = solve(problem, model=model, top_k=top_k, cpsat=opts, plans=plans, prune=True)
    except InfeasibleError:
        if not problem.space.uneven_stages:
            raise
        outcome = None  # no uniform plan: an uneven split may still exist (e.g. 126 layers on 16 stages)
    recs = []
    if outcome is not None:
        recs = to_records(model, outcome.candidates.plans.take(outcome.top))
        cross_check(outcome, recs)
    if problem.space.uneven_stages:
        from madmax_opt.search.stage_explain import explain_uneven
        from madmax_opt.search.stage_limits import step_limits
        from madmax_opt.search.stages import solve_uneven

        incumbent = float(outcome.candidates.objective(problem.objective)[outcome.top[0]]) if outcome else np.inf
        task, cons = problem.training_task, problem.constraints
        step_lims = step_limits(task, cons, float(task.global_batch * model.workload.seq_len),
                                _max_step_us(model) if cons.throughput_floor(task.train_tokens) is not None else None)
        uneven = solve_uneven(model, incumbent, opts.time_limit_s, objective=problem.objective, cpsat=opts,
                              constraints=step_lims)
        if uneven.plan is not None and uneven.step_us is not None:
            rec = staged_record(model, uneven.plan)
            n_micro = problem.training_task.global_batch / (uneven.plan.dp * uneven.plan.mbs)
            tol = uneven.tolerance_s(n_micro, uneven.plan.pp)
            if not rec["feasible"] or abs(rec["step_time_s"] - uneven.step_us / US) > tol + 1e-9:
                raise InternalError(
                    f"uneven-pipeline mismatch on {rec['plan']}: evaluator {rec['step_time_s']:.6f} s, "
                    f"solver {uneven.step_us / US:.6f} s (tolerance {tol * 1e6:.1f} us)"
                )
            even = _uniform_equivalent(model, uneven.plan)
            if even is not None and recs and even["step_time_s"] >= recs[0]["step_time_s"] - tol:
                pass  # an even split that ties the best uniform plan (the two roundings differ): keep the uniform
            else:
                recs = [even or rec, *recs][: max(len(recs), 1)]
                winner = "mixed" if uneven.plan.stage_systems and len(set(uneven.plan.stage_systems)) > 1 else \
                    "uneven"
                if outcome is not None:  # the uneven search produced the returned plan: describe that search
                    outcome.status, outcome.objective, outcome.wall_s = uneven.status, uneven.objective, uneven.wall_s
                    outcome.model_size, outcome.search = uneven.booleans, winner
        if outcome is None:
            if uneven.plan is None and uneven.status == "feasible":  # out of time before any split: no proof
                raise time_limit_error(opts, "uneven-stage search")
            if uneven.plan is None:  # named on the uneven plans when one exists without the constraints
                raise InfeasibleError((step_lims.active and explain_uneven(model, step_lims, opts.time_limit_s, opts))
                                      or explain_infeasible(model, candidates(model)))
            outcome = SolveOutcome(
                uneven.status,
                [],
                uneven.objective,
                uneven.best_bound,
                uneven.wall_s,
                candidates(model),
                uneven.booleans,
                search=winner,
            )
        outcome.uneven = uneven
        if uneven.status == "feasible":  # the uneven search did not finish: the returned plan is not proven best
            outcome.status = "feasible"
        if uneven.best_bound is not None and outcome.best_bound is not None:  # a bound over both searches
            outcome.best_bound = min(outcome.best_bound, uneven.best_bound)
    assert outcome is not None  # a uniform or an uneven plan was found, else InfeasibleError was raised
    outcome.total_wall_s = time.perf_counter() - t0
    warn_if_unused(opts, "the uniform search ran an exact enumeration" if outcome.search == "uniform" else
                   f"the {outcome.search} search's bounds and dynamic programmes decided every pipeline base")
    return outcome, recs


def _uniform_equivalent(model: Model, plan: Plan) -> TrainingRecord | None:
    """The uniform-plan record of an uneven plan whose stages are all alike (equal layers, one recompute mode,
    one system), when that uniform plan is valid; None otherwise."""
    assert plan.stage_layers is not None and plan.stage_recompute is not None
    systems: set[str | None] = set(plan.stage_systems) if plan.stage_systems else {plan.system}
    if len(set(plan.stage_layers)) > 1 or len(set(plan.stage_recompute)) > 1 or len(systems) > 1:
        return None
    uniform = plan.model_copy(update={"stage_layers": None, "stage_recompute": None, "stage_systems": None,
                                      "recompute": plan.stage_recompute[0], "system": systems.pop()})
    try:
        rec = to_records(model, model.arrays([uniform]))[0]
    except ProblemError:  # e.g. no hardware option with that system and GPU count
        return None
    return rec if rec["feasible"] else None


def explain_infeasible(model: Model, c: Candidates) -> str:
    """Name the constraint that binds when no candidate is admissible."""
    p = model.problem
    name = p.model.name
    fixed = {k: v for k, v in p.space.model_dump(exclude_defaults=True).items() if v is not None}
    restricted = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "no restrictions"
    if len(c.plans) == 0:  # the enumeration's own rule that emptied the space, named
        return (
            f"the plan space is empty: {empty_space_reason(p)} "
            f"(binding constraint: space ({restricted}) against hardware.gpus)"
        )
    inv = c.met.terms.invalid
    structural = inv[(inv != 0) & (inv != MEMORY_REASON)]
    if not np.any((inv == 0) | (inv == MEMORY_REASON)):
        code = int(np.bincount(structural).argmax())
        context = {
            2: f"heads={p.model.heads}, kv_heads={p.model.n_kv_heads}",
            3: f"layers={p.model.layers}",
            4: f"task.global_batch={getattr(p.task, 'global_batch', None)}",
            6: f"seq_len={model.workload.seq_len}",
        }.get(code, "")
        shown = f" ({context})" if context else ""
        return (
            f"no plan in the space is valid; most common violation: {INVALID_REASONS[code]}{shown} "
            f"(binding constraint: space ({restricted}))"
        )
    if not c.met.feasible.any():
        mem = c.met.terms.memory.total
        cand = np.flatnonzero(inv == MEMORY_REASON)
        best = int(cand[np.argmin(mem[cand])])
        plan = c.plans.plan(best)
        opt = p.hardware[int(c.plans.hw[best])]
        cap = float(c.met.terms.capacity_bytes[best])
        return (
            f"{name} does not fit: it needs at least {mem[best] / 1e9:.1f} GB per GPU even with the most "
            f"memory-saving plan (tp={plan.tp}, pp={plan.pp}, cp={plan.cp}, zero={plan.zero}, "
            f"recompute={plan.recompute}, mbs={plan.mbs}) on {opt.gpus} x {opt.gpu.name} "
            f"({opt.system.name}); {opt.gpu.name} has {opt.gpu.hbm_bytes / 1e9:.1f} GB minus a "
            f"{p.stack.memory_reserve_fraction:.0%} reserve = {cap / 1e9:.1f} GB "
            "(binding constraint: memory capacity)"
        )
    cons = p.constraints
    feas = c.met.feasible
    reasons = []
    if cons.max_gpus is not None and not (feas & (c.plans.gpus <= cons.max_gpus)).any():
        reasons.append(
            f"max_gpus={cons.max_gpus}: the smallest feasible cluster has {c.plans.gpus[feas].min()} GPUs"
        )
    if (
        cons.max_cost_per_hour is not None
        and not (feas & (c.cost_cents_per_hour <= cons.max_cost_per_hour * 100)).any()
    ):
        reasons.append(
            f"max_cost_per_hour={cons.max_cost_per_hour}: the cheapest feasible option costs "
            f"${c.met.cost_per_hour[feas].min():.2f}/h"
        )
    tokens = p.training_task.train_tokens
    floor = cons.throughput_floor(tokens)
    if floor is not None and not (feas & (c.step_us <= _max_step_us(model))).any():
        deadline = cons.deadline_floor(tokens)
        what = (f"deadline_hours={cons.deadline_hours:g} (task.train_tokens {tokens:.4g} in {cons.deadline_hours:g} h "
                f"needs {floor:.4g} tokens/s)" if deadline is not None and deadline >= floor
                else f"min_throughput={floor:.4g} tokens/s")  # the constraint the user wrote that binds
        reasons.append(f"{what}: the fastest feasible plan reaches {c.met.tokens_per_s[feas].max():.4g} tokens/s")
    if cons.budget_usd is not None:
        cost = run_usd(model, c, c.step_us / US)
        if not (feas & (cost <= cons.budget_usd)).any():
            reasons.append(f"budget_usd={cons.budget_usd:g} (task.train_tokens {tokens:.4g} at the plan's $/h): the "
                           f"cheapest feasible plan's run costs ${cost[feas].min():.4g}")
    supply = supplies(p.hardware)
    within_supply = admissible_mask(
        np.ones(len(c.plans), dtype=bool),
        cluster_limits(p.hardware, c.plans.hw, c.plans.gpus, c.cost_cents_per_hour, None, None),
    )
    if supply and not (feas & within_supply).any():
        reasons.append(f"GPU supply {supply}: the smallest feasible cluster has {c.plans.gpus[feas].min()} GPUs")
    detail = "; ".join(reasons) or "the constraints together exclude every feasible plan"
    return f"no feasible plan meets the constraints (binding constraint: {detail})"


__all__ = ["SolveOutcome", "cross_check", "explain_infeasible", "invalid_reason", "solve", "solve_records"]
