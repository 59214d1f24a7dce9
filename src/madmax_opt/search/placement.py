"""Embedding-table placement by CP-SAT (with a greedy baseline and a brute force), and the DLRM plan search.

Placement ("enumerate, then assemble", docs/reference/solver-notes.md): ``dlrm.embedding_options`` enumerates every
way to hold a table and what one shard adds to each per-GPU term (lookup time, memory, each collective lane) as a
GPU's owner / node-mate / remote. Those coefficients are rounded once here (time to 1 ns, memory up to 1 MB) and
CP-SAT chooses, for every table group, how many tables take each option and where:

- identical tables are *grouped*: one integer count per (group, option, GPU or node) instead of one Boolean per
  table. DLRM-A's 4096 identical tables on 128 GPUs become 128 table-wise counts, 128 column-shard counts per split,
  16 table-row-wise node counts, a row-wise and a data-parallel count. A concrete plan is recovered by dealing the
  counts out to tables (the costs are per shard, so every dealing costs the same).
- per GPU g and term t the load is linear in the counts: sum_o (c_self - c_node) x[o,g] + (c_node - c_remote)
  X[o, node(g)] + c_remote X[o] (node and total sums as auxiliary integers), so
- the objective, sum over lookup phases and collectives of weight x busiest-GPU time (+ latency when used), is a sum
  of maxima: one integer per phase / collective with ``>=`` every GPU's lane load; memory per GPU ``<=`` capacity.

The greedy baseline (what common planners do): every table table-wise, largest table first, to the GPU with the
least load so far (lookup + its own communication) that still has memory room. It is also the solver's hint
(search/placement_hint.py may start it lower), so the solver never returns worse; when an averaging lower bound
(search/placement_bound.py) reaches its objective it is the optimum without a solve. The brute force
(search/placement_brute.py) enumerates every option of every table (small instances only) over the same integer
coefficients: the exactness reference."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from madmax_opt.core.errors import InternalError
from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_KIND,
    COLLECTIVE_LANES,
    LOOKUPS,
    SELF,
    TERM_INDEX,
    TERMS,
    ShardArrays,
    collective_maxima,
    collectives_used,
    per_gpu_terms,
)
from madmax_opt.search.cpsat import CpSatOptions, time_limit_error
from madmax_opt.search.cpsat import gap as relative_gap
from madmax_opt.search.cpsat import options as cpsat_options
from madmax_opt.search.cpsat import run as cpsat_run
from madmax_opt.search.ortools_import import load_cp_model
from madmax_opt.search.placement_bound import lower_bound, model_variables
from madmax_opt.search.placement_hint import improved_hint
from madmax_opt.search.placement_ints import MEMORY, IntTables, int_objective

if TYPE_CHECKING:  # imported where a CP-SAT model is built (search/ortools_import.py: without pandas)
    from ortools.sat.python import cp_model

# ============================================================================================ greedy


def greedy_placement(it: IntTables) -> ShardArrays | None:
    """Every table table-wise: largest (bytes) first, each to the least-loaded GPU (its own lookup and
    communication time so far, float coefficients; ties to the lowest index) with memory room; None when some table
    fits nowhere. The identical tables of a group are dealt at once (``_deal``)."""
    opts, lay = it.opts, it.layout
    tw = {o.group: i for i, o in enumerate(opts.options) if o.sharding == "table_wise"}
    if sum(opts.counts[j] for j in tw) != sum(opts.counts):
        return None  # some group may not be held table-wise (not allowed, or a table exceeds a GPU)
    own_terms = [TERM_INDEX[k] for k in (*LOOKUPS, "tw_in.recv_intra", "tw_in.recv_inter", "tw_out.send_intra",
                                         "tw_out.send_inter")]
    load = np.zeros(lay.gpus)
    mem = np.zeros(lay.gpus, dtype=np.int64)
    placed = np.zeros((len(opts.options), lay.gpus), dtype=np.int64)  # tables per (option, GPU)
    for _, j in sorted((-float(opts.coef[o, MEMORY, SELF]), j) for j, o in tw.items()):  # largest first
        o = tw[j]
        cost = float(opts.coef[o, own_terms, SELF].sum())  # the load one table adds
        taken = _deal(load, mem, opts.counts[j], cost, int(it.coef[o, MEMORY, SELF]), int(it.capacity_mb))
        if taken is None:
            return None
        placed[o] = taken
    o_idx, g_idx = np.nonzero(placed)
    return ShardArrays(o_idx.astype(np.int64), g_idx.astype(np.int64), placed[o_idx, g_idx])


def _deal(load: Arr, mem: IntArr, count: int, cost: float, size_mb: int, cap_mb: int) -> IntArr | None:
    """Tables per GPU when ``count`` identical tables go one by one to the least-loaded GPU (ties: lowest index)
    with memory room; ``load`` and ``mem`` are updated in place. One by one, GPU g's k-th table arrives at load
    load_g + cost + ... + cost (k-1 additions, in this order), so the tables go to the ``count`` smallest
    (load, GPU) pairs over all GPUs (a k-way merge); a GPU has room for (cap - mem) // size of them."""
    n = len(load)
    room = np.clip((cap_mb - mem) // size_mb if size_mb > 0 else np.full(n, count), 0, count)
    if int(room.sum()) < count:
        return None
    spread = (load.max() - load.min()) / cost if cost > 0 else float(count)
    width = min(count, -(-count // n) + int(min(spread, count)) + 1)  # pairs per GPU that can be among the smallest
    while True:
        keys = np.full((n, width + 1), cost)
        keys[:, 0] = load
        np.add.accumulate(keys, axis=1, out=keys)  # sequential: the same floats as adding one table at a time
        gpu, k = np.nonzero(np.arange(width)[None, :] < room[:, None])
        first = np.lexsort((gpu, keys[gpu, k]))[:count]
        taken = np.bincount(gpu[first], minlength=n)
        if width == count or not np.any((taken == width) & (room > width)):
            break
        width = min(2 * width, count)  # a GPU took every pair it was given: look further
    load[:] = keys[np.arange(n), taken]
    mem += taken * size_mb
    return taken


# =========================================================================================== CP-SAT


@dataclass
class PlacementResult:
    shards: ShardArrays
    status: str  # optimal | feasible
    objective: int  # ns, integer model
    bound: float  # CP-SAT's proven lower bound, ns
    wall_s: float
    variables: int
    greedy: ShardArrays | None
    greedy_objective: int | None  # ns, integer model
    # bound: the averaging bound met the plan, no model was built; none: no model built, not proven (pruned option)
    proved_by: Literal["cp-sat", "bound", "none"] = "cp-sat"

    @property
    def gap(self) -> float:
        return relative_gap(self.objective, self.bound)

    @property
    def gain_vs_greedy(self) -> float | None:
        """Fraction by which the plan's objective is below greedy's (None when greedy finds no placement)."""
        if self.greedy_objective is None:
            return None
        return 1.0 - self.objective / self.greedy_objective


class PlacementModel:
    """The CP-SAT model of one placement instance (see the module docstring)."""

    def __init__(self, it: IntTables) -> None:
        load_cp_model()  # without pandas (search/ortools_import.py)
        from ortools.sat.python import cp_model

        self.it = it
        opts, lay = it.opts, it.layout
        self._nz = [np.flatnonzero(it.coef[:, t].any(axis=1)).tolist() for t in range(len(TERMS))]
        self._cap = [opts.counts[o.group] * o.split for o in opts.options]
        self._node_part: dict[tuple[int, int], tuple[Any, int]] = {}
        self._global_part: dict[int, tuple[Any, int]] = {}
        self._coefs: dict[int, list[tuple[int, int, int, int]]] = {}
        self._own: dict[int, tuple[list[tuple[int, int]], int]] = {}
        N, G, M = lay.gpus, lay.node, lay.nodes
        self.node_of = [g // G for g in range(N)]
        m = self.model = cp_model.CpModel()
        self.x: dict[int, list[cp_model.IntVar]] = {}  # option -> counts per location (GPUs, nodes, or global)
        self.tables: dict[int, cp_model.IntVar] = {}  # option -> tables held that way
        self.xnode: dict[int, list[cp_model.IntVar]] = {}  # gpu-located option -> per-node sums
        for o, opt in enumerate(opts.options):
            c = opts.counts[opt.group]
            tag = f"group{opt.group}_{opt.sharding}" + (f"{opt.split}" if opt.split > 1 else "")  # variable names
            self.tables[o] = m.new_int_var(0, c, f"tables_{tag}")
            if opt.located == "gpu":
                self.x[o] = [m.new_int_var(0, c * opt.split, f"shards_{tag}_gpu{g}") for g in range(N)]
                m.add(sum(self.x[o]) == opt.split * self.tables[o])
                self.xnode[o] = []
                for k in range(M):
                    v = m.new_int_var(0, c * opt.split, f"shards_{tag}_node{k}")
                    m.add(v == sum(self.x[o][k * G:(k + 1) * G]))
                    self.xnode[o].append(v)
            elif opt.located == "node":
                self.x[o] = [m.new_int_var(0, c, f"tables_{tag}_node{k}") for k in range(M)]
                m.add(sum(self.x[o]) == self.tables[o])
            else:
                self.x[o] = [self.tables[o]]
        for j, c in enumerate(opts.counts):
            m.add(sum(self.tables[o] for o, opt in enumerate(opts.options) if opt.group == j) == c)

        objective: list[Any] = []
        self.peaks: dict[str, cp_model.IntVar] = {}  # busiest GPU lane of each lookup phase / collective
        for phase in (*LOOKUPS, *COLLECTIVE_LANES):
            lanes = [phase] if phase in LOOKUPS else [f"{phase}.{ln}" for ln in COLLECTIVE_LANES[phase]]
            idx = [TERM_INDEX[t] for t in lanes if it.coef[:, TERM_INDEX[t]].any()]
            w = it.weights[phase]
            if not idx or not w:
                continue
            exprs = [self.load(g, t) for t in idx for g in range(N)]
            hi = max(ub for _, ub in exprs)
            assert hi < 2**50, "placement objective overflow"
            peak = self.peaks[phase] = m.new_int_var(0, hi, f"max_{phase}")
            for e, _ in exprs:
                m.add(peak >= e)
            objective.append(w * peak)
        self.used: dict[str, cp_model.IntVar] = {}  # a collective's latency is paid when any table uses it
        for phase, lat in it.latency.items():
            members = [self.tables[o] for o, opt in enumerate(opts.options) if opt.sharding == COLLECTIVE_KIND[phase]]
            if lat and it.weights[phase] and members:
                used = self.used[phase] = m.new_bool_var(f"used_{phase}")
                m.add(sum(members) <= sum(opts.counts) * used)
                objective.append(it.weights[phase] * lat * used)
        mem = []
        for g in range(N):
            e, _ = self.load(g, MEMORY)
            m.add(e <= it.capacity_mb)
            mem.append(e)
        # symmetry breaking (valid: GPUs of a node are interchangeable, and so are nodes, so every placement can
        # be permuted into this order): memory non-increasing over the GPUs of each node and over node totals
        for g in range(N - 1):
            if self.node_of[g] == self.node_of[g + 1]:
                m.add(mem[g] >= mem[g + 1])
        node_mem = [sum(mem[k * G:(k + 1) * G]) for k in range(M)]
        for k in range(M - 1):
            m.add(node_mem[k] >= node_mem[k + 1])
        m.minimize(sum(objective))
        # search: decide the counts, then give every max / used variable its lowest value (without the second
        # strategy a single worker lowered a slack max variable by 1 ns per solution)
        counts = [self.tables[o] for o in self.tables]
        counts += [v for o in self.x if opts.options[o].located != "global" for v in self.x[o]]
        m.add_decision_strategy(counts, cp_model.CHOOSE_FIRST, cp_model.SELECT_MAX_VALUE)
        m.add_decision_strategy([*self.peaks.values(), *self.used.values()], cp_model.CHOOSE_FIRST,
                                cp_model.SELECT_MIN_VALUE)

    def load(self, g: int, t: int) -> tuple[cp_model.LinearExprT, int]:
        """(linear expression, upper bound) of term t on GPU g: its own shards' part, plus shared integer sums of
        its node's part and the cluster-wide part (one per node and term, one per term: a sparse model)."""
        k = self.node_of[g]
        if (t, k) not in self._node_part:
            self._node_part[t, k] = self._shared(self._parts(t, k, "node"), f"node{t}_{k}")
        if t not in self._global_part:
            self._global_part[t] = self._shared(self._parts(t, -1, "global"), f"all{t}")
        if t not in self._own:  # the own part's (coefficient, option) pairs and bound are the same on every GPU
            self._coefs_of(t)
            pairs = [(cs - cn, o) for o, cs, cn, _ in self._coefs[t]
                     if self.it.opts.options[o].located == "gpu" and cs != cn]
            self._own[t] = (pairs, sum(self._cap[o] * max(c, 0) for c, o in pairs))
        pairs, own_ub = self._own[t]
        node, node_ub = self._node_part[t, k]
        glob, glob_ub = self._global_part[t]
        return sum([c * self.x[o][g] for c, o in pairs]) + node + glob, own_ub + node_ub + glob_ub

    def _coefs_of(self, t: int) -> None:
        if t not in self._coefs:  # (option, c_self, c_node, c_remote) of term t, as Python ints
            self._coefs[t] = [(o, int(c[0]), int(c[1]), int(c[2])) for o in self._nz[t]
                              for c in (self.it.coef[o, t],)]

    def _shared(self, part: tuple[list[Any], tuple[int, int]], name: str) -> tuple[Any, int]:
        terms, (lb, ub) = part
        if len(terms) <= 1:
            return sum(terms), ub
        v = self.model.new_int_var(lb, ub, name)
        self.model.add(v == sum(terms))
        return v, ub

    def _parts(self, t: int, where: int, part: str) -> tuple[list[Any], tuple[int, int]]:
        """The terms of the load of term t that belong to GPU ``where`` alone (own: c_self - c_node on its
        gpu-located shards), to node ``where`` (node: c_node - c_remote on the node's shards), or to everyone
        (global: c_remote on all shards, c_self on global options), with their bounds."""
        terms: list[Any] = []
        lb = ub = 0
        self._coefs_of(t)
        for o, cs, cn, cr in self._coefs[t]:
            opt = self.it.opts.options[o]
            var: Any
            if part == "own":
                c, var = (cs - cn, self.x[o][where]) if opt.located == "gpu" else (0, None)
            elif part == "node":
                c, var = (cn - cr, (self.xnode[o] if opt.located == "gpu" else self.x[o])[where]) \
                    if opt.located != "global" else (0, None)
            else:
                c = cs if opt.located == "global" else cr
                var = opt.split * self.tables[o] if opt.located == "gpu" else self.tables[o]
            if c:
                terms.append(c * var)
                lb += self._cap[o] * min(c, 0)
                ub += self._cap[o] * max(c, 0)
        return terms, (lb, ub)

    def hint(self, shards: ShardArrays) -> None:
        """A complete hint: every count, sum, max and used variable of ``shards``' placement."""
        it, opts, lay = self.it, self.it.opts, self.it.layout
        self.model.clear_hints()
        loc = np.zeros((len(opts.options), max(lay.gpus, 1)), dtype=np.int64)
        for o, g, k in zip(shards.option.tolist(), shards.location.tolist(), shards.count.tolist(), strict=True):
            loc[o, max(g, 0)] += k
        for o, opt in enumerate(opts.options):
            n_loc = len(self.x[o])
            if opt.located != "global":
                for i, var in enumerate(self.x[o]):
                    self.model.add_hint(var, int(loc[o, i]))
            self.model.add_hint(self.tables[o], int(loc[o, :n_loc].sum()) // opt.split)
            for k, var in enumerate(self.xnode.get(o, [])):
                self.model.add_hint(var, int(loc[o, k * lay.node:(k + 1) * lay.node].sum()))
        mx = collective_maxima(per_gpu_terms(it.coef, opts.options, shards, lay))
        for phase, var in self.peaks.items():
            self.model.add_hint(var, int(mx[phase]))
        used = collectives_used(opts.options, shards)
        for phase, var in self.used.items():
            self.model.add_hint(var, int(phase in used))

    def solution(self, solver: cp_model.CpSolver) -> ShardArrays:
        rows: list[tuple[int, int, int]] = []
        for o, opt in enumerate(self.it.opts.options):
            for loc, var in enumerate(self.x[o]):
                k = int(solver.value(var))
                if k:
                    rows.append((o, loc if opt.located != "global" else -1, k))
        arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return ShardArrays(arr[:, 0], arr[:, 1], arr[:, 2])


PROOF_PHASE_LIMIT = 5.0  # deterministic time units of the first, single-worker phase
QUICK_PROOF_LIMIT = 0.2  # of which without presolve (the examples' easy instances: 0.01-0.12 units)


def _phase(pm: PlacementModel, hint: ShardArrays | None, *, cpsat: CpSatOptions, deterministic_limit: float | None,
           portfolio: bool, presolve: bool = False) -> tuple[Any, cp_model.CpSolver]:
    """One CP-SAT run (through the factory: --solver-params apply last). Proof phase: one worker following the
    decision strategies with quick restarts, full LP relaxation, no presolve (or, ``presolve``, CP-SAT's presolve
    without its symmetry detection). Portfolio phase: CP-SAT's own portfolio (LNS included), interleaved in one
    thread when ``workers`` is 1 so that it stays deterministic."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    if hint is not None:
        pm.hint(hint)
    prm: dict[str, Any] = {"cp_model_presolve": presolve, "linearization_level": 2}
    if presolve:
        prm["symmetry_level"] = 0
    if deterministic_limit is not None:
        prm["max_deterministic_time"] = deterministic_limit
    if portfolio:
        prm.update(num_workers=max(cpsat.workers, PORTFOLIO_WORKERS), interleave_search=cpsat.workers == 1)
    else:
        prm.update(num_workers=1, search_branching=cp_model.PORTFOLIO_WITH_QUICK_RESTART_SEARCH)
    return cpsat_run(pm.model, cpsat, "table placement", **prm)


PORTFOLIO_WORKERS = 4  # subsolvers of the second phase (interleaved in one thread when workers == 1)


def solve_placement(
    it: IntTables, *, time_limit_s: float = 30.0, workers: int = 1, seed: int = 0,
    deterministic_limit: float | None = None, cpsat: CpSatOptions | None = None, build_model: bool = True,
) -> PlacementResult | None:
    """Minimise the integer placement objective under per-GPU memory; None when no placement fits.

    ``build_model=False`` (an option that cannot hold the optimum, search/dlrm_search.py): no CP-SAT model; the
    greedy plan or the better start of search/placement_hint.py, optimal only where the averaging bound proves it
    (None when greedy places nothing).

    When the averaging lower bound (search/placement_bound.py) reaches the greedy plan's objective, the greedy
    plan is the proven optimum and no CP-SAT model is built (identical tables dealt evenly: every example's
    table-wise optimum), unless --export-model or --solver-params ask for the model. Otherwise two phases (measured, ortools 9.15, on random small instances, DLRM-A/I at 96-512 GPUs, 50-200 heterogeneous
    tables): (1) one worker following the decision strategies with quick restarts and the full LP relaxation
    proves every small and every grouped instance within PROOF_PHASE_LIMIT deterministic units: the first
    QUICK_PROOF_LIMIT units without presolve (the easy instances), the rest with presolve minus its symmetry
    detection (that alone cost up to 30 s over identical GPUs); (2) if not proven, CP-SAT's portfolio with LNS
    (interleaved: deterministic with one worker) continues from the best plan for the rest of ``time_limit_s`` (or
    ``deterministic_limit`` units). The first hint is the greedy plan, or where a group of many identical tables
    does not divide over the GPUs a better start (search/placement_hint.py); the result is never worse than greedy.
    """
    t0 = time.perf_counter()
    opts = cpsat_options(cpsat, time_limit_s=time_limit_s, workers=workers, seed=seed)
    time_limit_s = opts.time_limit_s
    greedy = greedy_placement(it)
    greedy_obj = int_objective(it, greedy)[0] if greedy is not None else None
    wants_model = opts.export_model is not None or bool(opts.params)  # --export-model / --solver-params: CP-SAT
    floor = lower_bound(it, greedy) if greedy is not None else 0  # the averaging bound (search/placement_bound.py)

    def without_model(plan: tuple[int, ShardArrays]) -> PlacementResult:
        """``plan`` (objective, shards) as the result, optimal where the averaging bound reaches it."""
        proven = floor >= plan[0]
        return PlacementResult(shards=plan[1], status="optimal" if proven else "feasible", objective=plan[0],
                               bound=float(min(floor, plan[0])), wall_s=time.perf_counter() - t0,
                               variables=model_variables(it), greedy=greedy, greedy_objective=greedy_obj,
                               proved_by="bound" if proven else "none")

    if greedy is not None and greedy_obj is not None and not wants_model and floor >= greedy_obj:
        return without_model((greedy_obj, greedy))  # the bound proves the greedy plan optimal: no CP-SAT model
    start: tuple[int, ShardArrays] | None = None
    if greedy is not None and greedy_obj is not None:  # the first hint: greedy, or a better start for big groups
        start = improved_hint(it, greedy_obj, greedy_placement) or (greedy_obj, greedy)
    if not build_model:
        return None if start is None else without_model(start)
    load_cp_model()  # without pandas (search/ortools_import.py); only where a model is built
    from ortools.sat.python import cp_model

    pm = PlacementModel(it)
    best = start
    first = PROOF_PHASE_LIMIT if deterministic_limit is None else min(PROOF_PHASE_LIMIT, deterministic_limit)
    quick = min(QUICK_PROOF_LIMIT, first)
    st, solver = _phase(pm, best[1] if best else None, cpsat=opts, deterministic_limit=quick, portfolio=False)
    bound = float(solver.best_objective_bound) if st != cp_model.INFEASIBLE else 0.0
    best = _better(it, pm, solver, st, best)
    left_s = time_limit_s - (time.perf_counter() - t0)
    if st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and first > quick and left_s > 0.1:
        # not proven at once: the rest of the proof phase with presolve (its dual reductions proved the hard
        # instances in 2-4x fewer deterministic units; its own ~0.1 s would dominate the easy ones)
        st, solver = _phase(pm, best[1] if best else greedy, cpsat=opts.with_time_limit(left_s),
                            deterministic_limit=first - quick, portfolio=False, presolve=True)
        if st != cp_model.INFEASIBLE:
            bound = max(bound, float(solver.best_objective_bound))
        best = _better(it, pm, solver, st, best)
    left_s = time_limit_s - (time.perf_counter() - t0)
    left_det = None if deterministic_limit is None else deterministic_limit - first
    if st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and left_s > 0.1 and (left_det is None or left_det > 0):
        st, solver = _phase(pm, best[1] if best else None, cpsat=opts.with_time_limit(left_s),
                            deterministic_limit=left_det, portfolio=True)
        if st != cp_model.INFEASIBLE:
            bound = max(bound, float(solver.best_objective_bound))
        best = _better(it, pm, solver, st, best)
    if best is None:
        if st == cp_model.UNKNOWN:  # neither greedy nor CP-SAT found a placement, and none was proven impossible
            raise time_limit_error(opts, "table placement")
        return None
    obj, shards = best
    return PlacementResult(
        shards=shards,
        status="optimal" if st == cp_model.OPTIMAL or bound >= obj else "feasible",
        objective=obj,
        bound=min(bound, float(obj)),
        wall_s=time.perf_counter() - t0,
        variables=len(pm.model.proto.variables),
        greedy=greedy,
        greedy_objective=greedy_obj,
    )


def _better(it: IntTables, pm: PlacementModel, solver: cp_model.CpSolver, st: Any,
            best: tuple[int, ShardArrays] | None) -> tuple[int, ShardArrays] | None:
    """The better of ``best`` and the run's solution (re-evaluated: CP-SAT's value must match the integers)."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return best
    shards = pm.solution(solver)
    obj, fits = int_objective(it, shards)
    # a proven optimum is tight; a time-limited solution may leave slack in the max variables (obj lower)
    if obj > round(solver.objective_value) or not fits or (st == cp_model.OPTIMAL
                                                            and obj != round(solver.objective_value)):
        raise InternalError(f"placement model mismatch: CP-SAT objective {solver.objective_value:.0f} ns, "
                            f"re-evaluated {obj} ns, memory fits: {fits}")
    return (obj, shards) if best is None or obj < best[0] else best
