"""The recommender search: every hardware option's dense plans with the CP-SAT table placement, ranked by the
objective registry; the paper-style baseline; evaluation of given DLRM plans."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from madmax_opt.analysis.dlrm_records import (
    DensePlanJSON,
    DLRMOptionJSON,
    DLRMRecord,
    DLRMSolveResult,
    PlacementSolverJSON,
)
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import NS, SECONDS_PER_HOUR
from madmax_opt.model.dlrm import Layout, layout_of, lower
from madmax_opt.model.dlrm_dense import (
    DENSE_INVALID,
    DensePlans,
    DenseTerms,
    dense_peak_flops,
    dense_terms,
    enumerate_dense,
    step_terms,
    step_time_s,
)
from madmax_opt.model.dlrm_embedding import (
    EmbeddingOptions,
    EmbeddingTimes,
    ShardArrays,
    ShardEntryJSON,
    compact_placement,
    embedding_options,
    embedding_times,
    per_gpu_terms,
    phase_weights,
    placement_objective_s,
    shards_from_plan,
)
from madmax_opt.model.dlrm_spec import DensePlan, DLRMPlan
from madmax_opt.model.objectives import Rates, objective_values, uniform_rates, usd_per_million_units
from madmax_opt.model.problem import DLRMProblem
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.cpsat import options as cpsat_options
from madmax_opt.search.dlrm_bound import step_floor_s
from madmax_opt.search.placement import (
    PlacementModel,
    PlacementResult,
    greedy_placement,
    solve_placement,
)
from madmax_opt.search.placement_ints import MEMORY, IntTables, int_objective, int_tables

# ===================================================================================== DLRM search


@dataclass
class OptionResult:
    """The best plan found on one hardware option, with its placement solve and the paper-style baseline."""

    hw: int
    record: DLRMRecord | None
    baseline: DLRMRecord | None
    placement: PlacementResult | None
    reason: str | None = None
    status: str = "optimal"  # feasible: a placement not proven optimal; pruned: the same, its floor above the best
    floor_s: float | None = None  # pruned: the lower bound on its step time that ruled it out


def _record(problem: DLRMProblem, hw: int, lay: Layout, opts: EmbeddingOptions, shards: ShardArrays,
            dense_plans: DensePlans, dense: DenseTerms, i: int, times: EmbeddingTimes,
            placement: list[ShardEntryJSON] | None = None) -> DLRMRecord:
    """The exact (float) evaluation of dense plan ``i`` (``dense``: dense_terms of ``dense_plans``) with placement
    ``shards`` as a JSON-ready record (``placement``: compact_placement of ``shards`` when already computed; a copy
    goes into the record)."""
    one = DensePlans(dense_plans.strategy[i:i + 1], dense_plans.tp[i:i + 1], dense_plans.ep[i:i + 1])
    dt = dense.take(i)
    t, hidden = step_terms(dt, times, problem.stack, problem.task)
    step = float(step_time_s(t)[0])
    opt = problem.hardware[hw]
    emb_mem = float(times.memory_bytes.max())
    dense_mem = float(dt.memory_bytes[0])
    total = emb_mem + dense_mem
    reasons = []
    if int(dt.invalid[0]):
        reasons.append(DENSE_INVALID[int(dt.invalid[0])])
    if total > lay.capacity_bytes:
        reasons.append(f"memory per GPU {total / 1e9:.1f} GB exceeds usable capacity {lay.capacity_bytes / 1e9:.1f} GB")
    samples_s = problem.task.global_batch / step
    price = opt.price_per_hour
    counts: dict[str, float] = {}  # tables per sharding (column shards count 1/split each)
    for o, k in zip(shards.option.tolist(), shards.count.tolist(), strict=True):
        s = opts.options[o]
        counts[s.sharding] = counts.get(s.sharding, 0) + k / s.split
    exposed_a2a = t["a2a_fwd"][0] + t["a2a_bwd"][0]
    d = one.plan(0)
    rec: DLRMRecord = {
        "plan": {"system": opt.system.name, "gpus": opt.gpus,
                 "dense": DensePlanJSON(strategy=d.strategy, tp=d.tp, ep=d.ep),
                 "placement": [ShardEntryJSON(**e) for e in placement] if placement is not None
                 else compact_placement(shards, opts, problem.model)},
        "hardware": {"system": opt.system.name, "gpu": opt.gpu.name, "gpus": opt.gpus},
        "feasible": not reasons,
        "infeasible_reason": "; ".join(reasons) or None,
        "step_time_s": step,
        "samples_per_s": samples_s,
        "cost_per_hour_usd": price,
        "usd_per_million_samples": usd_per_million_units(price, samples_s),
        "exposed_a2a_share": float(exposed_a2a / step),
        "time_breakdown_s": {k: float(v[0]) for k, v in t.items()},
        "overlapped_comm_s": {k: float(v[0]) for k, v in hidden.items()},
        "embedding": {
            "lookup_fwd_s": times.lookup_fwd_s,
            "lookup_bwd_s": times.lookup_bwd_s,
            "input_all_to_all_s": times.input_s,
            "output_all_to_all_s": times.output_s,
            "dp_allreduce_s": times.dp_allreduce_s,
            "placement_objective_s": placement_objective_s(times, problem.task),
            "per_collective_s": {k: v for k, v in times.per_collective_s.items() if v},
            "tables_by_sharding": counts,
        },
        "memory_bytes_per_gpu": {
            "embedding_max": emb_mem,
            "dense": {k: float(v[0]) for k, v in dt.memory.items()},
            "total": total,
            "capacity": lay.capacity_bytes,
        },
        "dense_mfu": float(dt.fwd_flops_per_gpu[0] * (3.0 if problem.task.kind == "train" else 1.0)
                           / (step * dense_peak_flops(opt.gpu, problem.model.dense_precision, problem.stack))),
    }
    if problem.task.train_samples:
        hours = problem.task.train_samples / samples_s / SECONDS_PER_HOUR
        rec["time_to_train"] = {"hours": hours, "gpu_hours": hours * opt.gpus, "cost_usd": hours * price}
    return rec


def _option_rates(problem: DLRMProblem, hw: int, seconds_per_sample: float) -> Rates:
    """The objective registry's inputs for a plan on option ``hw`` (model/objectives.py; the unit of work is a
    sample)."""
    opt = problem.hardware[hw]
    return uniform_rates(np.array([seconds_per_sample]), [opt.system], np.zeros(1, dtype=np.int64),
                         np.array([float(opt.gpus)]), problem.task.train_samples)


def objective_of_step(problem: DLRMProblem, hw: int, step_s: float) -> float:
    """The objective's value (the registry's unit) of a plan on option ``hw`` that takes ``step_s`` per step."""
    return float(objective_values(problem.objective,
                                  _option_rates(problem, hw, step_s / problem.task.global_batch))[0])


def _rates(problem: DLRMProblem, rec: DLRMRecord) -> Rates:
    """The registry's inputs for one record."""
    hw = next(i for i, o in enumerate(problem.hardware)
              if o.system.name == rec["hardware"]["system"] and o.gpus == rec["hardware"]["gpus"])
    return _option_rates(problem, hw, 1.0 / rec["samples_per_s"])


def objective_value(problem: DLRMProblem, rec: DLRMRecord) -> float:
    """The problem's objective of a record (float, the registry's unit: s, $ or J per sample, s of training)."""
    return float(objective_values(problem.objective, _rates(problem, rec))[0])


def _admissible(problem: DLRMProblem, rec: DLRMRecord) -> bool:
    c = problem.constraints
    return bool(rec["feasible"]
                and (c.max_gpus is None or rec["hardware"]["gpus"] <= c.max_gpus)
                and (c.max_cost_per_hour is None or rec["cost_per_hour_usd"] <= c.max_cost_per_hour)
                and (c.min_samples_per_s is None or rec["samples_per_s"] >= c.min_samples_per_s))


@dataclass
class PreparedOption:
    """What the search of one hardware option and its step floor share: the layout, the dense plans with their
    terms (``valid``: the structurally valid ones), and the embedding options under the loosest memory budget."""

    hw: int
    lay: Layout
    dense: DensePlans
    terms: DenseTerms
    valid: IntArr
    opts: EmbeddingOptions

    def floor_s(self, problem: DLRMProblem) -> float:
        """A lower bound on the step time of every plan of the option (search/dlrm_bound.py)."""
        return step_floor_s(self.opts, self.lay, self.terms, self.valid, problem.stack, problem.task)


def prepare_option(problem: DLRMProblem, hw: int) -> PreparedOption | OptionResult:
    """The option's prepared search, or its result when no dense plan is valid."""
    lay = layout_of(problem.hardware[hw], problem.stack)
    dense = enumerate_dense(problem.space, problem.model, lay)
    dt = dense_terms(lower(problem.model), problem.task, problem.stack, lay, dense)
    ok = np.flatnonzero(dt.invalid == 0)
    if len(ok) == 0:
        code = int(np.bincount(dt.invalid).argmax()) if len(dt.invalid) else 1
        return OptionResult(hw, None, None, None, DENSE_INVALID.get(code, "no dense plan"))
    loosest = float((lay.capacity_bytes - dt.memory_bytes)[ok].max())
    shardings = tuple(problem.space.shardings or ("table_wise", "column_wise", "table_row_wise", "row_wise",
                                                   "data_parallel"))
    opts = embedding_options(problem.model, problem.task, lay, shardings, tuple(problem.space.column_splits), loosest)
    return PreparedOption(hw, lay, dense, dt, ok, opts)


def search_option(problem: DLRMProblem, hw: int, *, time_limit_s: float = 30.0, workers: int = 1,
                  cpsat: CpSatOptions | None = None, prepared: PreparedOption | None = None,
                  prove: bool = True) -> OptionResult:
    """Best (dense plan, placement) on hardware option ``hw``: CP-SAT placement per distinct embedding memory
    budget (loosest first; a placement that fits a tighter budget is optimal there too), dense plans enumerated.
    ``prove=False``: no CP-SAT model (search/placement.solve_placement's build_model), status feasible unless the
    averaging bound proves every placement."""
    solver_opts = cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers)
    prep = prepared or prepare_option(problem, hw)
    if isinstance(prep, OptionResult):
        return prep
    lay, dense, dt, ok, opts = prep.lay, prep.dense, prep.terms, prep.valid, prep.opts
    budget = lay.capacity_bytes - dt.memory_bytes
    weights = phase_weights(problem.task)
    solved: dict[int, PlacementResult | None] = {}
    evaluated: dict[int, tuple[EmbeddingTimes, list[ShardEntryJSON]]] = {}  # per placement (id): its times, plan
    peak_mb: dict[int, int] = {}  # per placement (id)
    best: DLRMRecord | None = None
    first: PlacementResult | None = None
    for i in sorted(ok.tolist(), key=lambda k: -budget[k]):
        it = int_tables(opts, lay, weights, float(budget[i]))
        res = next((r for r in solved.values() if r is not None and peak_mb[id(r)] <= it.capacity_mb), None)
        if res is None and it.capacity_mb not in solved:
            res = solve_placement(it, cpsat=solver_opts, build_model=prove)
            solved[it.capacity_mb] = res
            if res is not None:  # its busiest GPU's embedding memory, MB (it.coef is the same for every budget)
                peak_mb[id(res)] = int(per_gpu_terms(it.coef, opts.options, res.shards, lay)[MEMORY].max())
        if res is None:
            continue
        first = first or res
        if id(res) not in evaluated:  # the same placement under several dense plans: evaluated once
            evaluated[id(res)] = (embedding_times(opts, res.shards, lay), compact_placement(res.shards, opts,
                                                                                           problem.model))
        times, placement = evaluated[id(res)]
        rec = _record(problem, hw, lay, opts, res.shards, dense, dt, i, times, placement)
        if _admissible(problem, rec) and (best is None or objective_value(problem, rec) < objective_value(problem,
                                                                                                            best)):
            best = rec
            best["placement_solver"] = _solver_info(res)
    baseline = paper_baseline(problem, hw, lay=lay, opts_full=None)
    reason = None if best is not None else "no placement of the tables fits in GPU memory"
    proven = all(r.status == "optimal" for r in solved.values() if r is not None)
    return OptionResult(hw, best, baseline, first, reason, "optimal" if proven else "feasible")


def _solver_info(res: PlacementResult) -> PlacementSolverJSON:
    return {
        "status": res.status,
        "proved_by": res.proved_by,  # cp-sat; bound: the averaging bound (search/placement_bound.py), no model; none
        "objective_s": res.objective / NS,
        "bound_s": res.bound / NS,
        "gap": res.gap,
        "wall_s": res.wall_s,
        "variables": res.variables,
        "greedy_objective_s": None if res.greedy_objective is None else res.greedy_objective / NS,
        "gain_vs_greedy": res.gain_vs_greedy,
    }


def paper_baseline(problem: DLRMProblem, hw: int, *, lay: Layout | None = None,
                   opts_full: EmbeddingOptions | None = None) -> DLRMRecord | None:
    """MAD-Max's baseline: embeddings table-wise over all GPUs (greedy), MLPs DDP or FSDP (the better one)."""
    lay = lay or layout_of(problem.hardware[hw], problem.stack)
    wl = lower(problem.model)
    dense = DensePlans.of([DensePlan(strategy="ddp"), DensePlan(strategy="fsdp")])
    dt = dense_terms(wl, problem.task, problem.stack, lay, dense)
    opts = opts_full or embedding_options(problem.model, problem.task, lay, ("table_wise",))
    best: DLRMRecord | None = None
    for i in range(len(dense)):
        it = int_tables(opts, lay, phase_weights(problem.task), lay.capacity_bytes - float(dt.memory_bytes[i]))
        shards = greedy_placement(it)
        if shards is None:
            continue
        rec = _record(problem, hw, lay, opts, shards, dense, dt, i, embedding_times(opts, shards, lay))
        if rec["feasible"] and (best is None or rec["step_time_s"] < best["step_time_s"]):
            best = rec
    return best


def solve_dlrm(problem: DLRMProblem, *, time_limit_s: float = 30.0, workers: int = 1,
               cpsat: CpSatOptions | None = None) -> tuple[DLRMRecord, list[OptionResult]]:
    """The best plan over every hardware option by the problem's objective (at fixed hardware every objective
    ranks plans by step time; across options the registry's value decides). InfeasibleError names the reason."""
    opts = cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers)
    results = _search_options(problem, opts)
    cands = [r.record for r in results if r.record is not None and _admissible(problem, r.record)]
    if not cands:
        reasons = "; ".join(f"{problem.hardware[r.hw].name}: {r.reason}" for r in results if r.reason)
        raise InfeasibleError(f"{problem.model.name}: no feasible plan ({reasons or 'constraints exclude all'})")
    best = min(cands, key=lambda rec: objective_value(problem, rec))
    return best, results


_PRUNED = ("placement not proven optimal (no need): every plan here takes at least {:.3f} ms per step, worse than "
           "the best (search/dlrm_bound.py)")


def _search_options(problem: DLRMProblem, cpsat: CpSatOptions) -> list[OptionResult]:
    """Every option's result, in option order. Options are searched by ascending step floor's objective
    (search/dlrm_bound.py); one whose floor is above the best admissible plan found so far cannot hold the optimum,
    so its placements get no CP-SAT proof: greedy (or the better start), optimal where the averaging bound proves
    it, else status ``pruned`` with its floor."""
    prepared = [prepare_option(problem, hw) for hw in range(len(problem.hardware))]
    steps = [float("inf") if isinstance(p, OptionResult) else p.floor_s(problem) for p in prepared]
    floors = [objective_of_step(problem, hw, step) for hw, step in enumerate(steps)]
    results: dict[int, OptionResult] = {}
    best = float("inf")
    for hw in sorted(range(len(prepared)), key=lambda h: (floors[h], h)):
        prep = prepared[hw]
        if isinstance(prep, OptionResult):
            results[hw] = prep
        elif floors[hw] > best:  # even its floor is worse than a plan in hand: no CP-SAT proof needed here
            res = results[hw] = search_option(problem, hw, cpsat=cpsat, prepared=prep, prove=False)
            if res.status != "optimal":
                res.status, res.floor_s, res.reason = "pruned", steps[hw], _PRUNED.format(steps[hw] * 1e3)
        else:
            res = results[hw] = search_option(problem, hw, cpsat=cpsat, prepared=prep)
            if res.record is not None and _admissible(problem, res.record):
                best = min(best, objective_value(problem, res.record))
    return [results[hw] for hw in range(len(prepared))]


def dlrm_status(results: list[OptionResult]) -> str:
    """optimal when every placement behind the answer was proven optimal (dense plans are enumerated; a pruned
    option's floor is above the answer), else feasible (see each option's placement gap)."""
    return "optimal" if all(r.status in ("optimal", "pruned") for r in results) else "feasible"


def evaluate_dlrm(problem: DLRMProblem, plans: list[DLRMPlan], source: str | None = None) -> list[DLRMRecord]:
    """Exact evaluation of given plans (placement entries, or ``greedy``)."""
    out = []
    for k, plan in enumerate(plans):
        hw = problem.hw_index(plan)
        lay = layout_of(problem.hardware[hw], problem.stack)
        dense = DensePlans.of([plan.dense])
        wl = lower(problem.model)
        dt = dense_terms(wl, problem.task, problem.stack, lay, dense)
        if plan.placement == "greedy":
            opts = embedding_options(problem.model, problem.task, lay, ("table_wise",))
            it = int_tables(opts, lay, phase_weights(problem.task), lay.capacity_bytes - float(dt.memory_bytes[0]))
            shards = greedy_placement(it)
            if shards is None:
                raise InfeasibleError(f"greedy table-wise placement of {problem.model.name} does not fit on "
                                      f"{problem.hardware[hw].name} (binding constraint: memory capacity)")
        else:
            splits = tuple(sorted({len(s.gpus) for s in plan.placement if s.sharding == "column_wise" and s.gpus}))
            opts = embedding_options(problem.model, problem.task, lay, splits=splits or (2,))
            prefix = f"[{k}].placement" if len(plans) > 1 else "placement"
            shards = shards_from_plan(plan.placement, problem.model, opts, lay, file=source, field=prefix)
        out.append(_record(problem, hw, lay, opts, shards, dense, dt, 0, embedding_times(opts, shards, lay)))
    return out


__all__ = [
    "IntTables",
    "PlacementModel",
    "PlacementResult",
    "dlrm_status",
    "evaluate_dlrm",
    "greedy_placement",
    "int_objective",
    "int_tables",
    "objective_value",
    "paper_baseline",
    "solve_dlrm",
    "solve_placement",
]


def dlrm_solve_result(
    problem: DLRMProblem, time_limit_s: float, workers: int, cpsat: CpSatOptions | None = None
) -> DLRMSolveResult:
    """The JSON object of ``solve --json`` for a DLRM problem: best plan, per-option results, baseline."""
    best, results = solve_dlrm(problem, time_limit_s=time_limit_s, workers=workers, cpsat=cpsat)
    baseline: DLRMRecord | None
    if problem.baseline is not None:
        baseline = evaluate_dlrm(problem, [problem.baseline], problem.source)[0]
    else:
        hw = next(r.hw for r in results if r.record is best)
        baseline = next(r.baseline for r in results if r.hw == hw)
    speedup = baseline["step_time_s"] / best["step_time_s"] if baseline and baseline["feasible"] else None
    return {
        "status": dlrm_status(results),
        "model": problem.model.name,
        "objective": problem.objective,
        "best": best,
        "options": [
            DLRMOptionJSON(hardware=problem.hardware[r.hw].name,
                           feasible=r.record is not None, reason=r.reason,
                           step_time_s=r.record["step_time_s"] if r.record else None,
                           samples_per_s=r.record["samples_per_s"] if r.record else None,
                           status=r.status if r.record is not None or r.status == "pruned" else "infeasible",
                           step_time_floor_s=r.floor_s)
            for r in results
        ],
        "baseline": baseline,
        "speedup_vs_baseline": speedup,
    }
