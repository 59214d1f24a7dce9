"""Uneven pipelines: the layers and the recompute mode of every stage, by bounds, dynamic programmes and CP-SAT.

For a base plan (hardware, dp, tp, pp, cp, vpp, mbs, zero, sp) the step time is

    T = m * max_s t_s + (p - 1)/(v p) * sum_s t_s + max_s dp_s + max_s opt_s

where stage s with n_s layers and recompute r_s costs t_s = stage_costs(n_s, r_s, first/last extras) per
micro-batch and must fit in memory holding ``stage_in_flight`` micro-batches (1F1B: min(p - s, m)); with v > 1
virtual chunks per stage (Megatron-Core interleaving with first / last stage layer counts, embedding and loss
accounted in the split) every chunk holds a layer, except that the first and last may hold only the embedding /
the loss, so any v with p v <= L + 2 is searched. Every (s, n, r) candidate is evaluated by
the same vectorised ``training.stage_costs`` as the uniform model, rounded once to microseconds; a split picks one
per stage with sum_s n_s = L (CP-SAT: ``add_exactly_one``, ``tmax >= t_s``, the objective p v T, integral).
Raw space: (number of compositions of L into p parts) x R^p, e.g. 10^25 for 126 layers on 16 stages.

Bases are explored best-first by a valid lower bound, (m + (p - 1)/v)/p * (L * c_layer + extras): tmax is at least
the mean, recomputation and exposed ZeRO-3 traffic only add. A base whose bound is not below the incumbent
(initially the best uniform plan) cannot improve it, so the search is exact when it finishes within its budget.
A second bound per base (``stage_bounds.py``: memory, the layer split, DP sync and optimizer; with mixed stages the
least over the systems a stage may use), computed for the bases ahead in chunks as the search reaches them, skips
the bases it proves cannot improve the incumbent before their rows are built. Within a base, a bound over its own
rows and the bounds earlier models proved (``stage_split_bound.py``) skip CP-SAT where it could only prove that
nothing beats the incumbent. The visiting order stays the first bound's, whichever bases the second bound skips.

Two passes (``DEFER``): the first runs no CP-SAT. A base the bounds do not settle is left for the second pass, and
the split bound's dynamic programme usually yields a split within the limit: when it beats the incumbent it becomes
the incumbent at once (a plan, not yet a proof). The second pass examines every base left, in visiting order,
against the best plan of the first: the split bound with the DP and optimizer maxima taken exactly
(``stage_split_bound._exact_maxima``) proves most of them, and a CP-SAT model decides the others (an optimum it finds
replaces the incumbent). On the mixed-pipeline example the dynamic programme's split equals CP-SAT's optimum on 2 of
the 3 bases where it found one (0.14 % above on the other), and no CP-SAT model is left (the one-pass search solved
four, and an unhinted re-solve).

Objectives (model/objectives.py): at fixed hardware every objective is rate x T (rate: integer objective units per
us of step time, from the registry). A base on one hardware option has one rate, so CP-SAT minimises T under
rate x T < incumbent. In mixed mode the rate depends on how many stages each system gets; when it does (cost,
energy), every composition (k_1..k_H stages per system, within supply) is one CP-SAT model with those counts fixed,
explored best-first by rate_k x bound and pruned like the bases.

Constraints (``stage_limits.py``): min_throughput / deadline_hours and budget_usd cap p v T per base (CP-SAT
constraint); max_gpus and max_cost_per_hour exclude a base or composition. The step time is the one linear form of
``model/step_time.py``, read here in its integer form p v T.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.errors import ProblemError
from madmax_opt.core.units import US
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import RECOMPUTE_MODES, Plan
from madmax_opt.model.step_time import INTEGER_TERMS, step_form
from madmax_opt.model.training import invalid_codes
from madmax_opt.search.cpsat import STAGE_RUN, CpSatOptions, has_solution
from madmax_opt.search.cpsat import run as cpsat_run
from madmax_opt.search.ortools_import import load_cp_model, prefetch
from madmax_opt.search.space import enumerate_plans
from madmax_opt.search.stage_bounds import composition_bound_us, layer_parts, shape_key, strong_bounds
from madmax_opt.search.stage_compositions import Composition, compositions, stage_supply
from madmax_opt.search.stage_limits import StepLimits, usd_per_hour
from madmax_opt.search.stage_rows import candidates as _candidates
from madmax_opt.search.stage_rows import rounding_us
from madmax_opt.search.stage_split_bound import SplitProofs

Outcome = tuple[str, float | None, list[int], int]  # _solve_base: status, step_us, chosen rows, booleans
# a base (one composition) to examine: its objective bound, stages per hardware choice, rate, the base's index, its
# candidate rows
Entry = tuple[float, dict[int, int] | None, float, int, dict[str, NDArray[np.float64]]]
# first pass without CP-SAT: a model whose split bound does not settle it waits until the best plan of the pass is
# known (its dynamic programme's split, if better, becomes the incumbent at once); False: CP-SAT at once, one pass
DEFER = True
STRONG_CHUNK = 8  # bases whose strong bound is computed first (then all the others still below the incumbent)

if TYPE_CHECKING:  # imported where a CP-SAT model is built (search/ortools_import.py: without pandas)
    from ortools.sat.python import cp_model


@dataclass(frozen=True)
class UnevenResult:
    plan: Plan | None  # None when no uneven plan beats the incumbent
    step_us: float | None  # the solver's (rounded) step time of ``plan``
    status: str  # optimal | feasible (budget ran out) | no-improvement
    bases_solved: int  # bases (compositions) examined beyond the first bound: by the split bound, a DP or CP-SAT
    bases_pruned: int
    wall_s: float
    booleans: int  # largest CP-SAT model built
    objective: float | None = None  # the plan's objective in the training integer units (rate x step_us)
    best_bound: float | None = None  # proven lower bound on the objective of every uneven plan (same units)
    models: int = 0  # CP-SAT models solved

    def tolerance_s(self, n_micro: float, pp: int) -> float:
        return rounding_us(n_micro, pp) / US  # the rows' rounding (stage_rows.py), in seconds


def _bases(model: Model) -> PlanArrays:
    """Distinct pipeline bases (pp > 1, any vpp) that are structurally valid whatever the split."""
    plans = enumerate_plans(model.problem, uneven=True)
    if len(plans) == 0:
        return plans
    sel = (
        (plans.pp > 1) & (plans.recompute == plans.recompute.min())
    )  # recompute: per stage
    plans = plans.take(np.flatnonzero(sel))
    if len(plans) == 0:
        return plans
    n_micro = model.problem.training_task.global_batch / (plans.dp * plans.mbs)
    inf = np.full(len(plans), np.inf)
    code = invalid_codes(
        model.workload,
        model.problem.training_task,
        model.table,
        plans,
        n_micro,
        np.zeros_like(inf),
        inf,
        check_layers=False,
    )  # memory is checked per stage candidate
    over_supply = np.array([o.supply is not None and o.gpus > o.supply for o in model.problem.hardware])
    if not model.problem.space.mixed_stages:  # a homogeneous pipeline must fit its GPU type's supply
        code = np.where(over_supply[plans.hw], -1, code)
    plans = plans.take(np.flatnonzero(code == 0))
    if model.problem.space.mixed_stages and len(plans):  # stage hardware is free: one base per shape
        _, first = np.unique(shape_key(plans), axis=0, return_index=True)
        plans = plans.take(np.sort(first))
    return plans


def stage_hardware(model: Model, base: PlanArrays) -> list[int]:
    """Hardware options a stage of ``base`` may use: its own, or one per listed system in mixed mode."""
    if not model.problem.space.mixed_stages:
        return [int(base.hw[0])]
    return sorted({model.system_index(o.system.name) for o in model.problem.hardware})


def _lower_bounds_us(model: Model, bases: PlanArrays) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(m + (p - 1)/v)/p * sum of the cheapest possible stage times (T = m tmax + (p - 1)/(v p) sum_s t_s and
    tmax >= the mean), and that sum (us); per component minimum over stage hardware."""
    p = model.problem
    hw_choices = stage_hardware(model, bases.take([0])) if p.space.mixed_stages else [None]
    parts = [layer_parts(model, bases, hw) for hw in hw_choices]
    per_layer, emb, head, p2p, n_micro = (np.min([x[i] for x in parts], axis=0) for i in range(5))
    pp = bases.pp.astype(np.float64)
    total = model.workload.layers * per_layer + emb + head + pp * p2p
    return step_form(n_micro, pp, bases.vpp.astype(np.float64)).mean_bound(total) * US, total * US


def _integer_coefficients(n_micro: float, p: int, vpp: int) -> dict[str, int]:
    """p v x the step-time form (model/step_time.py) over ``INTEGER_TERMS``: p v m, p - 1, p v, p v."""
    return {k: int(c[0]) for k, c in step_form(n_micro, p, vpp).integer_coefficients().items()}


def stage_model(
    cand: dict[str, NDArray[np.float64]],
    live: NDArray[np.int64],
    p: int,
    layers: int,
    supply: list[tuple[list[int], int]] | None = None,
    counts: dict[int, int] | None = None,
    vpp: int = 1,
) -> tuple[cp_model.CpModel, list[cp_model.IntVar], cp_model.LinearExpr]:
    """The CP-SAT model over candidate rows ``live`` of one base: one row per stage, the rows' layers summing to
    ``layers``, stages per GPU type within ``supply`` (``counts``: stages per hardware choice, when fixed); returns
    (model, one Boolean per live row, the objective p v T in the integer form of model/step_time.py)."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    coeff = _integer_coefficients(float(cand["n_micro"][0]), p, vpp)
    stage, t = cand["stage"][live].astype(np.int64), cand["t_us"][live].astype(np.int64)
    layers_of, dp_us, opt_us, hw_of = (cand[k][live].astype(np.int64) for k in ("layers", "dp_us", "opt_us", "hw"))
    mdl = cp_model.CpModel()
    x = [mdl.new_bool_var(f"stage{int(stage[j])}_layers{int(layers_of[j])}_"
                          f"{RECOMPUTE_MODES[int(cand['recompute'][i])]}_hw{int(hw_of[j])}") for j, i in enumerate(live)]

    def weighted(rows: NDArray[np.int64], coeffs: NDArray[np.int64]) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.weighted_sum([x[j] for j in rows], coeffs[rows].tolist())

    hi = int(t.max()) + 1
    tmax = mdl.new_int_var(0, hi, "tmax")
    dpmax = mdl.new_int_var(0, int(dp_us.max()) + 1, "dpmax")
    optmax = mdl.new_int_var(0, int(opt_us.max()) + 1, "optmax")
    for s in range(p):
        rows = np.flatnonzero(stage == s)
        mdl.add_exactly_one([x[j] for j in rows])
        mdl.add(tmax >= weighted(rows, t))
        mdl.add(dpmax >= weighted(rows, dp_us))
        mdl.add(optmax >= weighted(rows, opt_us))
    every = np.arange(len(x))
    mdl.add(weighted(every, layers_of) == layers)
    for hws, stages_allowed in supply or []:  # stages on one GPU type (any of its systems) within its supply
        mdl.add(sum(x[j] for j in np.flatnonzero(np.isin(hw_of, hws))) <= stages_allowed)
    for hw, k in (counts or {}).items():  # a fixed composition: k stages on hardware choice hw
        mdl.add(sum(x[j] for j in np.flatnonzero(hw_of == hw)) == k)
    terms = {"stage_max": tmax, "stage_sum": weighted(every, t), "dp_max": dpmax, "optimizer_max": optmax}
    objective = cp_model.LinearExpr.weighted_sum([terms[k] for k in INTEGER_TERMS], [coeff[k] for k in INTEGER_TERMS])
    assert coeff["stage_max"] * hi < 2**50, "objective overflow"
    return mdl, x, objective


def _solve_base(
    cand: dict[str, NDArray[np.float64]],
    p: int,
    layers: int,
    incumbent_us: float,
    cpsat: CpSatOptions,
    supply: list[tuple[list[int], int]] | None = None,
    counts: dict[int, int] | None = None,
    vpp: int = 1,
    cap: int | None = None,
    proofs: SplitProofs | None = None,
    defer: bool = False,
) -> tuple[str, float | None, list[int], int]:
    """CP-SAT over one base (``counts``: stages per hardware choice, when fixed); returns (status, step_us, chosen
    row indices, booleans). Only plans strictly faster than ``incumbent_us`` are of interest, and with p v T at most
    ``cap`` (the problem's step-time constraints, stage_limits.py). ``proofs``: what earlier models of the search
    proved, consulted and extended (stage_split_bound.py); their split within the limit is CP-SAT's hint.
    ``defer``: no CP-SAT; status ``deferred`` where it would be needed, with the split of the
    dynamic programme (stage_split_bound.py) when it found one within the limit (an upper bound, not a proof)."""
    coeff = _integer_coefficients(float(cand["n_micro"][0]), p, vpp)
    pv = p * vpp  # p v T (model/step_time.py): integral

    def objective_of(values: dict[str, NDArray[np.int64] | int]) -> NDArray[np.int64]:
        return np.asarray(sum(coeff[k] * values[k] for k in INTEGER_TERMS))

    stage_all = cand["stage"].astype(np.int64)
    if any(not np.any(stage_all == s) for s in range(p)):
        return "infeasible", None, [], 0
    t_all = cand["t_us"].astype(np.int64)
    live = np.arange(len(stage_all))
    limit = int(np.ceil(incumbent_us * pv)) - 1 if np.isfinite(incumbent_us) else None  # strictly better
    if cap is not None:
        limit = cap if limit is None else min(limit, cap)
    if limit is None and defer:  # no incumbent yet: every split is within p v T with each stage at its slowest rows
        limit = int(objective_of({"stage_max": t_all.max(), "stage_sum": sum(t_all[stage_all == s].max()
                                  for s in range(p)), "dp_max": int(cand["dp_us"].max()),
                                  "optimizer_max": int(cand["opt_us"].max())}))
    if limit is not None:
        # exact pruning: a row whose own time already forces p v T >= p v incumbent, with every other stage at its
        # fastest row, cannot be in a strictly better plan
        fastest = np.array([t_all[stage_all == s].min() for s in range(p)])
        # the whole base: every stage at its fastest row (and its smallest dp / optimizer time) bounds p v T
        least = [np.array([cand[k][stage_all == s].min() for s in range(p)]) for k in ("dp_us", "opt_us")]
        base_lb = objective_of({"stage_max": fastest.max(), "stage_sum": fastest.sum(),
                                "dp_max": int(least[0].max()), "optimizer_max": int(least[1].max())})
        if base_lb > limit:
            return "infeasible", None, [], 0  # no strictly better plan in this base: CP-SAT not needed
        row_lb = objective_of({"stage_max": t_all, "stage_sum": t_all + fastest.sum() - fastest[stage_all],
                               "dp_max": 0, "optimizer_max": 0})
        live = np.flatnonzero(row_lb <= limit)
        if any(not np.any(stage_all[live] == s) for s in range(p)):
            return "infeasible", None, [], 0
        # the same rows: a bound proven on a superset, or by a dynamic programme per tmax (stage_split_bound.py)
        if proofs is not None and proofs.excludes(cand, live, p, layers, coeff, limit, supply or [], counts,
                                                  exact=not defer):
            return "infeasible", None, [], 0  # no split within the limit: CP-SAT would prove it infeasible
    if defer:  # CP-SAT is left for later: the dynamic programme's split within the limit, if it found one
        rows = proofs.hint if proofs is not None and limit is not None else None
        if not rows:
            return "deferred", None, [], 0
        chosen = [int(live[j]) for j in rows]
        dp_us, opt_us = (int(cand[k][chosen].max()) for k in ("dp_us", "opt_us"))
        value = objective_of({"stage_max": t_all[chosen].max(), "stage_sum": t_all[chosen].sum(), "dp_max": dp_us,
                              "optimizer_max": opt_us})
        return "deferred", float(value) / pv, chosen, 0
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    mdl, x, objective = stage_model(cand, live, p, layers, supply, counts, vpp)
    mdl.minimize(objective)
    if limit is not None:
        mdl.add(objective <= limit)  # only strictly better plans within the constraints are of interest
    hint = set(proofs.hint) if proofs is not None and limit is not None and proofs.hint is not None else None
    for j, var in enumerate(x if hint is not None else []):  # a split within the limit (stage_split_bound.py)
        mdl.add_hint(var, j in (hint or ()))
    st, solver = cpsat_run(mdl, cpsat, "uneven-stage", **STAGE_RUN)
    if proofs is not None and limit is not None and st in (cp_model.INFEASIBLE, cp_model.OPTIMAL):
        proofs.proved(limit + 1 if st == cp_model.INFEASIBLE else round(solver.objective_value))
    if st == cp_model.INFEASIBLE:
        return "infeasible", None, [], len(x)
    if not has_solution(st):
        return "unknown", None, [], len(x)
    chosen = [int(live[j]) for j in range(len(x)) if solver.value(x[j])]
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    return status, solver.objective_value / pv, chosen, len(x)


def _plan(model: Model, base: PlanArrays, cand: dict[str, NDArray[np.float64]], chosen: list[int]) -> Plan:
    """The plan of ``base`` with the candidate rows ``chosen`` (one per stage)."""
    pr = model.problem
    rows = sorted(chosen, key=lambda i: int(cand["stage"][i]))
    return base.plan(0, system=pr.hardware[int(base.hw[0])].system.name).model_copy(update={
        "recompute": RECOMPUTE_MODES[int(cand["recompute"][rows[0]])],
        "stage_layers": [int(cand["layers"][i]) for i in rows],
        "stage_recompute": [RECOMPUTE_MODES[int(cand["recompute"][i])] for i in rows],
        "stage_systems": [pr.hardware[int(cand["hw"][i])].system.name for i in rows] if pr.space.mixed_stages
        else None})


def solve_uneven(
    model: Model,
    incumbent: float,
    time_limit_s: float = 30.0,
    *,
    objective: str = "throughput",
    cpsat: CpSatOptions | None = None,
    constraints: StepLimits | None = None,
) -> UnevenResult:
    """Best uneven pipeline plan strictly better than ``incumbent`` (the best uniform plan's integer objective,
    training units of ``objective``: us of step time for throughput) that meets ``constraints`` (min_throughput,
    deadline_hours, budget_usd: stage_limits.py), if any."""
    step_lims = constraints or StepLimits()
    t0 = time.perf_counter()
    prefetch()  # CP-SAT's libraries load on the other core while the bases and their bounds are computed
    opts = (cpsat or CpSatOptions()).with_time_limit(time_limit_s)
    pr = model.problem
    if 0 < model.workload.frozen_layers < model.workload.layers:
        # a stage's trainable layers depend on where the stage starts, i.e. on the other stages' sizes
        raise ProblemError(
            "uneven stages with partly frozen layers are not supported; allowed: frozen_layers 0 (or LoRA), "
            "or uneven_stages: false",
            file=pr.source,
            field="space.uneven_stages",
        )
    bases = _bases(model)
    if len(bases) == 0:
        return UnevenResult(None, None, "no-improvement", 0, 0, time.perf_counter() - t0, 0)
    lb_us, total_us = _lower_bounds_us(model, bases)
    # per base: its hardware choices, supply and compositions (cheapest rate first); they depend on the base's
    # option, pp and GPUs per stage only, so they are built once per such key
    key = np.stack([bases.hw, bases.pp, bases.dp * bases.tp * bases.cp], axis=1)
    _, first, job_of = np.unique(key, axis=0, return_index=True, return_inverse=True)
    shared: list[tuple[list[int], list[tuple[list[int], int]], list[Composition]]] = []
    for j in first.tolist():
        base = bases.take([j])
        hws = stage_hardware(model, base)
        supply = stage_supply(model, base, hws)
        shared.append((hws, supply, compositions(model, base, hws, supply, objective,
                                                  priced=step_lims.priced)))
    jobs = [shared[i] for i in job_of.ravel().tolist()]

    def bounds(j: int) -> list[tuple[float, dict[int, int] | None, float]]:
        """(objective lower bound, counts, rate) per composition of base ``j``, best bound first."""
        hws, _, comps = jobs[j]
        return sorted(((rate * (float(lb_us[j]) if counts is None else max(float(lb_us[j]), composition_bound_us(
            model, bases.take([j]), hws, counts))), counts, rate) for counts, rate in comps), key=lambda x: x[0])

    single = [len(comps) == 1 and comps[0][0] is None for _, _, comps in shared]  # one rate, no counts
    if all(single):  # every base: its rate x its linear bound, for all bases at once
        rate_of = np.array([comps[0][1] for _, _, comps in shared])[job_of.ravel()]
        lb = rate_of * lb_us
        bound_obj: dict[int, list[tuple[float, dict[int, int] | None, float]]] = {}
    else:
        bound_obj = {j: bounds(j) for j in range(len(bases))}
        lb = np.array([b[0][0] if b else np.inf for b in bound_obj.values()])

    def bounds_of(j: int) -> list[tuple[float, dict[int, int] | None, float]]:
        if j not in bound_obj:
            bound_obj[j] = bounds(j)
        return bound_obj[j]

    order = np.lexsort((np.arange(len(bases)), lb))
    modes = sorted(set(np.unique(enumerate_plans(pr).recompute).tolist()))
    # a bound on p v T per base that sees memory and the layer split (stage_bounds.py; mixed: least over systems),
    # computed when the search reaches a base: first for the next STRONG_CHUNK bases in order, then for all the
    # others still below the incumbent, fewer once the first bases gave a good plan (a base's bound depends on that
    # base only; each call costs a fixed ~8 ms per pp, so there are at most two)
    strong = np.full(len(bases), np.nan)  # nan: not computed yet
    chunk = STRONG_CHUNK

    def fill_strong(idx: NDArray[np.int64]) -> None:
        mixed_hws: list[int] | None = None
        limits: list[tuple[list[int], NDArray[np.int64]]] | None = None
        if pr.space.mixed_stages:  # every base: the same GPU types with a supply, its own stages per type
            mixed_hws = jobs[int(idx[0])][0]
            limits = [(hws, np.array([jobs[int(j)][1][i][1] for j in idx])) for i, (hws, _) in
                      enumerate(jobs[int(idx[0])][1])]
        strong[idx] = strong_bounds(model, bases.take(idx), total_us[idx], modes, hw_choices=mixed_hws,
                                    supply=limits)
    n_micro = pr.training_task.global_batch / (bases.dp * bases.mbs)

    def strong_prunes(j: int) -> bool:
        """Base ``j``'s strong bound is above the thresholds of _solve_base against the incumbent (one per
        composition: its rate); inf: no split fits in memory."""
        if not (strong[j] == np.inf or (np.isfinite(strong[j]) and np.isfinite(best_obj))):
            return False
        pv, extra = int(bases.pp[j] * bases.vpp[j]), rounding_us(n_micro[j], int(bases.pp[j]))
        return bool(strong[j] == np.inf or strong[j] > max(
            int(np.ceil((best_obj / rate - (0.0 if best_plan is not None else 0.5 / rate + extra)) * pv)) - 1
            for _, _, rate in bounds_of(j)))

    best_plan, best_obj, best_us, exact, solved, booleans = None, float(incumbent), None, True, 0, 0
    pruned, out_of_time, models = 0, False, 0
    open_bound = np.inf  # lowest lower bound of the bases / compositions not solved to optimality
    proofs = SplitProofs()  # lower bounds proven on row sets, reused by later bases (stage_split_bound.py)
    pending: list[Entry] = []  # entries whose CP-SAT model is left for the second pass, in visiting order

    def examine(entry: Entry, defer: bool) -> Outcome:
        """One base / composition against the best plan: CP-SAT, or (``defer``) the split bound and the dynamic
        programme's split within the limit, CP-SAT left for the second pass."""
        _, counts, rate, j, cand = entry
        (hws, supply, _), base = jobs[j], bases.take([j])
        remaining = time_limit_s - (time.perf_counter() - t0)
        if remaining <= 0:
            return "unknown", None, [], 0
        # against the uniform incumbent (rounded once), an uneven plan must win beyond both roundings
        margin_us = 0.0 if best_plan is not None else 0.5 / rate + rounding_us(float(cand["n_micro"][0]),
                                                                                int(base.pp[0]))
        pv, hourly = int(base.pp[0] * base.vpp[0]), usd_per_hour(model, base, hws, counts)
        if not step_lims.deployment_ok(int(base.gpus[0]), hourly):
            return "infeasible", None, [], 0  # over max_gpus or max_cost_per_hour: no plan is admissible
        cap = step_lims.max_objective(pv, hourly) if step_lims.active else None
        return _solve_base(cand, int(base.pp[0]), model.workload.layers, best_obj / rate - margin_us,
                           opts.with_time_limit(remaining), supply, counts,
                           vpp=int(base.vpp[0]), cap=cap, proofs=proofs, defer=defer)

    def settle(entry: Entry, outcome: Outcome) -> None:
        """What ``examine`` found: a better plan, a model left for the second pass, or an open bound."""
        nonlocal best_plan, best_obj, best_us, exact, booleans, open_bound, models
        status, step_us, chosen, nb = outcome
        booleans, models = max(booleans, nb), models + (nb > 0)
        if status == "deferred":
            pending.append(entry)
        if status in ("unknown", "feasible"):
            exact = False
            open_bound = min(open_bound, entry[0])
        if step_us is not None and step_us * entry[2] < best_obj:
            best_obj, best_us = step_us * entry[2], step_us
            best_plan = _plan(model, bases.take([entry[3]]), entry[4], chosen)

    for pos, j in enumerate(order):  # first pass: bounds and dynamic programmes (CP-SAT only without DEFER)
        if lb[j] >= best_obj:
            pruned += len(order) - pos
            break
        if np.isnan(strong[j]):
            ahead = order[pos : pos + chunk]
            fill_strong(ahead[(lb[ahead] < best_obj) & np.isnan(strong[ahead])])
            chunk = len(order)
        if strong_prunes(int(j)):
            pruned += 1
            continue
        cand = _candidates(model, bases.take([int(j)]), modes, jobs[int(j)][0])
        for bound, counts, rate in bounds_of(int(j)):
            if bound >= best_obj:
                break
            if time_limit_s <= time.perf_counter() - t0:
                exact, out_of_time = False, True
                open_bound = min(open_bound, float(lb[j]))  # later bases (sorted) and compositions bound >= lb[j]
                break
            entry = (bound, counts, rate, int(j), cand)
            settle(entry, examine(entry, DEFER))
            solved += 1
        if out_of_time:
            break
    for entry in pending:  # second pass: CP-SAT against the best plan found
        if out_of_time or time_limit_s <= time.perf_counter() - t0:
            exact, out_of_time, open_bound = False, True, min(open_bound, entry[0])
        elif entry[0] < best_obj:
            settle(entry, examine(entry, False))
    status = (
        ("optimal" if exact else "feasible")
        if best_plan is not None
        else ("no-improvement" if exact else "feasible")
    )
    return UnevenResult(
        best_plan, best_us, status, solved, pruned, time.perf_counter() - t0, booleans,
        best_obj if best_plan is not None else None,
        min(best_obj, open_bound),  # every base was solved, pruned by its bound, or is still open
        models,
    )
