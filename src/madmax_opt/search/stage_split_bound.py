"""Exact pruning inside one base of the uneven search: a lower bound on CP-SAT's objective over the base's own rows.

``stages._solve_base`` minimises, over one candidate row per stage (layers n_s, recompute, hardware; time t_s, DP
sync dp_s, optimizer opt_s in integer microseconds), the integer form of model/step_time.py

    p v T = a tmax + b sum_s t_s + c dpmax + d optmax      (a = p v m, b = p - 1, c = d = p v; all >= 0)

with sum_s n_s = L and per GPU type at most its supply's stages (a fixed composition: exactly k_h stages on h), and
only plans with p v T <= ``limit`` are of interest. dpmax >= the mean of dp_s and optmax likewise, so with a row's
cost w = p b t + c dp + d opt,

    p x p v T >= p a tmax + sum_s w_s >= p a tmax + Q(tau)    for every split with tmax <= tau,

where Q(tau) is the least sum_s w_s over one row per stage with t <= tau, layers summing to L and the stages on one
tracked GPU type within its limits: an exact dynamic programme over stages x layers x stages on that type (with
several limited types, each is tracked in turn and the largest Q kept: each drops the other limits). Q is
nonincreasing in tau, so every split whose tmax lies in [x, y] has p x p v T >= p a x + Q(y).

tmax is one of the rows' times, and only times where the rows can hold the L layers (``_can_hold``) and p a tmax
plus the least possible sum of costs stays within p x ``limit`` are possible. That range is split until every part's
bound exceeds p x ``limit`` (no split is within it: CP-SAT would prove the model infeasible) or a part down to one
time is still within it. Then, unless the best split at that tmax is itself within the limit (the answer is False,
with that split), the DP and optimizer maxima are taken exactly (``_exact_maxima``): for every tmax left and every
dpmax delta, then every optimizer maximum omega, p a tau + p c delta + p d omega + the least sum of p b t over the
rows within all three bounds every split of those maxima; when no triple is within the limit, none is. With at most
one limited GPU type the least over the triples is the optimum itself, so a limit just below it is proved (else
``split_bound`` answers False and CP-SAT decides). Every quantity is an integer below 2^53 held in float64, so the
comparisons are exact.

``SplitProofs`` keeps what each model of one search proved (its optimum, or that nothing is within its limit) about
its set of rows, as value tuples (stage, layers, hardware, t, dp, opt): a later model with the same step form and
stage limits whose rows are a subset of such a set has no split below that bound either (every one of its splits is
a split of the larger set, of equal objective). Bases that differ only where the objective does not see it (ZeRO-1
vs ZeRO-2 with the same times: ZeRO-2 fits a superset of rows, and the rows within the limit are the same) then
need no second CP-SAT proof.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr, IntArr

ROW_FIELDS = ("stage", "layers", "hw", "t_us", "dp_us", "opt_us")  # what a row is to the objective

POINTS = 128  # thresholds evaluated per round (one batched dynamic programme)
ROUNDS = 6  # refinements of the thresholds' range before giving up (CP-SAT then decides)
EXACT_COMBOS = 256  # (tmax, dpmax) pairs, then (tmax, dpmax, optmax) triples, at most, for the exact maxima
BoolArr = NDArray[np.bool_]
Track = tuple[BoolArr, int, int]  # rows on one GPU type (bool per row), least and most stages on it


def _least_sums(stage: IntArr, layers_of: IntArr, admit: BoolArr, cost: Arr, track: Track, p: int,
                layers: int) -> Arr:
    """[threshold]: the least sum of ``cost`` over one row per stage admitted at that threshold (``admit``:
    [threshold, row]), layers summing to ``layers`` and the stages on the tracked type within its limits (inf where
    none)."""
    tracked, lo, hi = track
    k = min(hi, p) + 1  # stages on the tracked type so far: 0..hi (more cannot lead to a valid split)
    if lo >= k:
        return np.full(len(admit), np.inf)
    on = tracked.astype(np.int64)
    i, r = np.nonzero(admit)  # (threshold, row) pairs: the rows each threshold admits
    best = np.full((len(admit), p, 2, layers + 1), np.inf)  # least cost per (threshold, stage, tracked, layers)
    np.minimum.at(best, (i, stage[r], on[r], layers_of[r]), cost[r])
    have = np.isfinite(best).any(axis=0)  # [stage, tracked, layers]
    held = [np.flatnonzero(have[s].any(axis=0)) for s in range(p)]
    fewest = np.array([h.min(initial=layers + 1) for h in held])
    most = np.array([h.max(initial=-1) for h in held])
    v = np.full((len(admit), k, layers + 1), np.inf)
    v[:, 0, 0] = 0.0
    low = high = 0  # layers the stages so far can hold (and still leave the others a count they can hold)
    for s in range(p):
        nxt = np.full_like(v, np.inf)
        new_low = max(low + int(fewest[s]), layers - int(most[s + 1 :].sum()))
        new_high = min(high + int(most[s]), layers - int(fewest[s + 1 :].sum()))
        for g in range(min(2, k)):
            for n in np.flatnonzero(have[s, g]).tolist():
                first, last = max(new_low, low + n), min(new_high, high + n)  # layers after this stage
                if first <= last:
                    np.minimum(nxt[:, g:, first : last + 1],
                               v[:, : k - g, first - n : last + 1 - n] + best[:, s, g, n, None, None],
                               out=nxt[:, g:, first : last + 1])
        v, low, high = nxt, new_low, new_high
        if low > high:
            return np.full(len(admit), np.inf)
    return v[:, lo:, layers].min(axis=1)


def _can_hold(stage: IntArr, layers_of: IntArr, t: Arr, p: int, layers: int, tracks: list[Track],
              taus: Arr) -> BoolArr:
    """[tau]: whether rows with t <= tau, each stage at its most layers, can make up ``layers`` (necessary for a split
    with tmax <= tau; per tracked type, between lo and hi stages on it, as ``stage_bounds.least_max_mixed``)."""
    none = -10 * (layers + 1) * p  # no row within tau: far below any count
    ok = np.ones(len(taus), dtype=bool)
    for on, lo, hi in tracks:
        most = np.full((2, len(taus), p), none)  # [off / on the type, tau, stage]
        for g in (0, 1):
            for s in range(p):
                rows = np.flatnonzero((stage == s) & (on == bool(g)))
                within = t[rows][None, :] <= taus[:, None]
                most[g, :, s] = np.where(within, layers_of[rows][None, :], none).max(axis=1, initial=none)
        gain = -np.sort(-(most[1] - most[0]), axis=1)  # largest first: moving a stage onto the type
        total = most[0].sum(axis=1) + gain[:, :lo].sum(axis=1) + np.maximum(gain[:, lo:hi], 0).sum(axis=1)
        ok &= total >= layers
    return ok


def split_bound(
    stage: IntArr, layers_of: IntArr, t: Arr, dp: Arr, opt: Arr, hw: IntArr, p: int, layers: int,
    coeff: dict[str, int], limit: int, groups: list[tuple[list[int], int, int]], exact: bool = True,
) -> tuple[bool, list[int] | None]:
    """(True when every split of these rows, one per stage, ``groups``: hardware options, least and most stages on
    them, has a p v T above ``limit``; else a split within the limit when the bound's best tmax yields one, as row
    indices, one per stage). ``coeff``: the integer form's coefficients (model/step_time.py). ``exact``: where the
    means leave a tmax within the limit and its best split is not, the maxima are taken exactly (_exact_maxima)."""
    a, b, c, d = (float(coeff[k]) for k in ("stage_max", "stage_sum", "dp_max", "optimizer_max"))
    tracks: list[Track] = [(np.isin(hw, hws), lo, hi) for hws, lo, hi in groups if lo > 0 or hi < p] or [
        (np.zeros(len(t), dtype=bool), 0, 0)]
    cost = p * b * t + c * dp + d * opt  # p x a row's share of b sum t + c dpmax + d optmax (maxima >= means)
    top = float(p) * limit

    def least(admit: BoolArr, row_cost: Arr) -> Arr:
        return np.max([_least_sums(stage, layers_of, admit, row_cost, track, p, layers) for track in tracks], axis=0)

    def within(rows: list[int]) -> bool:
        """The split meets every group's limits and the limit itself."""
        on = [int(np.isin(hw[rows], hws).sum()) for hws, _, _ in groups]
        value = a * t[rows].max() + b * t[rows].sum() + c * dp[rows].max() + d * opt[rows].max()
        return all(lo <= k <= hi for k, (_, lo, hi) in zip(on, groups, strict=True)) and value <= limit

    values = np.unique(t)  # tmax is one of the rows' times
    rest = sum(float(cost[stage == s].min()) for s in range(p))  # every stage at its cheapest row, any layers
    values = values[(p * a * values + rest <= top) & _can_hold(stage, layers_of, t, p, layers, tracks, values)]
    parts = [(0, len(values) - 1)] if len(values) else []
    for _ in range(ROUNDS):
        if not parts:
            return True, None
        per = max(1, POINTS // len(parts))
        pieces = []
        for x, y in parts:  # [x, y] cut into up to ``per`` pieces, each bounded at its right end
            ends = np.unique(np.floor(np.linspace(x - 1, y, min(per, y - x + 1) + 1)[1:]).astype(np.int64))
            pieces += list(zip([x, *(ends[:-1] + 1).tolist()], ends.tolist(), strict=True))
        right = values[[y for _, y in pieces]]
        lows = p * a * values[[x for x, _ in pieces]] + least(t[None, :] <= right[:, None], cost)
        parts = [(x, y) for (x, y), low in zip(pieces, lows.tolist(), strict=True) if low <= top]
        singles = sorted((low, x) for (x, y), low in zip(pieces, lows.tolist(), strict=True) if low <= top and x == y)
        if singles:  # a tmax whose bound is within the limit: its best split is a hint, else the maxima taken exactly
            tau = float(values[singles[0][1]])
            splits = [_best_split(stage, layers_of, t, cost, track, p, layers, tau) for track in tracks]
            hint = next((rows for rows in splits if rows is not None and within(rows)), None)
            taus = np.concatenate([values[x : y + 1] for x, y in parts])
            if exact and hint is None and len(taus) <= EXACT_COMBOS:
                taus = taus[p * a * taus + least(t[None, :] <= taus[:, None], cost) <= top]
                return _exact_maxima(stage, layers_of, t, dp, opt, (a, b, c, d), p, top, taus, least), None
            return False, hint
    return not parts, None


def _exact_maxima(stage: IntArr, layers_of: IntArr, t: Arr, dp: Arr, opt: Arr, coeff: tuple[float, ...], p: int,
                  top: float, taus: Arr, least: Callable[[BoolArr, Arr], Arr]) -> bool:
    """True when every split with tmax in ``taus`` has p x p v T above ``top``, its DP and optimizer maxima taken
    exactly: per (tau, delta, omega), the rows with t <= tau, dp <= delta, opt <= omega and p a tau + p c delta +
    p d omega + the least sum of p b t over them bounds every split of those maxima (their least over all triples is
    the optimum when one GPU type at most is limited: one tracked exactly). First (tau, delta), the optimizer still
    by its mean, then omega for the pairs left; False (undecided) past ``EXACT_COMBOS`` of either."""
    a, b, c, d = coeff
    # a pair's least sum is at least its tmax's without the dpmax cap: dpmax values above what that leaves are out
    free = p * a * taus + least(t[None, :] <= taus[:, None], p * b * t + d * opt)
    pairs = [(tau, delta) for tau, low in zip(taus.tolist(), free.tolist(), strict=True)
             for delta in np.unique(dp[t <= tau]).tolist() if low + p * c * delta <= top]
    if not pairs:
        return True
    if len(pairs) > EXACT_COMBOS:
        return False
    tau_of, delta_of = (np.array(x) for x in zip(*pairs, strict=True))
    admit = (t[None, :] <= tau_of[:, None]) & (dp[None, :] <= delta_of[:, None])
    lows = p * a * tau_of + p * c * delta_of + least(admit, p * b * t + d * opt)
    kept = np.flatnonzero(lows <= top)
    triples = [(i, omega) for i in kept.tolist() for omega in np.unique(opt[admit[i]]).tolist()]
    if len(triples) > EXACT_COMBOS:
        return False
    if not triples:
        return True
    pair_of, omega_of = (np.array(x) for x in zip(*triples, strict=True))
    lows = (p * a * tau_of[pair_of] + p * c * delta_of[pair_of] + p * d * omega_of
            + least(admit[pair_of] & (opt[None, :] <= omega_of[:, None]), p * b * t))
    return not np.any(lows <= top)


def _best_split(stage: IntArr, layers_of: IntArr, t: Arr, cost: Arr, track: Track, p: int, layers: int,
                tau: float) -> list[int] | None:
    """Row indices (one per stage) of a split of least sum of ``cost`` with t <= ``tau`` and the tracked type's
    limits (``_least_sums`` at one threshold, with its choices kept); None when there is none."""
    tracked, lo, hi = track
    k = min(hi, p) + 1
    if lo >= k:
        return None
    on = tracked.astype(np.int64)
    rows = np.flatnonzero(t <= tau)
    keys = (stage[rows] * 2 + on[rows]) * (layers + 1) + layers_of[rows]
    order = np.lexsort((cost[rows], keys))  # per (stage, tracked, layers): its cheapest row first
    _, first = np.unique(keys[order], return_index=True)
    pick = rows[order[first]]
    best = np.full((p, 2, layers + 1), np.inf)
    row_of = np.full((p, 2, layers + 1), -1)
    best[stage[pick], on[pick], layers_of[pick]] = cost[pick]
    row_of[stage[pick], on[pick], layers_of[pick]] = pick
    v = np.full((k, layers + 1), np.inf)
    v[0, 0] = 0.0
    choices = []
    for s in range(p):
        nxt = np.full_like(v, np.inf)
        came = np.full((k, layers + 1, 2), -1)  # (tracked, layers) of the stage's row on the best path
        for g in range(min(2, k)):
            for n in np.flatnonzero(np.isfinite(best[s, g])).tolist():
                value = v[: k - g, : layers + 1 - n] + best[s, g, n]
                better = value < nxt[g:, n:]
                nxt[g:, n:][better] = value[better]
                came[g:, n:][better] = (g, n)
        v = nxt
        choices.append(came)
    count = lo + int(np.argmin(v[lo:, layers]))
    if not np.isfinite(v[count, layers]):
        return None
    split, left = [], layers
    for s in range(p - 1, -1, -1):
        g, n = (int(x) for x in choices[s][count, left])
        split.append(int(row_of[s, g, n]))
        count, left = count - g, left - n
    return split[::-1]


class SplitProofs:
    """Lower bounds on p v T proven over row sets during one uneven search (see the module docstring)."""

    def __init__(self) -> None:
        self._known: list[tuple[tuple[object, ...], frozenset[tuple[float, ...]], float]] = []
        self._current: tuple[tuple[object, ...], frozenset[tuple[float, ...]]] | None = None
        self.hint: list[int] | None = None  # a split within the limit of the rows last passed to ``excludes``

    def excludes(self, cand: dict[str, Arr], live: IntArr, p: int, layers: int, coeff: dict[str, int], limit: int,
                 supply: list[tuple[list[int], int]], counts: dict[int, int] | None, exact: bool = True) -> bool:
        """True when no split of the rows ``live`` of ``cand`` has p v T <= ``limit``: by a bound proven on a
        superset of them, or by ``split_bound``; either way also remembered for later models."""
        key = (p, layers, tuple(sorted(coeff.items())), tuple((tuple(h), a) for h, a in supply),
               tuple(sorted((counts or {}).items())))
        rows = frozenset(zip(*(cand[f][live].tolist() for f in ROW_FIELDS), strict=True))
        self.hint = None
        if any(k == key and low > limit and rows <= known for k, known, low in self._known):
            self._current = None  # nothing new is proven
            return True
        self._current = (key, rows)
        groups = [(hws, 0, allowed) for hws, allowed in supply] + [([h], k, k) for h, k in (counts or {}).items()]
        proved, self.hint = split_bound(cand["stage"][live].astype(np.int64), cand["layers"][live].astype(np.int64),
                                        cand["t_us"][live], cand["dp_us"][live], cand["opt_us"][live],
                                        cand["hw"][live].astype(np.int64), p, layers, coeff, limit, groups, exact)
        if proved:
            self.proved(limit + 1)
        return proved

    def proved(self, lower: float) -> None:
        """Every split of the rows last passed to ``excludes`` has p v T >= ``lower`` (CP-SAT's optimum, or the
        limit + 1 when it proved nothing within the limit)."""
        if self._current is not None:
            self._known.append((*self._current, lower))
            self._current = None
