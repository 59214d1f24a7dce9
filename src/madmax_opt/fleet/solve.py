"""The fleet answer: option tables -> integer allocation input -> CP-SAT optimum, greedy baseline, binding
constraints and the what-if (extra GPUs per system, re-solved)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from madmax_opt.core.errors import InfeasibleError, TimeLimitError
from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.fleet.allocate import (
    Allocation,
    AllocationInput,
    Option,
    RelaxationModel,
    greedy,
    solve_allocation,
)
from madmax_opt.fleet.options import JobOption, OptionTable
from madmax_opt.fleet.spec import Fleet, Job
from madmax_opt.model.objectives import FLEET_OBJECTIVES
from madmax_opt.search.cpsat import CpSatOptions

WEIGHT_SCALE = 1000  # weights are scored in thousandths (FLEET_OBJECTIVES[...].score_unit)
WHAT_IF_TIME_LIMIT_S = 10.0
MAX_TARGET_CHECKS = 60  # jobs whose targets are each relaxed once to see whether they bind


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Scored:
    """A job option with what depends on the job and the fleet: duration, cost, energy, targets."""

    job: int
    option: JobOption
    hours: float | None  # how long it holds its GPUs
    finish_h: float | None  # training with a budget: hours to finish it
    cost_usd: float | None
    energy_kwh: float | None
    misses: str | None  # the target it misses, if any


def scored_options(fleet: Fleet, tables: list[OptionTable]) -> list[Scored]:
    out: list[Scored] = []
    for j, (job, table) in enumerate(zip(fleet.jobs, tables, strict=True)):
        out.extend(_score(j, job, o, fleet.spec.horizon_h) for o in table.options)
    return out


def _score(j: int, job: Job, o: JobOption, horizon_h: float | None) -> Scored:
    finish_h = None
    if job.train_tokens is not None:
        finish_h = job.train_tokens / o.throughput / SECONDS_PER_HOUR  # hours = tokens / (tokens/s) / 3600
    elif job.train_samples is not None and o.samples_per_s:
        finish_h = job.train_samples / o.samples_per_s / SECONDS_PER_HOUR
    hours = finish_h if finish_h is not None else job.hours(horizon_h)
    cost = o.cost_per_hour_usd * hours if hours is not None else None
    energy = o.power_w * hours / 1e3 if hours is not None else None  # kWh = W x h / 1000
    misses = []
    if job.spec.deadline_h is not None and finish_h is not None and finish_h > job.spec.deadline_h:
        misses.append(f"deadline_h {job.spec.deadline_h:g} (finishes in {finish_h:,.1f} h)")
    if job.min_throughput is not None and o.throughput < job.min_throughput:
        rate = job.spec.arrival_rate_rps
        need = f"arrival_rate_rps {rate:g} = " if rate is not None else "min_throughput "
        misses.append(f"{need}{job.min_throughput:,.0f} tokens/s (reaches {o.throughput:,.0f})")
    return Scored(j, o, hours, finish_h, cost, energy, "; ".join(misses) or None)


def credited(job: Job, o: JobOption) -> float:
    """Throughput the objective counts: a serving job with an arrival rate serves at most what arrives."""
    if job.serving and job.spec.arrival_rate_rps is not None and job.min_throughput is not None:
        return min(o.throughput, job.min_throughput)
    return o.throughput


def score(objective: str, job: Job, s: Scored) -> int:
    """The integer objective contribution of one option (units: FLEET_OBJECTIVES[objective].score_unit)."""
    w = round(job.spec.weight * WEIGHT_SCALE)
    if objective == "throughput":
        return w * math.floor(credited(job, s.option))
    if objective == "deadlines":
        return w
    if objective == "cost":
        return round((s.cost_usd or 0.0) * 100)
    return round((s.energy_kwh or 0.0) * 1e3)


@dataclass(frozen=True)
class Instance:
    """The integer allocation input and, per option, the scored option it stands for."""

    inp: AllocationInput
    scored: list[Scored]
    relaxed: frozenset[int] = field(default_factory=frozenset)  # jobs whose targets are ignored

    @cached_property
    def offered(self) -> frozenset[int]:
        """The jobs with at least one option."""
        return frozenset(s.job for s in self.scored)


def instance(fleet: Fleet, scored: list[Scored], relaxed: frozenset[int] = frozenset()) -> Instance:
    spec = fleet.spec
    keep = [s for s in scored if s.misses is None or s.job in relaxed]
    pools = {p.name: i for i, p in enumerate(fleet.pools)}
    options = tuple(
        Option(
            job=s.job,
            system=pools[s.option.system],
            nodes=s.option.nodes,
            gpus=s.option.gpus,
            score=score(spec.objective, fleet.jobs[s.job], s),
            speed=s.option.throughput,
            cents_per_hour=round(s.option.cost_per_hour_usd * 100),
            cents=round((s.cost_usd or 0.0) * 100),
        )
        for s in keep
    )
    goal = FLEET_OBJECTIVES[spec.objective]
    must = goal.places_every_job
    order = sorted(range(len(fleet.jobs)), key=lambda j: _priority(fleet.jobs[j], j))
    inp = AllocationInput(
        jobs=len(fleet.jobs),
        capacity_nodes=tuple(p.nodes for p in fleet.pools),
        options=options,
        sense=goal.sense,
        required=tuple(must or job.spec.required for job in fleet.jobs),
        priority=tuple(order),
        max_cents_per_hour=round(spec.budget.usd_per_hour * 100) if spec.budget.usd_per_hour else None,
        max_cents=round(spec.budget.usd * 100) if spec.budget.usd else None,
    )
    return Instance(inp, keep, relaxed)


def _priority(job: Job, index: int) -> tuple[float, float, int]:
    """Greedy order: explicit priority first (lowest first), then heaviest weight, then file order."""
    return (job.spec.priority if job.spec.priority is not None else math.inf, -job.spec.weight, index)


# ------------------------------------------------------------------------------------------------- records


class JobResult(Record):
    job: str
    model: str
    task: str
    weight: float
    placed: bool
    system: str | None = None
    gpu: str | None = None
    gpus: int = 0
    nodes: int = 0
    plan: dict[str, Any] | None = None
    throughput: float | None = None  # tokens/s (serving: output tokens/s)
    step_time_s: float | None = None
    mfu: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    finish_h: float | None = None
    hours: float | None = None
    deadline_h: float | None = None
    meets_targets: bool | None = None
    cost_per_hour_usd: float = 0.0
    power_w: float = 0.0
    cost_usd: float | None = None
    energy_kwh: float | None = None
    usd_per_million_tokens: float | None = None
    memory_bytes_per_gpu: float | None = None
    note: str | None = None


class PoolUse(Record):
    system: str
    catalog_system: str
    gpu: str
    gpus: int
    used_gpus: int
    nodes: int
    used_nodes: int
    utilisation: float


class Binding(Record):
    constraint: str
    detail: str
    gain: float  # objective improvement (in the objective's unit, positive = better) when it is relaxed


class WhatIf(Record):
    extra_gpus: int
    system: str
    value: float | None
    gain: float | None
    status: str


class SolverInfo(Record):
    status: str
    objective: int | None
    best_bound: float | None
    gap: float | None
    wall_s: float
    booleans: int
    options: int
    tie_break: str  # fewest GPUs among equal objectives: optimal, or feasible (deterministic budget ran out)
    option_search_wall_s: float


class GreedyBaseline(Record):
    """The greedy baseline: each job in priority order takes its fastest option that still fits."""

    value: float | None
    jobs: list[JobResult]
    status: str


class FleetResult(Record):
    objective: str
    unit: str
    score_unit: str
    value: float | None
    solver: SolverInfo
    jobs: list[JobResult]
    pools: list[PoolUse]
    binding: list[Binding]
    what_if: list[WhatIf]
    greedy: GreedyBaseline
    gain_vs_greedy: float | None  # optimum minus greedy, positive = better (cost, energy: the saving)
    relative_gain_vs_greedy: float | None
    options: list[OptionTable]  # every job's best plan per (system, GPU count): what CP-SAT chose among


def value_of(fleet: Fleet, inst: Instance, alloc: Allocation) -> float | None:
    """The objective in human units (weighted tokens/s, weight, US$, kWh), from the floats (not the integers)."""
    if alloc.objective is None:
        return None
    chosen = [inst.scored[k] for k in alloc.choice if k is not None]
    kind = fleet.spec.objective
    if kind == "throughput":
        return sum(fleet.jobs[s.job].spec.weight * credited(fleet.jobs[s.job], s.option) for s in chosen)
    if kind == "deadlines":
        return sum(fleet.jobs[s.job].spec.weight for s in chosen)
    if kind == "cost":
        return sum(s.cost_usd or 0.0 for s in chosen)
    return sum(s.energy_kwh or 0.0 for s in chosen)


def job_results(fleet: Fleet, inst: Instance, alloc: Allocation, tables: list[OptionTable], greedy: bool = False
                ) -> list[JobResult]:
    out = []
    for j, job in enumerate(fleet.jobs):
        base: dict[str, Any] = {"job": job.name, "model": job.model_name, "task": job.task_kind,
                                "weight": job.spec.weight, "deadline_h": job.spec.deadline_h}
        k = alloc.choice[j] if alloc.choice else None
        if k is None:
            out.append(JobResult(**base, placed=False, note=_why_unplaced(fleet, inst, j, tables[j], greedy)))
            continue
        s = inst.scored[k]
        o = s.option
        out.append(JobResult(
            **base, placed=True, system=o.system, gpu=o.gpu, gpus=o.gpus, nodes=o.nodes, plan=o.plan,
            throughput=o.throughput, step_time_s=o.step_time_s, mfu=o.mfu, ttft_s=o.ttft_s, tpot_s=o.tpot_s,
            finish_h=s.finish_h, hours=s.hours, meets_targets=s.misses is None,
            cost_per_hour_usd=o.cost_per_hour_usd, power_w=o.power_w, cost_usd=s.cost_usd, energy_kwh=s.energy_kwh,
            usd_per_million_tokens=o.usd_per_million_tokens, memory_bytes_per_gpu=o.memory_bytes_per_gpu,
            note=s.misses,
        ))
    return out


def _why_unplaced(fleet: Fleet, inst: Instance, j: int, table: OptionTable, greedy: bool = False) -> str:
    if not table.options:
        first = next(iter(table.infeasible.values()), "no system and size offered")
        return f"no feasible plan on any fleet system ({first})"
    if j not in inst.offered:
        missed = [s for s in scored_options_of(fleet, table, j) if s.misses]
        fastest = max(missed, key=lambda s: s.option.throughput)
        return f"no option meets its targets; the fastest misses {fastest.misses}"
    if greedy:
        return "no option fits what the jobs before it (in priority order) left"
    return "not chosen: its GPUs score more on other jobs (supply or budget binds)"


def scored_options_of(fleet: Fleet, table: OptionTable, j: int) -> list[Scored]:
    return [_score(j, fleet.jobs[j], o, fleet.spec.horizon_h) for o in table.options]


def pool_use(fleet: Fleet, inst: Instance, alloc: Allocation) -> list[PoolUse]:
    out = []
    for i, p in enumerate(fleet.pools):
        chosen = [inst.inp.options[k] for k in alloc.choice if k is not None and inst.inp.options[k].system == i]
        used = sum(o.gpus for o in chosen)
        out.append(PoolUse(system=p.name, catalog_system=p.system.name, gpu=p.gpu.name, gpus=p.gpus,
                           used_gpus=used, nodes=p.nodes, used_nodes=sum(o.nodes for o in chosen),
                           utilisation=used / p.gpus))
    return out


# --------------------------------------------------------------------------------------------------- solve


@dataclass
class FleetRun:
    fleet: Fleet
    tables: list[OptionTable]
    params: CpSatOptions
    option_wall_s: float = 0.0
    scored: list[Scored] = field(init=False)
    relaxed_solves: dict[tuple[Any, ...], Allocation] = field(init=False, default_factory=dict)
    # the model of every option, its instance, and id(scored option) -> its index there (built on first use)
    relaxation: tuple[RelaxationModel, Instance, dict[int, int]] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.scored = scored_options(self.fleet, self.tables)

    def better(self, a: float | None, b: float | None) -> float | None:
        """How much better value a is than b (positive = better) for the objective's sense."""
        if a is None or b is None:
            return None
        return b - a if FLEET_OBJECTIVES[self.fleet.spec.objective].sense == "min" else a - b


def solve_fleet(run: FleetRun, what_if: bool = True, binding: bool = True) -> FleetResult:
    fleet = run.fleet
    inst = instance(fleet, run.scored)
    alloc = solve_allocation(inst.inp, run.params)
    if alloc.status == "unknown":
        raise TimeLimitError(f"no allocation found within {run.params.time_limit_s:g} s; allowed: a longer "
                             "--time-limit (or solver.time_limit_s)")
    if alloc.objective is None:
        raise InfeasibleError(explain_infeasible(run, inst, alloc))
    value = value_of(fleet, inst, alloc)
    base = greedy(inst.inp)
    greedy_value = value_of(fleet, inst, base)
    gain = run.better(value, greedy_value)
    rel = gain / abs(greedy_value) if gain is not None and greedy_value else None
    kind = fleet.spec.objective
    return FleetResult(
        objective=kind,
        unit=FLEET_OBJECTIVES[kind].unit,
        score_unit=FLEET_OBJECTIVES[kind].score_unit,
        value=value,
        solver=SolverInfo(status=alloc.status, objective=alloc.objective, best_bound=alloc.best_bound, gap=alloc.gap,
                          wall_s=alloc.wall_s, booleans=alloc.booleans, options=len(inst.inp.options), tie_break=alloc.tie_break,
                          option_search_wall_s=run.option_wall_s),
        jobs=job_results(fleet, inst, alloc, run.tables),
        pools=pool_use(fleet, inst, alloc),
        binding=binding_constraints(run, inst, value, alloc) if binding else [],
        what_if=what_ifs(run, inst, value, alloc) if what_if else [],
        greedy=GreedyBaseline(value=greedy_value, jobs=job_results(fleet, inst, base, run.tables, greedy=True),
                    status=base.status),
        gain_vs_greedy=gain,
        relative_gain_vs_greedy=rel,
        options=run.tables,
    )


def _quick(run: FleetRun) -> CpSatOptions:
    return run.params.with_time_limit(min(run.params.time_limit_s, WHAT_IF_TIME_LIMIT_S))


def _resolve(run: FleetRun, relaxed: Instance, base: Instance, alloc: Allocation) -> tuple[Allocation, Instance]:
    """A relaxation of ``base`` (more supply, a budget or a job's targets dropped) re-solved for its objective, on
    one model of every option (``RelaxationModel``: bounds changed in place): the base optimum stays feasible, so
    it is the start (hint and bound) and the solve only looks for better; no tie-break phase. Returns the
    allocation and the instance its option indices refer to (every option). Each relaxation is solved once."""
    if run.relaxation is None:
        full = instance(run.fleet, run.scored, frozenset(range(len(run.fleet.jobs))))  # every option
        run.relaxation = (RelaxationModel(full.inp), full, {id(s): k for k, s in enumerate(full.scored)})
    model, full, index = run.relaxation
    memo = (relaxed.inp.capacity_nodes, relaxed.inp.max_cents_per_hour, relaxed.inp.max_cents, relaxed.relaxed)
    if memo not in run.relaxed_solves:
        start = [index[id(base.scored[k])] if k is not None else None for k in alloc.choice]
        own = (base.inp.capacity_nodes, base.inp.max_cents_per_hour, base.inp.max_cents, base.relaxed)
        if any(_within(memo, known) and again.status == "optimal" and again.objective == alloc.objective
               for known, again in [*run.relaxed_solves.items(), (own, alloc)]):
            # the base itself, or a looser relaxation proved no better than it: this one (between the two) is no
            # better either, so the base allocation is its optimum
            run.relaxed_solves[memo] = Allocation("optimal", tuple(start), alloc.objective,
                                                  float(alloc.objective or 0), tie_break="skipped")
        else:
            kept = {id(s) for s in relaxed.scored}
            run.relaxed_solves[memo] = model.solve(relaxed.inp.capacity_nodes, relaxed.inp.max_cents_per_hour,
                                                   relaxed.inp.max_cents, [id(s) in kept for s in full.scored],
                                                   start, _quick(run))
    return run.relaxed_solves[memo], full


def _within(tight: tuple[Any, ...], loose: tuple[Any, ...]) -> bool:
    """Whether relaxation ``tight`` (supplies, $/hour and $ budgets, jobs whose targets are dropped) allows no more
    than ``loose``: every supply and budget at most its own (None: no budget), targets dropped for fewer jobs."""
    caps, hourly, total, jobs = tight
    more_caps, more_hourly, more_total, more_jobs = loose
    return (all(c <= m for c, m in zip(caps, more_caps, strict=True))
            and (more_hourly is None or (hourly is not None and hourly <= more_hourly))
            and (more_total is None or (total is not None and total <= more_total)) and jobs <= more_jobs)


def _resolve_value(run: FleetRun, relaxed: Instance, base: Instance, alloc: Allocation) -> tuple[float | None, str]:
    again, full = _resolve(run, relaxed, base, alloc)
    return value_of(run.fleet, full, again), again.status


def what_ifs(run: FleetRun, inst: Instance, value: float | None, alloc: Allocation) -> list[WhatIf]:
    """For each extra GPU count and system: the re-solved objective with that many more GPUs (whole nodes)."""
    out = []
    for extra in run.fleet.spec.solver.what_if_gpus:
        for i, p in enumerate(run.fleet.pools):
            room = sum(o.nodes for o in inst.inp.options if o.system == i)  # beyond it, more nodes change nothing
            more = replace(inst, inp=inst.inp.with_capacity(i, min((p.gpus + extra) // p.gpus_per_node,
                                                                   max(room, p.nodes))))
            v, status = _resolve_value(run, more, inst, alloc)
            out.append(WhatIf(extra_gpus=extra, system=p.name, value=v, gain=run.better(v, value), status=status))
    return out


def binding_constraints(run: FleetRun, inst: Instance, value: float | None, alloc: Allocation) -> list[Binding]:
    """Each constraint relaxed alone and the allocation re-solved: it binds if the objective improves."""
    fleet = run.fleet
    out = []
    for i, p in enumerate(fleet.pools):
        room = sum(o.nodes for o in inst.inp.options if o.system == i)  # every option on it at once
        if room <= p.nodes:
            continue
        v, _ = _resolve_value(run, replace(inst, inp=inst.inp.with_capacity(i, room)), inst, alloc)
        gain = run.better(v, value)
        if gain is not None and gain > 1e-9:
            out.append(Binding(constraint=f"systems.{p.name}.gpus", gain=gain,
                               detail=f"supply {p.gpus} GPUs ({p.nodes} nodes of {p.gpus_per_node})"))
    for key in ("usd_per_hour", "usd"):
        if getattr(fleet.spec.budget, key) is None:
            continue
        free = (replace(inst.inp, max_cents_per_hour=None) if key == "usd_per_hour"
                else replace(inst.inp, max_cents=None))
        v, _ = _resolve_value(run, replace(inst, inp=free), inst, alloc)
        gain = run.better(v, value)
        if gain is not None and gain > 1e-9:
            out.append(Binding(constraint=f"budget.{key}", gain=gain,
                               detail=f"{getattr(fleet.spec.budget, key):,.0f} US$" + ("/h" if key == "usd_per_hour" else "")))
    targeted = sorted({s.job for s in run.scored if s.misses})[:MAX_TARGET_CHECKS]
    _settle_targets(run, inst, alloc, targeted)
    for j in targeted:
        again, full = _resolve(run, _targets_dropped(run, inst, frozenset({j})), inst, alloc)
        v = value_of(fleet, full, again)
        gain = run.better(v, value)
        k = again.choice[j] if again.objective is not None else None
        if gain is not None and gain > 1e-9 and k is not None:
            job, s = fleet.jobs[j], full.scored[k]
            what = [key for key in ("deadline_h", "min_throughput", "arrival_rate_rps") if getattr(job.spec, key)]
            detail = f"relaxed, it would take {s.option.gpus} x {s.option.system}" + (
                f", missing {s.misses}" if s.misses else "")
            out.append(Binding(constraint=f"jobs.{job.name}.{'/'.join(what) or 'targets'}", gain=gain,
                               detail=detail))
    return sorted(out, key=lambda b: (-b.gain, b.constraint))


def _targets_dropped(run: FleetRun, inst: Instance, jobs: frozenset[int]) -> Instance:
    """``inst`` with the targets of ``jobs`` dropped: what ``_resolve`` reads of instance(fleet, run.scored, jobs),
    the base supply and budgets with those jobs' options that miss a target allowed."""
    return replace(inst, scored=[s for s in run.scored if s.misses is None or s.job in jobs], relaxed=jobs)


def _settle_targets(run: FleetRun, inst: Instance, alloc: Allocation, jobs: list[int]) -> None:
    """Group tests for the target checks: the targets of ``jobs`` relaxed together and re-solved; proven no better
    than the base, every job of the group relaxed alone lies between the two and is no better either (``_resolve``
    then takes the base allocation without a solve); else each half is tested the same way. Each job still gets
    its own check afterwards: one that gains is always re-solved alone."""
    if len(jobs) < 2:
        return
    again, _ = _resolve(run, _targets_dropped(run, inst, frozenset(jobs)), inst, alloc)
    if again.status == "optimal" and again.objective == alloc.objective:
        return
    half = len(jobs) // 2
    _settle_targets(run, inst, alloc, jobs[:half])
    _settle_targets(run, inst, alloc, jobs[half:])


def explain_infeasible(run: FleetRun, inst: Instance, alloc: Allocation) -> str:
    """Name what binds when the required jobs cannot all be placed."""
    fleet = run.fleet
    for j, job in enumerate(fleet.jobs):
        if inst.inp.required[j] and j not in inst.offered:
            return f"job {job.name} cannot be placed: {_why_unplaced(fleet, inst, j, run.tables[j])} " \
                   f"(binding constraint: jobs.{job.name} targets)"
    unlimited = inst.inp
    for i in range(len(fleet.pools)):
        unlimited = unlimited.with_capacity(i, sum(o.nodes for o in inst.inp.options))
    if solve_allocation(unlimited, _quick(run)).objective is not None:
        need = ", ".join(f"{p.name} {p.gpus}" for p in fleet.pools)
        return f"the required jobs do not fit the fleet together (binding constraint: GPU supply: {need})"
    return "the required jobs do not fit the budget (binding constraint: budget)"

