"""Exact pruning of a uniform plan space before CP-SAT: memory rounds and the vpp bound (``space_candidates``).

Rounds cost a pass of the vectorised model each (about 2 ms of numpy call overhead however few plans it holds, as
much as ~1,200 plans evaluated), so consecutive rounds are evaluated in one pass while they hold at most
``MERGE_PLANS`` plans together; the plans a round would not have evaluated (an ancestor over capacity) are then
dropped again, so the candidates are the same plans, in the same order, with the same bits as round by round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import CHUNK_PLANS, Metrics, Model, concat_chunks, metrics
from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import US
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.training import STEP_TERMS, TrainingTerms
from madmax_opt.search.space import enumerate_plans, memory_rounds

ROUNDING_TOLERANCE_S = len(STEP_TERMS) * 0.5 / US  # each term is rounded once to 1 us
MERGE_PLANS = CHUNK_PLANS  # consecutive memory rounds evaluated in one pass while they hold at most this many plans


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
    n = len(plans)
    rounds, parent = memory_rounds(plans)
    last = int(rounds.max(initial=0))
    has_vpp_round = bool(np.any(plans.vpp > 1))  # then round ``last`` holds exactly the vpp > 1 plans
    up = np.maximum(parent, 0)
    ok = np.zeros(n, dtype=bool)  # taken (every ancestor fits) and within capacity
    floor_s = np.full(n, np.inf)  # taken: step time less bubble (a lower bound for vpp > 1)
    taken: list[NDArray[np.int64]] = []  # plan indices per round, in round order
    passes: list[tuple[NDArray[np.int64], TrainingTerms]] = []  # (plan indices, terms) per model pass
    row = np.full(n, -1, dtype=np.int64)  # a taken plan's row in the passes, end to end
    rows = 0
    r = 0
    while r <= last:
        vpp_round = has_vpp_round and r == last
        idx = np.flatnonzero((rounds == r) & ((parent < 0) | ok[up]))
        if vpp_round:  # bound by the vpp = 1 plans' best
            floor = np.where(parent[idx] >= 0, floor_s[up[idx]], -np.inf)
            idx = idx[floor <= _kth_best_s(plans, taken, passes, row, keep_best)[plans.hw[idx]]
                      + 2 * ROUNDING_TOLERANCE_S]
        batch, end = [idx], r + 1  # later vpp = 1 rounds join while the pass stays small (any may be dropped)
        maybe = np.zeros(n, dtype=bool)
        maybe[idx] = True
        while not vpp_round and end <= last and not (has_vpp_round and end == last):
            nxt = np.flatnonzero((rounds == end) & ((parent < 0) | ok[up] | maybe[up]))
            if sum(map(len, batch)) + len(nxt) > MERGE_PLANS:
                break
            maybe[nxt] = True
            batch.append(nxt)
            end += 1
        every = np.concatenate(batch)
        if len(every):
            t = model.terms(plans.take(every))
            fit = np.zeros(n, dtype=bool)
            fit[every] = t.memory.total <= t.capacity_bytes
            fl = np.full(n, np.inf)
            fl[every] = t.step_time_s - t.time["bubble"]
            pos = np.full(n, -1, dtype=np.int64)
            pos[every] = np.arange(len(every))
            for q in range(r, end):  # what round q alone would have evaluated, once its earlier rounds are known
                sel = np.flatnonzero((rounds == q) & ((parent < 0) | ok[up])) if q > r else idx
                if len(sel) == 0:
                    continue
                ok[sel], floor_s[sel] = fit[sel], fl[sel]
                row[sel] = rows + pos[sel]
                taken.append(sel)
            passes.append((every, t))
            rows += len(every)
        r = end
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
    for h in np.unique(plans.hw[idx]):
        s = np.sort(step[valid & (plans.hw[idx] == h)])
        if len(s) >= k:
            best[h] = s[k - 1]
    return best
