"""Exact pruning of a uniform plan space before CP-SAT: memory rounds and the vpp bound (``space_candidates``).

Rounds cost a pass of the vectorised model each (about 2 ms of numpy call overhead however few plans it holds, as
much as ~1,200 plans evaluated), so consecutive rounds are evaluated in one pass while they hold at most
``MERGE_PLANS`` plans together; the plans a round would not have evaluated (an ancestor over capacity) are then
dropped again, so the candidates are the same plans, in the same order, with the same bits as round by round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import CHUNK_PLANS, Metrics, Model, concat_chunks, metrics
from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import US
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.training import STEP_TERMS, TrainingTerms
from madmax_opt.search.space import check_space_size, default_vpp, enumerate_plans, memory_rounds

ROUNDING_TOLERANCE_S = len(STEP_TERMS) * 0.5 / US  # each term is rounded once to 1 us
MERGE_PLANS = CHUNK_PLANS  # consecutive memory rounds evaluated in one pass while they hold at most this many plans
# vpp = 1 plans enumerated per batch of hardware options in ``best_candidates`` (~0.5 kB each with their terms while
# the batch is pruned): bounds the memory of a search over many options
BATCH_PLANS = 1 << 17
# with a floor per option (``best_candidates``), an option waits for the best of its system's option of least floor
# when its own floor is this many times larger (a search order only: a smaller ratio skips more options, at more
# batches)
WAIT_RATIO = 1.25
LAST_ROUND = 1 << 40  # round key of the vpp > 1 plans: after every memory round of the vpp = 1 plans
Score = Callable[[PlanArrays, Metrics], tuple[IntArr, NDArray[np.bool_]]]  # integer objective, admissible


def take_rows(obj: Any, index: IntArr) -> Any:
    """Rows ``index`` of a result of ``Model.terms`` (arrays, dicts and dataclasses field by field; per-problem
    scalars unchanged): the inverse of ``evaluator.concat_chunks``. Every array of the terms is per plan."""
    if isinstance(obj, np.ndarray):
        return obj[index]
    if isinstance(obj, dict):
        return {k: take_rows(v, index) for k, v in obj.items()}
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None and not isinstance(obj, type):
        return type(obj)(**{f.name: take_rows(getattr(obj, f.name), index) for f in fields.values() if f.init})
    return obj


def space_candidates(
    model: Model, keep_best: int = 1, plans: PlanArrays | None = None
) -> tuple[PlanArrays, Metrics]:
    """The space (or ``plans``, a subset of it), evaluated, less plans proven infeasible or proven slower than
    ``keep_best`` others on their hardware option (within one option every objective and constraint is monotone in
    the step time, so such plans are in no top-``keep_best``). Two exact facts (``space.memory_rounds``):

    - memory per GPU is nondecreasing in vpp and in mbs: plans are evaluated in rounds, each only when its parent
      (next smaller mbs; the vpp = 1 sibling) fits in memory;
    - vpp only adds p2p per micro-batch (2 v sends per stage) and divides the bubble, so a vpp > 1 plan takes at
      least its vpp = 1 sibling's step time less that sibling's bubble: it is skipped when that exceeds the
      option's ``keep_best``-th best step (plus the rounding tolerance twice).

    Both hold for any subset of the space (a plan's parent is then the next smaller micro-batch size present, and
    a vpp > 1 plan without its vpp = 1 sibling is always evaluated); given ``plans`` keep their order, the space
    comes in round order. The plan of least memory of every group is
    kept (for ``explain_infeasible``); ``verify`` checks the result against the whole space."""
    given = plans is not None
    plans = enumerate_plans(model.problem) if plans is None else plans
    ev = _rounds(model, plans, keep_best)
    taken, passes, row, rows = ev.taken, ev.passes, ev.row, ev.rows
    if not taken:
        return plans, metrics(model, plans)
    order = np.concatenate(taken)
    if given:  # the caller's order (ties between equal objectives go to the earlier plan, as without pruning)
        order = np.sort(order)
    kept = plans.take(order)
    all_terms = passes[0][1] if len(passes) == 1 else concat_chunks([t for _, t in passes])
    if rows == len(order) and np.array_equal(row[order], np.arange(rows)):
        return kept, metrics(model, kept, all_terms)
    return kept, metrics(model, kept, take_rows(all_terms, row[order]))


@dataclass
class _Passes:
    """The memory rounds of a plan set, evaluated: plan indices per round (round order), the model passes, and each
    taken plan's row in the passes end to end; ``ok`` (taken and within capacity) and ``floor_s`` (step time less
    bubble) per plan."""

    taken: list[NDArray[np.int64]]
    passes: list[tuple[NDArray[np.int64], TrainingTerms]]
    pass_plans: list[PlanArrays]  # the plans of each pass (``plans.take`` of its indices)
    row: IntArr
    rows: int
    ok: NDArray[np.bool_]
    floor_s: NDArray[np.float64]
    rounds: IntArr


def _rounds(model: Model, plans: PlanArrays, keep_best: int) -> _Passes:
    n = len(plans)
    rounds, parent = memory_rounds(plans)
    last = int(rounds.max(initial=0))
    has_vpp_round = bool(np.any(plans.vpp > 1))  # then round ``last`` holds exactly the vpp > 1 plans
    up = np.maximum(parent, 0)
    ok = np.zeros(n, dtype=bool)  # taken (every ancestor fits) and within capacity
    floor_s = np.full(n, np.inf)  # taken: step time less bubble (a lower bound for vpp > 1)
    taken: list[NDArray[np.int64]] = []  # plan indices per round, in round order
    passes: list[tuple[NDArray[np.int64], TrainingTerms]] = []  # (plan indices, terms) per model pass
    pass_plans: list[PlanArrays] = []
    row = np.full(n, -1, dtype=np.int64)  # a taken plan's row in the passes, end to end
    rows = 0
    by_round = np.argsort(rounds, kind="stable")  # each round's plans in index order (round r: cut r to r + 1)
    cut = np.searchsorted(rounds[by_round], np.arange(last + 2))
    maybe = np.zeros(n, dtype=bool)  # in the pass being built (cleared after it)
    pos = np.zeros(n, dtype=np.int64)  # a plan's row in the current pass (read for its plans only)

    def open_(q: int, or_maybe: bool = False) -> NDArray[np.int64]:
        """Round q's plans whose parent is taken and fits (or may, in the pass being built), index order."""
        m = by_round[cut[q] : cut[q + 1]]
        u = up[m]
        return m[(parent[m] < 0) | ok[u] | maybe[u]] if or_maybe else m[(parent[m] < 0) | ok[u]]

    r = 0
    while r <= last:
        vpp_round = has_vpp_round and r == last
        idx = open_(r)
        if vpp_round:  # bound by the vpp = 1 plans' best
            floor = np.where(parent[idx] >= 0, floor_s[up[idx]], -np.inf)
            idx = idx[floor <= _kth_best_s(plans, taken, passes, row, keep_best)[plans.hw[idx]]
                      + 2 * ROUNDING_TOLERANCE_S]
        batch, end = [idx], r + 1  # later vpp = 1 rounds join while the pass stays small (any may be dropped)
        maybe[idx] = True
        while not vpp_round and end <= last and not (has_vpp_round and end == last):
            nxt = open_(end, or_maybe=True)
            if sum(map(len, batch)) + len(nxt) > MERGE_PLANS:
                break
            maybe[nxt] = True
            batch.append(nxt)
            end += 1
        every = np.concatenate(batch)
        maybe[every] = False
        if len(every):
            pass_plans.append(plans.take(every))
            t = model.terms(pass_plans[-1])
            fit = t.memory.total <= t.capacity_bytes
            fl = t.step_time_s - t.time["bubble"]
            pos[every] = np.arange(len(every))
            for q in range(r, end):  # what round q alone would have evaluated, once its earlier rounds are known
                sel = open_(q) if q > r else idx
                if len(sel) == 0:
                    continue
                at = pos[sel]
                ok[sel], floor_s[sel] = fit[at], fl[at]
                row[sel] = rows + at
                taken.append(sel)
            passes.append((every, t))
            rows += len(every)
        r = end
    return _Passes(taken, passes, pass_plans, row, rows, ok, floor_s, rounds)


def _kth_best_s(
    plans: PlanArrays,
    taken: list[NDArray[np.int64]],
    passes: list[tuple[NDArray[np.int64], TrainingTerms]],
    row: IntArr,
    k: int,
) -> NDArray[np.float64]:
    """Per hardware option, the k-th smallest step time of the valid plans taken so far (inf if fewer)."""
    best = np.full(int(plans.hw.max(initial=0)) + 1, np.inf)
    if not taken:
        return best
    idx = np.concatenate(taken)
    at = row[idx]
    step = np.concatenate([t.step_time_s for _, t in passes])[at]
    valid = np.concatenate([t.invalid == 0 for _, t in passes])[at]
    hw, step = plans.hw[idx][valid], step[valid]
    if k == 1:  # the least step time per option (a minimum is exact in any order)
        np.minimum.at(best, hw, step)
        return best
    by = np.lexsort((step, hw))  # by option, then step time
    hw, step = hw[by], step[by]
    first = np.searchsorted(hw, hw, side="left")  # each plan's option's first position
    kth = np.arange(len(hw)) - first == k - 1
    best[hw[kth]] = step[kth]
    return best


def enumeration_order(plans: PlanArrays, round_key: IntArr) -> IntArr:
    """Indices sorting ``plans`` by (round, hardware option, then the knobs in ``enumerate_plans`` order): the order
    of ``space_candidates`` on the whole space (rounds in turn, each in enumeration order)."""
    return np.lexsort((plans.ep, plans.sp, plans.recompute, plans.zero, plans.mbs, plans.vpp, plans.cp, plans.pp,
                       plans.tp, plans.hw, round_key))


def _siblings(plans: PlanArrays, index: IntArr, layers: int) -> PlanArrays:
    """The vpp > 1 plans of the default space whose vpp = 1 sibling is ``plans[index]`` (every vpp with pp x vpp
    dividing the layers, ``space.default_vpp``), in enumeration order."""
    parts, values = [], []
    for pp in np.unique(plans.pp[index]).tolist():
        vpps = np.array(default_vpp(layers, pp)[1:], dtype=np.int64)
        at = index[plans.pp[index] == pp]
        parts.append(np.repeat(at, len(vpps)))
        values.append(np.tile(vpps, len(at)))
    rep, vpp = np.concatenate(parts), np.concatenate(values)
    out = plans.take(rep)
    out = PlanArrays(**{**out.__dict__, "vpp": vpp})
    return out.take(enumeration_order(out, np.zeros(len(out), dtype=np.int64)))


def _batch_candidates(
    model: Model, plans: PlanArrays, keep_best: int, lazy_vpp: bool, score: Score
) -> tuple[PlanArrays, TrainingTerms | None, IntArr, int, IntArr]:
    """Every hardware option's ``keep_best`` best admissible plans among the ``space_candidates`` of a batch of
    whole hardware options (in its round order), their terms and round keys, and the plans evaluated; ``lazy_vpp``:
    ``plans`` are the vpp = 1 plans of a default space, and the vpp > 1 plans are built here, only those the vpp
    bound lets through (the same plans ``space_candidates`` evaluates). Each model pass is scored where it lies
    (``score`` is row by row) and only the rows kept are copied: the batch's candidates are never gathered."""
    ev = _rounds(model, plans, keep_best)
    order = np.concatenate(ev.taken) if ev.taken else np.zeros(0, dtype=np.int64)
    parts = [(p, t) for p, (_, t) in zip(ev.pass_plans, ev.passes, strict=True)]
    rows = [ev.row[order]]  # each candidate's row in the parts end to end, in candidate order
    keys = [np.where(plans.vpp[order] > 1, LAST_ROUND, ev.rounds[order])]
    evaluated = ev.rows
    if lazy_vpp:
        kth = _kth_best_s(plans, ev.taken, ev.passes, ev.row, keep_best)
        bound = ev.ok & (plans.pp > 1) & (ev.floor_s <= kth[plans.hw] + 2 * ROUNDING_TOLERANCE_S)
        index = np.flatnonzero(bound)
        if len(index):
            more = _siblings(plans, index, model.problem.model.layers)
            parts.append((more, model.terms(more)))
            rows.append(evaluated + np.arange(len(more), dtype=np.int64))
            keys.append(np.full(len(more), LAST_ROUND, dtype=np.int64))
            evaluated += len(more)
    if not parts:
        return plans.take(order), None, keys[0], evaluated, np.zeros(0, dtype=np.int64)
    scored = [score(p, metrics(model, p, t)) for p, t in parts]
    at = np.concatenate(rows)
    obj, ok = np.concatenate([o for o, _ in scored])[at], np.concatenate([a for _, a in scored])[at]
    hw_of = np.concatenate([p.hw for p, _ in parts])[at]
    idx = np.flatnonzero(ok)
    idx = idx[np.lexsort((idx, obj[idx], hw_of[idx]))]  # by option, objective, position
    hw = hw_of[idx]
    top = np.sort(idx[np.arange(len(idx)) - np.searchsorted(hw, hw) < keep_best])
    want = at[top]  # rows of the kept plans, in candidate order
    ends = np.cumsum([len(p) for p, _ in parts])
    part = np.searchsorted(ends, want, side="right")
    pieces = []  # (positions in ``want``, plans, terms) per part holding some
    for j in np.unique(part).tolist():
        pos = np.flatnonzero(part == j)
        local = want[pos] - (ends[j] - len(parts[j][0]))
        pieces.append((pos, parts[j][0].take(local), take_rows(parts[j][1], local)))
    if not pieces:
        return plans.take(order[:0]), None, keys[0][:0], evaluated, np.zeros(0, dtype=np.int64)
    back = np.argsort(np.concatenate([pos for pos, _, _ in pieces]), kind="stable")
    kept = PlanArrays.concat([p for _, p, _ in pieces]).take(back)
    terms = take_rows(concat_chunks([t for _, _, t in pieces]), back) if len(pieces) > 1 else \
        take_rows(pieces[0][2], back)
    return kept, terms, np.concatenate(keys)[top], evaluated, obj[top]


def best_candidates(
    model: Model, keep_best: int, score: Score, floor: IntArr | None = None
) -> tuple[PlanArrays, Metrics, int]:
    """The space's candidates that can be in the top-``keep_best`` or be their system's best (and the plans
    evaluated to find them): the ``keep_best`` best admissible plans by (integer objective, position in
    ``space_candidates``' order) of every hardware option that can hold one of those, in that order. Within one
    option every constraint is monotone in the objective (``assemble``), so ``pick_best``, a brute-force sort and
    each system's best (``solves.compare_systems``) give the same answer on these as on all of ``space_candidates``.

    The space is enumerated and pruned a batch of hardware options at a time (at most ``BATCH_PLANS`` vpp = 1
    plans), and only the top plans of each batch are kept, so the memory of a search over a whole catalog is that
    of one batch. In a default vpp space the vpp > 1 plans (three quarters of it) are never enumerated whole: only
    the siblings of the vpp = 1 plans the vpp bound lets through. ``score``: integer objective and admissibility of
    evaluated plans (``solver.Candidates`` and ``solver.limits``). ``floor``: per option, an objective no admissible
    plan of it is below (``solver.objective_floor``); options are then searched by ascending floor, and one
    whose floor exceeds both the ``keep_best``-th best objective kept so far and its system's best kept so far is
    never enumerated (every plan of it is strictly worse than both, so it can enter neither; exact)."""
    problem = model.problem
    lazy = problem.space.vpp is None
    rows = check_space_size(problem, vpp_one=lazy)
    plans: list[PlanArrays] = []
    terms: list[TrainingTerms] = []
    keys: list[IntArr] = []
    evaluated = 0
    batch: dict[int, PlanArrays] = {}  # the vpp = 1 plans of each option of the batch being built
    system = [o.system.name for o in problem.hardware]
    kept_obj: list[int] = []  # objectives of every kept plan (all admissible)
    system_best: dict[str, int] = {}

    def flush() -> None:
        nonlocal evaluated
        together = PlanArrays.concat([batch[hw] for hw in sorted(batch)]) if batch else None
        batch.clear()
        if together is None or not len(together):  # options whose space is empty (tp 3 on 8 GPUs) add nothing
            return
        kept, t, key, n, obj = _batch_candidates(model, together, keep_best, lazy, score)
        evaluated += n
        if t is not None and len(kept):
            plans.append(kept)
            terms.append(t)
            keys.append(key)
            kept_obj.extend(obj.tolist())
            for h, o in zip(kept.hw.tolist(), obj.tolist(), strict=True):
                system_best[system[h]] = min(o, system_best.get(system[h], o))

    def needed(hw: int) -> bool:  # can hw hold a top-keep_best plan or its system's best?
        if floor is None or len(kept_obj) < keep_best or system[hw] not in system_best:
            return True
        kth = sorted(kept_obj)[keep_best - 1]
        return int(floor[hw]) <= max(kth, system_best[system[hw]])

    queue = list(range(len(problem.hardware))) if floor is None else np.argsort(floor, kind="stable").tolist()
    # with ``floor`` over more than one batch: first each system's option of least floor, the others once their
    # system's best is known; then batches in floor order
    wait = floor is not None and sum(rows) > BATCH_PLANS
    while queue:
        later: list[int] = []
        cut = False
        for i, hw in enumerate(queue):
            if not needed(hw):
                continue
            if wait and floor is not None and any(system[b] == system[hw] and WAIT_RATIO * floor[b] < floor[hw] for b in batch):
                later.append(hw)  # the best of its system's option in the batch may make it unneeded
                continue
            batch[hw] = enumerate_plans(problem, options=[hw], vpp_one=lazy)
            if sum(map(len, batch.values())) >= BATCH_PLANS:
                later.extend(queue[i + 1 :])
                cut = True
                break
        flush()
        queue, wait = later, wait and cut
    if not plans or not sum(map(len, plans)):
        empty = enumerate_plans(problem, options=[])
        return empty, metrics(model, empty), evaluated
    every = PlanArrays.concat(plans)
    order_ = enumeration_order(every, np.concatenate(keys))
    every = every.take(order_)
    return every, metrics(model, every, take_rows(concat_chunks(terms), order_)), evaluated
