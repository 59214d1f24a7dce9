"""The exactness reference of the table placement (search/placement.py): every option of every table enumerated
over the same integer coefficients (small instances only)."""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_LANES,
    LOOKUPS,
    TERM_INDEX,
    TERMS,
    ShardArrays,
    collectives_used,
    per_gpu_terms,
)
from madmax_opt.search.placement_ints import MEMORY, IntTables


def table_choices(it: IntTables) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per table (groups expanded): every (option, locations) it can take; column shards as GPU multisets."""
    lay = it.layout
    out: list[list[tuple[int, tuple[int, ...]]]] = []
    for j, c in enumerate(it.opts.counts):
        choices: list[tuple[int, tuple[int, ...]]] = []
        for o, opt in enumerate(it.opts.options):
            if opt.group != j:
                continue
            if opt.located == "gpu":
                choices += [(o, gs) for gs in itertools.combinations_with_replacement(range(lay.gpus), opt.split)]
            elif opt.located == "node":
                choices += [(o, (k,)) for k in range(lay.nodes)]
            else:
                choices.append((o, (-1,)))
        out += [choices] * c
    return out


def brute_force_placement(it: IntTables, chunk: int = 200_000) -> tuple[int, ShardArrays] | None:
    """The exact optimum by enumerating every combination of every table's choices (small instances only)."""
    per_table = table_choices(it)
    phases = [(k, [TERM_INDEX[k]]) for k in LOOKUPS] + [
        (c, [TERM_INDEX[f"{c}.{ln}"] for ln in lanes]) for c, lanes in COLLECTIVE_LANES.items()]
    phase_names = list(COLLECTIVE_LANES)
    vecs: list[NDArray[np.int64]] = []  # per table: (choices, terms, N) integer loads
    masks: list[NDArray[np.int64]] = []  # per table: (choices,) bitmask of collectives used
    for choices in per_table:
        v, mk = [], []
        for o, locs in choices:
            sh = ShardArrays(np.full(len(locs), o, dtype=np.int64), np.array(locs, dtype=np.int64),
                             np.ones(len(locs), dtype=np.int64))
            v.append(per_gpu_terms(it.coef, it.opts.options, sh, it.layout))
            used = collectives_used(it.opts.options, sh)
            mk.append(sum(1 << phase_names.index(c) for c in used))
        vecs.append(np.array(v))
        masks.append(np.array(mk, dtype=np.int64))
    n_tab = len(per_table)
    split = n_tab
    size = 1
    for i, table_vecs in enumerate(vecs):  # enumerate a prefix of tables fully, loop over the rest
        if size * len(table_vecs) > chunk:
            split = i
            break
        size *= len(table_vecs)
    pre_tot = np.zeros((1, len(TERMS), it.layout.gpus), dtype=np.int64)
    pre_mask = np.zeros(1, dtype=np.int64)
    pre_idx = np.zeros((1, 0), dtype=np.int64)
    for i in range(split):
        k = len(vecs[i])
        pre_tot = (pre_tot[:, None] + vecs[i][None]).reshape(-1, len(TERMS), it.layout.gpus)
        pre_mask = (pre_mask[:, None] | masks[i][None]).reshape(-1)
        pre_idx = np.concatenate([np.repeat(pre_idx, k, axis=0), np.tile(np.arange(k), len(pre_idx))[:, None]], 1)
    best: tuple[int, tuple[int, ...]] | None = None
    lat = np.array([it.latency[c] * it.weights[c] for c in phase_names], dtype=np.int64)
    for rest in itertools.product(*[range(len(v)) for v in vecs[split:]]):
        tot = pre_tot + sum((vecs[split + i][r] for i, r in enumerate(rest)), np.zeros_like(pre_tot[0]))
        mask = pre_mask | np.bitwise_or.reduce(np.array([masks[split + i][r] for i, r in enumerate(rest)] or [0]))
        obj = np.zeros(len(tot), dtype=np.int64)
        for name, idx in phases:
            obj += it.weights[name] * tot[:, idx, :].max(axis=(1, 2))
        for bit in range(len(phase_names)):
            obj += np.where((mask >> bit) & 1, lat[bit], 0)
        obj = np.where(tot[:, MEMORY, :].max(axis=1) <= it.capacity_mb, obj, np.iinfo(np.int64).max)
        i = int(np.argmin(obj))
        if obj[i] < np.iinfo(np.int64).max and (best is None or obj[i] < best[0]):
            best = (int(obj[i]), (*pre_idx[i].tolist(), *rest))
    if best is None:
        return None
    rows = [(o, loc, 1) for t, ci in enumerate(best[1]) for o, locs in [per_table[t][ci]] for loc in locs]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return best[0], ShardArrays(arr[:, 0], arr[:, 1], arr[:, 2])
