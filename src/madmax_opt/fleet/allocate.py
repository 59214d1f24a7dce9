"""The allocation itself: each job gets one option (system, GPU count, plan) or none, by CP-SAT.

Pure integers, no cost model: an option is (job, system, nodes, GPUs, score, cents/hour, cents, Wh). Constraints:
at most one option per job (exactly one if required), whole nodes per system within its supply, the $/hour and $
budgets. Objective: maximise or minimise the sum of the chosen scores; ties broken by fewest GPUs (a second
CP-SAT phase with the first objective fixed), then by the solver's fixed seed on one worker (deterministic).
``brute_force`` (every assignment) and ``greedy`` (each job in priority order takes its fastest option that
fits) use the same integers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from madmax_opt.search import cpsat
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.ortools_import import load_cp_model

if TYPE_CHECKING:  # imported where a CP-SAT model is built (0.4 s: it pulls in pandas)
    from ortools.sat.python import cp_model

Sense = Literal["max", "min"]


@dataclass(frozen=True)
class Option:
    job: int
    system: int
    nodes: int
    gpus: int
    score: int  # objective contribution in integer units (see ``model.objectives.FLEET_OBJECTIVES``)
    speed: float  # throughput, for the greedy order (fastest first)
    cents_per_hour: int = 0
    cents: int = 0


@dataclass(frozen=True)
class AllocationInput:
    jobs: int
    capacity_nodes: tuple[int, ...]  # per system
    options: tuple[Option, ...]
    sense: Sense
    required: tuple[bool, ...]  # per job
    priority: tuple[int, ...]  # job indices, greedy order
    max_cents_per_hour: int | None = None
    max_cents: int | None = None

    def with_capacity(self, system: int, nodes: int) -> AllocationInput:
        caps = list(self.capacity_nodes)
        caps[system] = nodes
        return replace(self, capacity_nodes=tuple(caps))


@dataclass(frozen=True)
class Allocation:
    status: str  # optimal | feasible | infeasible
    choice: tuple[int | None, ...]  # option index per job
    objective: int | None
    best_bound: float | None
    wall_s: float = 0.0
    booleans: int = 0
    tie_break: str = "optimal"  # the fewest-GPUs phase: optimal, or feasible (its deterministic budget ran out)

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.best_bound is None:
            return None
        return abs(self.objective - self.best_bound) / max(abs(self.objective), 1)


TIE_BREAK_SHARE = 0.2  # share of the wall-clock limit kept for the second (fewest-GPUs) phase
# The tie-break phase stops at a deterministic-time budget (CP-SAT's machine-independent work measure, roughly
# seconds), so with one worker its answer does not depend on the machine's speed; unproven, it keeps its best.
TIE_BREAK_DETERMINISTIC_TIME = 3.0


def objective_of(inp: AllocationInput, choice: Sequence[int | None]) -> int:
    return sum(inp.options[k].score for k in choice if k is not None)


def gpus_of(inp: AllocationInput, choice: Sequence[int | None]) -> int:
    return sum(inp.options[k].gpus for k in choice if k is not None)


def feasible(inp: AllocationInput, choice: Sequence[int | None]) -> bool:
    """Whether an assignment meets every constraint (what brute force and the tests check)."""
    used = [0] * len(inp.capacity_nodes)
    for j, k in enumerate(choice):
        if k is None:
            if inp.required[j]:
                return False
            continue
        o = inp.options[k]
        if o.job != j:
            return False
        used[o.system] += o.nodes
    if any(u > c for u, c in zip(used, inp.capacity_nodes, strict=True)):
        return False
    chosen = [inp.options[k] for k in choice if k is not None]
    if inp.max_cents_per_hour is not None and sum(o.cents_per_hour for o in chosen) > inp.max_cents_per_hour:
        return False
    return inp.max_cents is None or sum(o.cents for o in chosen) <= inp.max_cents


def solve_allocation(inp: AllocationInput, opts: CpSatOptions | None = None) -> Allocation:
    """The optimal assignment (or the best found with its bound), ties broken by fewest GPUs.

    CP-SAT is configured by ``search.cpsat`` (deterministic by default: one worker, a fixed seed)."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    opts = opts or CpSatOptions()
    t0 = time.perf_counter()
    if not inp.options:  # nothing to choose: placing no job is the only assignment
        ok = not any(inp.required)
        return Allocation("optimal" if ok else "infeasible", (None,) * inp.jobs, 0 if ok else None,
                          0.0 if ok else None, time.perf_counter() - t0)
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{k}") for k in range(len(inp.options))]
    by_job: list[list[int]] = [[] for _ in range(inp.jobs)]
    by_system: list[list[int]] = [[] for _ in inp.capacity_nodes]
    for k, o in enumerate(inp.options):
        by_job[o.job].append(k)
        by_system[o.system].append(k)
    for j, ks in enumerate(by_job):
        if inp.required[j]:
            if not ks:
                return Allocation("infeasible", (None,) * inp.jobs, None, None, time.perf_counter() - t0, len(x))
            m.add_exactly_one(x[k] for k in ks)
        elif ks:
            m.add_at_most_one(x[k] for k in ks)
    for s, ks in enumerate(by_system):
        if ks:
            m.add(sum(inp.options[k].nodes * x[k] for k in ks) <= inp.capacity_nodes[s])
    if inp.max_cents_per_hour is not None:
        m.add(sum(o.cents_per_hour * x[k] for k, o in enumerate(inp.options)) <= inp.max_cents_per_hour)
    if inp.max_cents is not None:
        m.add(sum(o.cents * x[k] for k, o in enumerate(inp.options)) <= inp.max_cents)
    primary = sum(o.score * x[k] for k, o in enumerate(inp.options))
    if inp.sense == "max":
        m.maximize(primary)
    else:
        m.minimize(primary)
    hint = greedy(inp)
    if hint.objective is not None:  # a feasible start: the greedy assignment
        _hint(m, x, hint.choice)

    st, solver = cpsat.run(m, opts.with_time_limit(opts.time_limit_s * (1.0 - TIE_BREAK_SHARE)), "fleet allocation")
    if not cpsat.has_solution(st):
        status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
        return Allocation(status, (None,) * inp.jobs, None, None, time.perf_counter() - t0, len(x))
    value = round(solver.objective_value)
    bound = float(solver.best_objective_bound)
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    choice = _read(solver, x, inp.options, inp.jobs)

    # phase 2, ties: an objective at least as good (the same, when proven optimal) with the fewest GPUs
    m.clear_hints()
    _hint(m, x, choice)
    m.add(primary >= value if inp.sense == "max" else primary <= value)  # at the optimum: the same value
    m.minimize(sum(o.gpus * x[k] for k, o in enumerate(inp.options)))
    left_s = opts.time_limit_s - (time.perf_counter() - t0)
    st2, solver = cpsat.run(m, opts.with_time_limit(left_s), "fleet allocation (ties: fewest GPUs)",
                            max_deterministic_time=TIE_BREAK_DETERMINISTIC_TIME)
    tie = "optimal" if st2 == cp_model.OPTIMAL else "feasible"
    if cpsat.has_solution(st2):
        choice = _read(solver, x, inp.options, inp.jobs)
        value = objective_of(inp, choice)
    return Allocation(status, choice, value, bound, time.perf_counter() - t0, len(x), tie)


class RelaxationModel:
    """One CP-SAT model of ``inp`` (every option) for many relaxed re-solves: supplies, budgets and which options
    are allowed are bounds changed in place (constraint domains, variable upper bounds), not new models; each solve
    starts from a feasible assignment no better than its optimum (hint and objective bound) and reads the
    objective alone (no tie-break phase). What-if and binding-constraint analyses."""

    def __init__(self, inp: AllocationInput) -> None:
        load_cp_model()  # without pandas (search/ortools_import.py)
        from ortools.sat.python import cp_model

        self.inp = inp
        m = self.model = cp_model.CpModel()
        self.x = [m.new_bool_var(f"x{k}") for k in range(len(inp.options))]
        self.allowed = [True] * len(self.x)
        by_job: list[list[int]] = [[] for _ in range(inp.jobs)]
        for k, o in enumerate(inp.options):
            by_job[o.job].append(k)
        self.by_job = by_job
        for j, ks in enumerate(by_job):
            if ks:  # a required job with no allowed option makes a relaxation infeasible (never the base's)
                (m.add_exactly_one if inp.required[j] else m.add_at_most_one)(self.x[k] for k in ks)
        big = INT_BOUND

        def at_most(coeffs: list[int]) -> int:  # sum coeffs x <= (a bound set per solve): the constraint's index
            return int(m.add(cp_model.LinearExpr.weighted_sum(self.x, coeffs) <= big).index)

        self.capacity = [at_most([o.nodes if o.system == s else 0 for o in inp.options])
                         for s in range(len(inp.capacity_nodes))]
        self.hourly = at_most([o.cents_per_hour for o in inp.options])
        self.total = at_most([o.cents for o in inp.options])
        self.primary = cp_model.LinearExpr.weighted_sum(self.x, [o.score for o in inp.options])
        self.floor = int(m.add(self.primary >= -big).index if inp.sense == "max" else m.add(self.primary <= big).index)
        (m.maximize if inp.sense == "max" else m.minimize)(self.primary)

    def solve(self, capacity_nodes: Sequence[int], max_cents_per_hour: int | None, max_cents: int | None,
              allowed: Sequence[bool], start: Sequence[int | None], opts: CpSatOptions) -> Allocation:
        """The optimum under these bounds; ``start`` (option indices per job, allowed and within them) is kept
        feasible, so the answer is at least as good."""
        load_cp_model()  # without pandas (search/ortools_import.py)
        from ortools.sat.python import cp_model

        t0 = time.perf_counter()
        inp = replace(self.inp, capacity_nodes=tuple(capacity_nodes), max_cents_per_hour=max_cents_per_hour,
                      max_cents=max_cents)
        allowed = self.without_redundant(inp, allowed, start)
        proto = self.model.proto
        for ct, cap in zip(self.capacity, capacity_nodes, strict=True):
            proto.constraints[ct].linear.domain[1] = int(cap)
        proto.constraints[self.hourly].linear.domain[1] = INT_BOUND if max_cents_per_hour is None \
            else max_cents_per_hour
        proto.constraints[self.total].linear.domain[1] = INT_BOUND if max_cents is None else max_cents
        for k in [k for k, (ok, was) in enumerate(zip(allowed, self.allowed, strict=True)) if ok != was]:
            proto.variables[k].domain[1] = int(allowed[k])  # only the bounds that change
        self.allowed = list(allowed)
        assert feasible(inp, start) and all(allowed[k] for k in start if k is not None), "an infeasible start"
        known = objective_of(inp, start)
        if inp.sense == "max":
            proto.constraints[self.floor].linear.domain[0] = known
        else:
            proto.constraints[self.floor].linear.domain[1] = known
        self.model.clear_hints()
        _hint(self.model, self.x, start)
        # no presolve: measured 2x faster on these re-solves (50 jobs x 40 options, 45 relaxations: 6.4 -> 3.5 s),
        # the same optima
        st, solver = cpsat.run(self.model, opts, "fleet allocation (relaxed)", cp_model_presolve=False)
        if not cpsat.has_solution(st):
            status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
            return Allocation(status, (None,) * inp.jobs, None, None, time.perf_counter() - t0, len(self.x))
        choice = _read(solver, self.x, inp.options, inp.jobs)
        return Allocation("optimal" if st == cp_model.OPTIMAL else "feasible", choice, objective_of(inp, choice),
                          float(solver.best_objective_bound), time.perf_counter() - t0, len(self.x), "skipped")


    def without_redundant(self, inp: AllocationInput, allowed: Sequence[bool], start: Sequence[int | None]
                          ) -> list[bool]:
        """``allowed`` less the options no optimum needs when a system's supply is unlimited (every allowed option
        on it fits at once, as in the binding-supply check): an option of a job on such a system with a score at
        least as good and a price no higher (for each budget that is set) than another option of the same job makes
        that one redundant, as any assignment using the other swaps to it without using more of any supply or
        budget and without a worse objective. The optimum's objective is unchanged; ``start`` stays allowed."""
        used = [0] * len(inp.capacity_nodes)
        for k, o in enumerate(inp.options):
            if allowed[k]:
                used[o.system] += o.nodes
        unlimited = {s for s, (u, cap) in enumerate(zip(used, inp.capacity_nodes, strict=True)) if u <= cap}
        out = list(allowed)
        if not unlimited:
            return out
        sign = 1 if inp.sense == "max" else -1
        hourly, total = inp.max_cents_per_hour is not None, inp.max_cents is not None
        keep = set(start)

        def covers(a: Option, b: Option) -> bool:  # a at least as good as b, no dearer
            return (sign * a.score >= sign * b.score and (not hourly or a.cents_per_hour <= b.cents_per_hour)
                    and (not total or a.cents <= b.cents))

        for ks in self.by_job:
            free = sorted((k for k in ks if allowed[k] and inp.options[k].system in unlimited),
                          key=lambda k: (-sign * inp.options[k].score, inp.options[k].cents_per_hour,
                                         inp.options[k].cents, k))
            best: list[Option] = []  # the job's options on unlimited systems that no other one covers
            for k in free:
                if not any(covers(a, inp.options[k]) for a in best):
                    best.append(inp.options[k])
            if not best:
                continue
            chosen = {id(a) for a in best}
            for k in ks:
                o = inp.options[k]
                if allowed[k] and k not in keep and id(o) not in chosen and any(covers(a, o) for a in best):
                    out[k] = False
        return out


INT_BOUND = 2**62  # "no limit" for a constraint bound changed in place (CP-SAT's int64 domain)


def _hint(m: cp_model.CpModel, x: list[cp_model.IntVar], choice: Sequence[int | None]) -> None:
    """Hint every variable: 1 for the options in ``choice``, else 0 (``add_hint`` per variable, in one call)."""
    chosen = set(choice)
    hint = m.proto.solution_hint
    hint.vars.extend(v.index for v in x)
    hint.values.extend(int(k in chosen) for k in range(len(x)))


def _read(solver: cp_model.CpSolver, x: list[cp_model.IntVar], options: Sequence[Option], jobs: int
          ) -> tuple[int | None, ...]:
    out: list[int | None] = [None] * jobs
    value = list(solver.response_proto.solution)  # the value of every variable, by index
    for k, v in enumerate(x):
        if value[v.index]:
            out[options[k].job] = k
    return tuple(out)


def greedy(inp: AllocationInput) -> Allocation:
    """Each job in priority order takes its fastest option (then fewest GPUs) that still fits; none if none."""
    t0 = time.perf_counter()
    free = list(inp.capacity_nodes)
    hourly = cents = 0
    choice: list[int | None] = [None] * inp.jobs
    by_job: list[list[int]] = [[] for _ in range(inp.jobs)]
    for k, o in enumerate(inp.options):
        by_job[o.job].append(k)
    for j in inp.priority:
        for k in sorted(by_job[j], key=lambda k: (-inp.options[k].speed, inp.options[k].gpus, k)):
            o = inp.options[k]
            if o.nodes > free[o.system]:
                continue
            if inp.max_cents_per_hour is not None and hourly + o.cents_per_hour > inp.max_cents_per_hour:
                continue
            if inp.max_cents is not None and cents + o.cents > inp.max_cents:
                continue
            free[o.system] -= o.nodes
            hourly += o.cents_per_hour
            cents += o.cents
            choice[j] = k
            break
    ok = all(c is not None or not r for c, r in zip(choice, inp.required, strict=True))
    value = objective_of(inp, choice) if ok else None
    return Allocation("greedy" if ok else "infeasible", tuple(choice), value, None, time.perf_counter() - t0)


def brute_force(inp: AllocationInput) -> tuple[int, int] | None:
    """(best objective, fewest GPUs at that objective) over every assignment; None if none is feasible.

    Depth-first over jobs with the supply checked on the way (exact: only infeasible branches are cut)."""
    by_job: list[list[int | None]] = [[] for _ in range(inp.jobs)]
    for k, o in enumerate(inp.options):
        by_job[o.job].append(k)
    for j in range(inp.jobs):
        if not inp.required[j]:
            by_job[j].append(None)
    best: tuple[int, int] | None = None
    sign = 1 if inp.sense == "max" else -1
    choice: list[int | None] = [None] * inp.jobs
    free = list(inp.capacity_nodes)

    def visit(j: int) -> None:
        nonlocal best
        if j == inp.jobs:
            if feasible(inp, choice):
                key = (sign * objective_of(inp, choice), -gpus_of(inp, choice))
                if best is None or key > (sign * best[0], -best[1]):
                    best = (objective_of(inp, choice), gpus_of(inp, choice))
            return
        for k in by_job[j]:
            o = inp.options[k] if k is not None else None
            if o is not None and o.nodes > free[o.system]:
                continue
            if o is not None:
                free[o.system] -= o.nodes
            choice[j] = k
            visit(j + 1)
            if o is not None:
                free[o.system] += o.nodes
        choice[j] = None

    visit(0)
    return best
