"""Online serving search: the plan that carries ``task.arrival_rate`` (Poisson requests/s) under latency targets
(percentiles ``ttft_p99_s`` ... or means) with the highest sustainable arrival rate per GPU.

Candidates are the serving enumeration (tp, pp, dp, precision, GPU type and count) with the running-batch cap
(``max_num_seqs``) searched on the batch grid up to what the KV cache holds. For each, ``queueing.max_rate`` finds
the highest rate meeting every target (vectorised bisection); a candidate is admissible when that rate carries
``arrival_rate`` and the cluster limits hold. The objective, GPU-microseconds per request (gpus / rate, rounded
once), is minimised over every admissible candidate (one pick under per-candidate limits needs no assembly), ties
broken by enumeration order; candidates whose stability limit cannot beat the best found are skipped (exact).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.errors import InfeasibleError, InternalError, ProblemError
from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.core.units import US
from madmax_opt.model.family_name import serving_task
from madmax_opt.model.inference import INVALID_REASONS, PRECISIONS, ServingArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.queueing import OnlineLatency, ServiceTable, latency, max_rate, meets, service_table
from madmax_opt.search.assemble import admissible_mask, cluster_limits
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.serving_space import ServingModel, enumerate_serving


@dataclass
class OnlineCandidates:
    plans: ServingArrays  # max_seqs = the running-batch cap searched
    table: ServiceTable
    valid: NDArray[np.bool_]
    max_rate: Arr  # requests/s of the whole deployment meeting every target
    at_rate: OnlineLatency  # latencies at task.arrival_rate

    @property
    def gpu_us_per_request(self) -> IntArr:
        return gpu_us_per_request(self.plans.gpus, self.max_rate)


OBJECTIVE_LIMIT = 2.0**50  # GPU-us per request of a plan that carries (next to) nothing


def gpu_us_per_request(gpus: IntArr, rate: Arr) -> IntArr:
    """The objective rint(gpus / rate x 1e6), saturated at OBJECTIVE_LIMIT (a rate of 0 or one so small that the
    quotient would reach it is never divided: no overflow)."""
    us = gpus.astype(np.float64) * US
    out = np.full(len(us), OBJECTIVE_LIMIT)
    np.divide(us, rate, out=out, where=rate > us / OBJECTIVE_LIMIT)
    return np.minimum(np.rint(out), OBJECTIVE_LIMIT).astype(np.int64)


def check_options(problem: Problem, cpsat: CpSatOptions | None, workers: int = 1) -> None:
    """Refuse, by name, what does not apply to the online search (exhaustive with exact pruning, no CP-SAT model),
    and a TPOT target when every request has one output token (there is no time between output tokens)."""
    file = problem.source
    given = [name for name, set_ in (("--solver-params", cpsat is not None and cpsat.params is not None),
                                     ("--export-model", cpsat is not None and cpsat.export_model is not None),
                                     ("--workers", workers != 1 or (cpsat is not None and cpsat.workers != 1)))
             if set_]
    if given:
        raise ProblemError(f"does not apply to online serving (task.arrival_rate): its search is exhaustive with "
                           f"exact pruning and builds no CP-SAT model; allowed: leave {', '.join(given)} out",
                           file=file, field=given[0])
    task = serving_task(problem.task)
    if task is None:
        return
    outputs = [task.output_len] if task.output_len is not None else [r.output_len for r in (task.mix or [])]
    tpot = [k for k in task.latency_targets() if k.startswith("tpot")]
    if tpot and outputs and max(outputs) <= 1:
        raise ProblemError("every request has output_len 1: there is no time per output token; allowed: "
                           "output_len >= 2, or no TPOT target", file=file, field=f"task.{tpot[0]}")


def online_plans(model: ServingModel) -> ServingArrays:
    """The serving enumeration with each grid batch read as the running-batch cap (max_num_seqs)."""
    plans = enumerate_serving(model)
    return replace(plans, max_seqs=plans.batch.copy())


def online_candidates(model: ServingModel, plans: ServingArrays | None = None) -> OnlineCandidates:
    task = model.task
    assert task.arrival_rate is not None
    plans = online_plans(model) if plans is None else plans
    table = service_table(model.terms, plans, model.workload)
    valid = np.asarray(model.terms(plans).invalid == 0)
    rate = np.where(valid, max_rate(table, task.latency_targets()), 0.0)
    at_rate = latency(table, np.full(len(plans), task.arrival_rate) / table.replicas)
    return OnlineCandidates(plans, table, valid, rate, at_rate)


def admissible(model: ServingModel, oc: OnlineCandidates) -> NDArray[np.bool_]:
    """Valid, carries the arrival rate within the targets, and within the GPU count, budget and supply."""
    p = model.problem
    assert model.task.arrival_rate is not None
    cost_cents = np.rint(model.table.price_per_gpu_hour[oc.plans.hw] * oc.plans.gpus * 100).astype(np.int64)
    lims = cluster_limits(p.hardware, oc.plans.hw, oc.plans.gpus, cost_cents, p.constraints.max_gpus,
                          p.constraints.max_cost_per_hour)
    return admissible_mask(oc.valid & (oc.max_rate >= model.task.arrival_rate), lims)


def record(model: ServingModel, oc: OnlineCandidates, i: int) -> dict[str, Any]:
    p, lat, st = oc.plans, oc.at_rate, oc.table
    opt = model.problem.hardware[int(p.hw[i])]
    pct = {f"{m}_p{q}_s": float(getattr(lat, f"{m}_s")[i, j]) for m in ("ttft", "tpot")
           for j, q in enumerate((50, 90, 99))}
    return {
        "plan": {"dp": int(p.dp[i]), "tp": int(p.tp[i]), "pp": int(p.pp[i]), "ep": int(p.ep[i]),
                 "max_num_seqs": int(st.cap[i]), "precision": PRECISIONS[int(p.precision[i])],
                 "system": opt.system.name},
        "hardware": {"system": opt.system.name, "gpu": opt.gpu.name, "gpus": opt.gpus},
        "arrival_rate": model.task.arrival_rate,
        "max_rate": float(oc.max_rate[i]),
        "max_rate_per_gpu": float(oc.max_rate[i] / opt.gpus),
        "stability_limit": float(st.max_rate_per_replica()[i] * st.replicas[i]),
        "at_arrival_rate": {**pct, "ttft_mean_s": float(lat.ttft_mean_s[i]), "tpot_mean_s": float(lat.tpot_mean_s[i]),
                            "running_per_replica": float(lat.running[i]), "utilisation": float(lat.utilisation[i]),
                            "wait_probability": float(lat.wait_probability[i])},
        "output_tokens_per_s_at_max_rate": float(oc.max_rate[i] * model.workload.mean_output),
        "cost_per_hour_usd": float(opt.system.price_per_gpu_hour * opt.gpus),
    }


CHUNK = 64  # candidates whose max rate is computed together


def solve_online(problem: Problem, top_k: int = 1, model: ServingModel | None = None,
                 cpsat: CpSatOptions | None = None, workers: int = 1, each_system: bool = False) -> dict[str, Any]:
    """The JSON object of ``solve`` for an arrival-rate problem: best plans by arrival rate per GPU.

    Exact pruning: a plan's max rate is at most its stability limit, so its objective is at least
    rint(gpus / limit); candidates are evaluated in order of that bound, in chunks, until the next bound exceeds the
    k-th best objective found (ties are kept: they could win on enumeration order). ``cpsat`` and ``workers`` are
    the CLI's CP-SAT options: refused when set (``check_options``). With ``each_system``, the same search goes on
    (over the candidates of the systems not yet settled) until each system's best is known, and ``options`` lists
    each system's best plan, as the problem solved on that system alone returns it (``online_options``)."""
    t0 = time.perf_counter()
    check_options(problem, cpsat, workers)
    model = model or ServingModel(problem)
    task = model.task
    assert task.arrival_rate is not None
    plans = online_plans(model)
    table = service_table(model.terms, plans, model.workload)
    valid = np.asarray(model.terms(plans).invalid == 0)
    limit = table.max_rate_per_replica() * (1.0 - 1e-6) * table.replicas
    bound = OnlineCandidates(plans, table, valid, limit, _no_latency(len(plans)))
    pre = admissible(model, bound)  # valid, within the cluster limits, stable at the arrival rate
    lb = bound.gpu_us_per_request
    order = [int(i) for i in np.lexsort((np.arange(len(plans)), lb)) if pre[i]]
    rate = np.zeros(len(plans))
    searched = np.zeros(len(plans), dtype=bool)  # max rate computed (the others miss a target at the arrival rate)
    found: list[tuple[int, int]] = []  # (objective, index) of admissible candidates evaluated
    evaluated = 0

    def evaluate(idx: NDArray[np.int64]) -> list[tuple[int, int]]:
        """Max rates of the candidates ``idx`` (rows are independent: a candidate's rate does not depend on the
        others evaluated with it); the admissible ones as (objective, index)."""
        part = table.take(idx)
        # every latency grows with the rate: a plan that misses a target at the arrival rate has max rate below
        # it (inadmissible), so only the plans meeting every target there are searched (one model call)
        carries = meets(part, np.full(len(idx), task.arrival_rate) / part.replicas, task.latency_targets())
        if carries.any():
            rate[idx[carries]] = max_rate(part.take(np.flatnonzero(carries)), task.latency_targets())
        searched[idx[carries]] = True
        obj = gpu_us_per_request(plans.gpus[idx], rate[idx])
        return [(int(o), int(i)) for o, i, r in zip(obj, idx, rate[idx], strict=True) if r >= task.arrival_rate]

    start = 0
    for start in range(0, len(order), CHUNK):
        if len(found) >= top_k and lb[order[start]] > sorted(found)[top_k - 1][0]:
            break
        idx = np.array(order[start : start + CHUNK], dtype=np.int64)
        found += evaluate(idx)
        evaluated += len(idx)
    else:
        start = len(order)
    if not found:
        missed = np.array(order[:evaluated], dtype=np.int64)
        missed = missed[~searched[missed]]
        if len(missed):  # the explanation quotes the best max rate
            rate[missed] = max_rate(table.take(missed), task.latency_targets())
        raise InfeasibleError(_explain(model, OnlineCandidates(plans, table, valid, rate, bound.at_rate)))
    top = [i for _, i in sorted(found)[:top_k]]
    systems = [model.problem.hardware[int(h)].system.name for h in plans.hw]
    best_of: dict[str, tuple[int, int]] = {}  # system -> (objective, index) of its best
    if each_system:  # the search goes on over the systems whose best is not settled yet
        number = {n: k for k, n in enumerate(dict.fromkeys(systems))}
        system_of = np.array([number[n] for n in systems], dtype=np.int64)  # per plan: its system's number
        best_objective = np.full(len(number), np.inf)  # per system: its best objective so far (inf: none yet)

        def settle(pairs: list[tuple[int, int]]) -> None:
            for o, i in pairs:
                best_of[systems[i]] = min(best_of.get(systems[i], (o, i)), (o, i))
                best_objective[system_of[i]] = best_of[systems[i]][0]

        settle(found)
        rest = np.array(order[start:], dtype=np.int64)
        while rest.size:
            # a candidate can still be its system's best while its bound is at most that system's best objective
            rest = rest[lb[rest] <= best_objective[system_of[rest]]]
            if not rest.size:
                break
            idx, rest = rest[:CHUNK], rest[CHUNK:]
            settle(evaluate(idx))
    sel = np.array(top + [i for _, i in best_of.values()], dtype=np.int64)
    sub_table = table.take(sel)
    at_rate = latency(sub_table, np.full(len(sel), task.arrival_rate) / sub_table.replicas)
    oc = OnlineCandidates(plans.take(sel), sub_table, valid[sel], rate[sel], at_rate)
    records = [record(model, oc, j) for j in range(len(sel))]
    optimum = sorted(found)[0][0]
    result: dict[str, Any] = {
        "task": "inference-online",
        "status": "optimal",  # exhaustive over the candidates with exact pruning: proven
        "objective": "arrival rate per GPU",
        "best": records[0],
        "top": records[: len(top)],
        "solver": {"method": "exhaustive with exact pruning by the stability limit", "candidates": len(plans),
                   "evaluated": evaluated, "admissible_evaluated": len(found),
                   "objective": optimum, "objective_unit": "GPU-us per request",
                   "wall_s": time.perf_counter() - t0},
    }
    if each_system:
        per_system = zip(best_of, best_of.values(), records[len(top) :], strict=True)
        result["options"] = online_options(problem, float(optimum), {s: (o, r) for s, (o, _), r in per_system})
    return result


def online_options(problem: Problem, optimum: float,
                   best_of: dict[str, tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each system's best plan (``best_of``: system -> (objective, record), GPU-us per request), its objective and
    how far it is from the optimum; a system with no admissible plan is solved alone for the reason."""
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(o.system.name for o in problem.hardware):
        if name not in best_of:
            try:
                solve_online(problem.on_system(name), 1)
            except (InfeasibleError, ProblemError) as exc:
                rows.append({"system": name, "best": None, "objective": None, "vs_optimum": None,
                             "reason": str(exc)})
                continue
            raise InternalError(f"{name}: the online search found no admissible plan on this system, solved alone it "
                                "has one (a bug, never a silent answer)")
        value = float(best_of[name][0])
        rows.append({"system": name, "best": best_of[name][1], "objective": value,
                     "vs_optimum": value / optimum - 1.0 if optimum > 0 else 0.0, "reason": None})
    rows.sort(key=lambda r: (r["vs_optimum"] is None, r["vs_optimum"] or 0.0))
    return rows


def evaluate_online(problem: Problem, plans: list[Any]) -> list[dict[str, Any]]:
    """``evaluate`` on an arrival-rate problem: each plan's percentiles at ``task.arrival_rate``, its max rate under
    the targets and its stability limit. The running-batch cap is the plan's ``max_num_seqs`` (else its ``batch``,
    else the KV-cache limit and the framework default)."""
    from madmax_opt.search.serving_space import as_serving_plan

    check_options(problem, None)
    model = ServingModel(problem)
    task = model.task
    assert task.arrival_rate is not None
    given = [as_serving_plan(p, problem) for p in plans]
    arr = model.arrays(given)
    arr = replace(arr, max_seqs=np.where(arr.max_seqs > 0, arr.max_seqs,
                                         np.array([p.batch or 0 for p in given], dtype=np.int64)))
    table = service_table(model.terms, arr, model.workload)
    terms = model.terms(arr)
    valid = np.asarray(terms.invalid == 0)
    rate = np.where(valid, max_rate(table, task.latency_targets()), 0.0)
    at_rate = latency(table, np.full(len(arr), task.arrival_rate) / table.replicas)
    oc = OnlineCandidates(arr, table, valid, rate, at_rate)
    out = []
    for i in range(len(arr)):
        rec = record(model, oc, i)
        reason = None if valid[i] else INVALID_REASONS[int(terms.invalid[i])]
        if reason is None and rate[i] < task.arrival_rate:
            reason = (f"carries at most {rate[i]:.3g} requests/s within the targets; arrival_rate is "
                      f"{task.arrival_rate:g}")
        out.append({**rec, "feasible": reason is None, "infeasible_reason": reason})
    return out


def verify_online(problem: Problem, cpsat: CpSatOptions | None = None) -> dict[str, Any]:
    """``verify`` on an arrival-rate problem: the max rate of every candidate (no pruning), the best by the same
    objective and enumeration order, against ``solve_online``'s pruned search."""
    check_options(problem, cpsat)
    model = ServingModel(problem)
    t0 = time.perf_counter()
    oc = online_candidates(model)
    ok = admissible(model, oc)
    obj = oc.gpu_us_per_request
    order = np.flatnonzero(ok)[np.lexsort((np.flatnonzero(ok), obj[ok]))]
    brute_s = time.perf_counter() - t0
    try:
        solved = solve_online(problem, model=model)
    except InfeasibleError as exc:
        return {"agree": len(order) == 0, "solver": f"infeasible: {exc}", "brute_force": len(order),
                "space": len(oc.plans)}
    best = int(order[0]) if len(order) else None
    bf_obj = int(obj[best]) if best is not None else None
    sv_obj = int(solved["solver"]["objective"])
    return {
        "agree": bf_obj is not None and sv_obj <= bf_obj,
        "scope": "every online-serving candidate (tp, pp, dp, precision, GPU type and count, max_num_seqs)",
        "objective": "GPU-us per request at the max rate within the targets",
        "space": len(oc.plans),
        "admissible": len(order),
        "solver_objective": sv_obj,
        "brute_force_objective": bf_obj,
        "solver_plan": solved["best"]["plan"],
        "brute_force_plan": record(model, oc, best)["plan"] if best is not None else None,
        "solver_wall_s": solved["solver"]["wall_s"],
        "brute_force_wall_s": brute_s,
    }


def _no_latency(n: int) -> OnlineLatency:
    nan = np.full(n, np.nan)
    return OnlineLatency(np.full((n, 3), np.nan), np.full((n, 3), np.nan), nan, nan, nan, nan, nan, nan,
                         np.zeros(n, dtype=bool))


def _explain(model: ServingModel, oc: OnlineCandidates) -> str:
    task = model.task
    if not oc.valid.any():
        return "no serving plan is valid (memory or shape); evaluate a plan for the reason"
    best = int(np.argmax(np.where(oc.valid, oc.max_rate, -1.0)))
    targets = ", ".join(f"{k} {v * 1e3:g} ms" for k, v in task.latency_targets().items()) or "none"
    return (f"no serving plan carries arrival_rate {task.arrival_rate:g} requests/s (binding: the latency targets "
            f"[{targets}] and the stability limit); the best reaches {oc.max_rate[best]:.3g} requests/s on "
            f"{model.problem.hardware[int(oc.plans.hw[best])].name}")
