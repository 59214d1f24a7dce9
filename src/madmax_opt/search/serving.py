"""Serving search: an exact selection over the enumerated candidates under latency targets, exact records,
explanations of infeasibility and the throughput-latency Pareto front.

Same design as ``solver`` (docs/reference/solver-notes.md, "enumerate, then assemble", the assembly a numpy sort,
no CP-SAT model); the candidates and their integer columns come from ``search.serving_space`` (re-exported here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.serving_records import (
    ServingHardwareRecord,
    ServingInterval,
    ServingPlanRecord,
    ServingRecord,
)
from madmax_opt.core.errors import InfeasibleError, InternalError
from madmax_opt.core.numeric import IntArr
from madmax_opt.model.inference import (
    DEFAULT_KV_PRECISION,
    INVALID_REASONS,
    MEMORY_REASON,
    PRECISIONS,
    STEP_TERMS,
    ServingArrays,
)
from madmax_opt.model.objectives import objective_values, uniform_rates
from madmax_opt.model.plan_settings import plan_text
from madmax_opt.model.problem import Problem
from madmax_opt.model.serving_calibration import ServingCatalog, record_interval
from madmax_opt.model.spec import Plan
from madmax_opt.search.assemble import admissible_mask, solver_summary, supplies
from madmax_opt.search.cpsat import CpSatOptions, warn_if_unused
from madmax_opt.search.cpsat import options as cpsat_options
from madmax_opt.search.objectives import serving_units
from madmax_opt.search.selection import METHOD, select_best
from madmax_opt.search.serving_space import (
    BATCH_GRID,
    US,
    ServingCandidates,
    ServingModel,
    ServingPlan,
    _gpu_type,
    _min_tokens_per_s,
    admissible,
    as_serving_plan,
    brute_force_order,
    candidates,
    cluster,
    enumerate_serving,
    meets_targets,
    serving_plan,
    target_limits,
    within_cluster_limits,
)

__all__ = [
    "ServingCandidates",
    "ServingModel",
    "ServingPlan",
    "admissible",
    "as_serving_plan",
    "brute_force_order",
    "candidates",
    "enumerate_serving",
    "meets_targets",
    "serving_plan",
    "within_cluster_limits",
]


# ------------------------------------------------------------------------------------------- selection


@dataclass
class ServingOutcome:
    status: str
    top: list[int]
    objective: int | None
    best_bound: float | None
    wall_s: float
    candidates: ServingCandidates
    model_size: int


def solve_serving(
    problem: Problem,
    *,
    top_k: int = 1,
    time_limit_s: float = 60.0,
    workers: int = 1,
    seed: int = 0,
    cpsat: CpSatOptions | None = None,
    model: ServingModel | None = None,
    plans: ServingArrays | None = None,
) -> ServingOutcome:
    """The best serving plan(s) under the targets; InfeasibleError names what binds."""
    t0 = time.perf_counter()
    cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers, seed=seed)  # checked; no CP-SAT model here
    model = model or ServingModel(problem)
    c = candidates(model, plans)
    lims = target_limits(model, c) + cluster(model, c)
    pick = select_best(c.int_objective(problem.objective), admissible_mask(c.valid, lims), c.plans.hw, top_k=top_k,
                       file=problem.source)
    if pick is None:
        raise InfeasibleError(explain_infeasible(model, c))
    # an exact sort of every admissible candidate: optimal, its own bound, no CP-SAT model
    return ServingOutcome("optimal", pick.top, pick.objective, pick.objective, time.perf_counter() - t0, c, 0)


# --------------------------------------------------------------------------------------------- records


def _reason(model: ServingModel, c: ServingCandidates, i: int) -> str | None:
    code = int(c.terms.invalid[i])
    if code == MEMORY_REASON:
        mem = c.terms.memory
        return (
            f"weights and one sequence's KV cache need {mem['total'][i] / 1e9:.1f} GB per GPU, usable "
            f"{mem['capacity'][i] / 1e9:.1f} GB (no sequence fits)"
        )
    if code:
        return INVALID_REASONS[code]
    task = model.task
    misses = []
    if task.ttft_s is not None and c.ttft_us[i] > round(task.ttft_s * US):
        misses.append(f"TTFT {c.terms.ttft_s[i] * 1e3:.1f} ms exceeds the target {task.ttft_s * 1e3:g} ms")
    if task.tpot_s is not None and c.tpot_us[i] > round(task.tpot_s * US):
        misses.append(f"TPOT {c.terms.tpot_s[i] * 1e3:.2f} ms exceeds the target {task.tpot_s * 1e3:g} ms")
    floor = _min_tokens_per_s(task, model)
    if floor is not None and c.tokens_per_s[i] < floor:
        misses.append(
            f"{c.terms.output_tokens_per_s[i]:,.0f} output tokens/s is below min_throughput {floor:,}"
        )
    return "; ".join(misses) or None


def plan_record(model: ServingModel, c: ServingCandidates, i: int) -> ServingPlanRecord:
    """Candidate ``i``'s plan, every setting resolved."""
    p = c.plans
    opt = model.problem.hardware[int(p.hw[i])]
    return ServingPlanRecord(
        dp=int(p.dp[i]), tp=int(p.tp[i]), pp=int(p.pp[i]), ep=int(p.ep[i]), batch=int(p.batch[i]),
        max_num_seqs=int(p.max_seqs[i]) or None, precision=PRECISIONS[int(p.precision[i])],
        prefill_replicas=int(p.prefill_dp[i]), system=opt.system.name,
    )


def plan_dict(model: ServingModel, c: ServingCandidates, i: int) -> dict[str, Any]:
    """Candidate ``i``'s plan as the JSON object of its record."""
    return plan_record(model, c, i).model_dump()


def serving_records(
    model: ServingModel, c: ServingCandidates, index: list[int] | IntArr | None = None
) -> list[ServingRecord]:
    """The typed records of candidates ``index`` (every candidate when None), in order."""
    t = c.terms
    rows = range(len(c.plans)) if index is None else [int(i) for i in index]
    # whole-candidate columns, computed once (each access builds the candidates' rates again)
    cost_per_hour, usd_per_million = c.cost_per_hour, c.usd_per_million_tokens
    out = []
    for i in rows:
        hw = int(c.plans.hw[i])
        opt = model.problem.hardware[hw]
        reason = _reason(model, c, i)
        # the calibration level's 80 % interval on TPOT and throughput (the level's held-out residuals)
        iv = record_interval(model.calibration[hw], float(t.tpot_s[i]), float(t.output_tokens_per_s[i]),
                             float(t.output_tokens_per_s_per_gpu[i]))
        out.append(ServingRecord(
            plan=plan_record(model, c, i),
            hardware=ServingHardwareRecord(system=opt.system.name, gpu=opt.gpu.name, gpus=opt.gpus),
            feasible=reason is None,
            infeasible_reason=reason,
            ttft_s=float(t.ttft_s[i]),
            tpot_s=float(t.tpot_s[i]),
            output_tokens_per_s=float(t.output_tokens_per_s[i]),
            output_tokens_per_s_per_gpu=float(t.output_tokens_per_s_per_gpu[i]),
            kv_precision=model.task.kv_precision or DEFAULT_KV_PRECISION[PRECISIONS[int(c.plans.precision[i])]],
            max_batch=int(t.max_batch[i]),
            running_batch=int(t.running_batch[i]),
            queue_wait_s=float(t.queue_wait_s[i]),
            framework=model.framework,
            calibration=model.calibration[hw],
            kv_cache_bytes_per_gpu=float(t.memory["kv_cache"][i]),
            decode_step_s=float(t.decode_step_s[i]),
            prefill_s=float(t.prefill_s[i]),
            cost_per_hour_usd=float(cost_per_hour[i]),
            usd_per_million_tokens=float(usd_per_million[i]),
            memory_bytes_per_gpu={k: float(v[i]) for k, v in t.memory.items()},
            tpot_breakdown_s={k: float(t.step[k][i]) for k in STEP_TERMS},
            interval=None if iv is None else ServingInterval(**iv),
        ))
    return out


def to_records(
    model: ServingModel, c: ServingCandidates, index: list[int] | IntArr | None = None
) -> list[dict[str, Any]]:
    """The JSON objects of ``serving_records`` (what fleet, studies and launch read as plain dicts)."""
    return [r.to_json() for r in serving_records(model, c, index)]


def pareto_records(model: ServingModel, c: ServingCandidates) -> list[ServingRecord]:
    """The Pareto front's records (``pareto_front``), each with ``meets_targets``."""
    front = pareto_front(model, c)
    ok = meets_targets(model, c)
    return [r.model_copy(update={"meets_targets": bool(ok[i])})
            for i, r in zip(front, serving_records(model, c, front), strict=True)]


def evaluate_serving(
    problem: Problem, plans: list[Plan], catalog: ServingCatalog | None = None
) -> list[ServingRecord]:
    """Evaluate public plans of an inference problem (a plan without ``batch`` gets its best batch); ``catalog``
    replaces the package's serving calibration."""
    model = ServingModel(problem, catalog)
    records = []
    for plan in (as_serving_plan(p, problem) for p in plans):
        if plan.batch is None:
            records.append(best_batch_record(model, plan))
            continue
        arr = model.arrays([plan])
        records.append(serving_records(model, candidates(model, arr))[0])
    return records


def best_batch_record(model: ServingModel, plan: ServingPlan) -> ServingRecord:
    """The plan at its best batch: the highest-objective batch meeting the targets, else the largest that fits."""
    arr = model.arrays([plan])
    cap = plan.max_num_seqs or model.cal.default_max_num_seqs[int(arr.hw[0])]
    fits = int(min(candidates(model, arr).terms.max_batch[0], cap))
    grid = sorted({b for b in BATCH_GRID if b <= max(fits, 1)} | ({fits} if fits > 1 else set()))
    rows = arr.take([0] * len(grid))
    rows = ServingArrays(
        rows.dp, rows.tp, rows.pp, np.array(grid, dtype=np.int64), rows.precision, rows.prefill_dp, rows.hw,
        rows.ep, rows.max_seqs,
    )
    c = candidates(model, rows)
    ok = c.valid & meets_targets(model, c)
    obj = c.objective(model.problem.objective)
    if ok.any():
        idx = np.flatnonzero(ok)
        best = int(idx[np.lexsort((idx, obj[idx]))][0])
    else:
        best = len(grid) - 1
    return serving_records(model, c, [best])[0]


def cross_check(outcome: ServingOutcome, records: list[ServingRecord], objective: str) -> None:
    """Each returned plan, re-evaluated in floating point, must be feasible and match its integer objective."""
    c = outcome.candidates
    per_value = serving_units(objective).per_value
    for i, rec in zip(outcome.top, records, strict=True):
        gpus = float(rec.hardware.gpus)
        # from the record's own floats, not the integer columns
        rates = uniform_rates(np.array([1.0 / rec.output_tokens_per_s]), c.systems, c.plans.hw[i:i + 1],
                              np.array([gpus]), throughput_per_gpu=True)
        exact = float(objective_values(objective, rates)[0])
        rounded = c.objective(objective)[i] / per_value
        tol = 0.5 / per_value
        if not rec.feasible or abs(exact - rounded) > tol * (1 + 1e-9):
            raise InternalError(
                f"solver/evaluator mismatch on {rec.plan.model_dump()}: evaluator {exact:.9g}, solver "
                f"{rounded:.9g} (feasible={rec.feasible})"
            )


# ------------------------------------------------------------------------------------------ explanations




def explain_infeasible(model: ServingModel, c: ServingCandidates) -> str:
    """Name what binds: the plan space, memory, a latency or throughput target, or the cluster limits."""
    p = model.problem
    task = model.task
    if len(c.plans) == 0:
        sizes = ", ".join(str(o.gpus) for o in p.hardware)
        return (
            f"the plan space is empty: no allowed tp x pp divides the cluster size(s) {sizes} (check 'space')"
        )
    valid = c.valid
    if not valid.any():
        inv = c.terms.invalid
        if np.any(inv == MEMORY_REASON):
            cand = np.flatnonzero(inv == MEMORY_REASON)
            best = int(cand[np.argmin(c.terms.memory["total"][cand])])
            opt = p.hardware[int(c.plans.hw[best])]
            plan = plan_dict(model, c, best)
            return (
                f"{p.model.name} does not fit: even {plan_text(plan)} on {opt.name} needs "
                f"{c.terms.memory['total'][best] / 1e9:.1f} GB per GPU, usable "
                f"{c.terms.memory['capacity'][best] / 1e9:.1f} GB (binding constraint: memory capacity)"
            )
        code = int(np.bincount(inv[inv > 0]).argmax())
        return f"no plan in the space is valid; most common violation: {INVALID_REASONS[code]}"
    reasons = []
    ok_cluster = valid & within_cluster_limits(model, c)
    pool = ok_cluster if ok_cluster.any() else valid
    types = _gpu_type(model, c.plans)
    for name, target, metric in (
        ("TTFT", task.ttft_s, c.terms.ttft_s),
        ("TPOT", task.tpot_s, c.terms.tpot_s),
    ):
        if target is None:
            continue
        unit = US
        hit = pool & ((c.ttft_us if name == "TTFT" else c.tpot_us) <= round(target * unit))
        if hit.any():
            continue
        per_type = []
        for gpu in dict.fromkeys(types[pool].tolist()):
            sel = np.flatnonzero(pool & (types == gpu))
            best = int(sel[np.argmin(metric[sel])])
            opt = p.hardware[int(c.plans.hw[best])]
            per_type.append(
                f"{metric[best] * 1e3:.3g} ms on {gpu} ({opt.name}: {plan_text(plan_dict(model, c, best))})"
            )
        reasons.append(
            f"{name} {target * 1e3:g} ms needs a faster plan than any in the space; the best reachable "
            f"is " + "; ".join(per_type)
        )
    floor = _min_tokens_per_s(task, model)
    if floor is not None:
        lat_ok = pool & meets_targets_latency(model, c)
        best_rate = c.terms.output_tokens_per_s[lat_ok].max() if lat_ok.any() else 0.0
        if best_rate < floor:
            reasons.append(
                f"min_throughput {floor:,} output tokens/s: the best plan meeting the latency targets "
                f"reaches {best_rate:,.0f}"
            )
    if not reasons:
        fit_targets = valid & meets_targets(model, c)
        cons = p.constraints
        if fit_targets.any():
            fewest = int(c.plans.gpus[fit_targets].min())
            cheapest = float(c.cost_per_hour[fit_targets].min())
            reasons.append(
                f"the targets need at least {fewest} GPUs (${cheapest:,.2f}/h); limits: max_gpus="
                f"{cons.max_gpus}, max_cost_per_hour={cons.max_cost_per_hour}, supply={supplies(model.problem.hardware)}"
            )
        else:
            reasons.append("the targets together exclude every valid plan")
    return "no serving plan meets the targets (binding: " + "; ".join(reasons) + ")"


def meets_targets_latency(model: ServingModel, c: ServingCandidates) -> NDArray[np.bool_]:
    task = model.task
    ok = np.ones(len(c.plans), dtype=bool)
    if task.ttft_s is not None:
        ok &= c.ttft_us <= round(task.ttft_s * US)
    if task.tpot_s is not None:
        ok &= c.tpot_us <= round(task.tpot_s * US)
    return ok


# ---------------------------------------------------------------------------------------------- Pareto


def pareto_front(model: ServingModel, c: ServingCandidates) -> IntArr:
    """Valid candidates (within the cluster limits) not dominated in (lower TPOT, higher tokens/s per GPU),
    ignoring the latency targets; one candidate per distinct point, the first in enumeration order."""
    idx = np.flatnonzero(c.valid & within_cluster_limits(model, c))
    if len(idx) == 0:
        return idx
    cost = c.gpu_ns_per_token  # integer GPU-ns per token: lower is higher throughput per GPU
    order = idx[np.lexsort((idx, cost[idx], c.tpot_us[idx]))]
    front: list[int] = []
    best = np.iinfo(np.int64).max
    for i in order:
        if cost[i] < best:
            front.append(int(i))
            best = int(cost[i])
    return np.array(front, dtype=np.int64)


# ------------------------------------------------------------------------------------------ entry points


def solve_result(
    problem: Problem, top_k: int, time_limit: float, workers: int, cpsat: CpSatOptions | None = None
) -> dict[str, Any]:
    """The JSON object of ``solve --json`` for an inference problem."""
    return solve_result_with(problem, top_k, time_limit, workers, cpsat)[0]


def solve_result_with(
    problem: Problem, top_k: int, time_limit: float, workers: int, cpsat: CpSatOptions | None = None
) -> tuple[dict[str, Any], ServingModel, ServingCandidates]:
    """:func:`solve_result` with the prepared model and its candidates (a co-design solve's per-system rows
    reuse them instead of pricing the hardware and every plan again)."""
    model = ServingModel(problem)
    opts = cpsat_options(cpsat, time_limit_s=time_limit, workers=workers)
    outcome = solve_serving(problem, top_k=top_k, cpsat=opts, model=model)
    warn_if_unused(opts, "the serving search ran an exact enumeration")
    c = outcome.candidates
    records = serving_records(model, c, outcome.top)
    cross_check(outcome, records, problem.objective)
    baseline = evaluate_serving(problem, [problem.baseline])[0] if problem.baseline else None
    speedup = None
    if baseline and baseline.feasible:
        speedup = records[0].output_tokens_per_s_per_gpu / baseline.output_tokens_per_s_per_gpu
    summary = solver_summary(outcome.objective, outcome.best_bound, outcome.wall_s, len(c.plans), outcome.model_size)
    summary["objective_unit"] = serving_units(problem.objective).integer_unit
    summary["admissible"] = int(admissible(model, c).sum())
    summary["method"] = METHOD
    result = {
        "task": "inference",
        "status": outcome.status,
        "objective": problem.objective,
        "best": records[0].to_json(),
        "top": [r.to_json() for r in records],
        "solver": summary,
        "pareto": [r.to_json() for r in pareto_records(model, c)],
        "baseline": None if baseline is None else baseline.to_json(),
        "speedup_vs_baseline": speedup,
    }
    return result, model, c
