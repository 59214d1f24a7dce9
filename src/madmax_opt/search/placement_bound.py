"""A valid lower bound on the integer placement objective (search/placement.py), in integers and numpy: when it
reaches the greedy plan's objective, that plan is optimal and no CP-SAT model is needed; and the size of the
CP-SAT model that would have been built (reported with every placement result).

The bound averages every busiest-GPU maximum over the GPUs. Each shard of option o adds the same amount
``total[o, t]`` to the sum over all N GPUs of term t wherever it is placed (owner c_self, node-mates c_node,
others c_remote: c_self + (G-1) c_node + (N-G) c_remote for a GPU-located shard; G c_node + (N-G) c_remote for a
node-located one; N c_self for a global one; model/dlrm_embedding.per_gpu_terms). So, for any placement,

  busiest lane of phase p >= sum over GPUs of lane l(p) / N   (one lane l(p) of each phase, any choice is valid)
  objective >= sum_c w_c lat_c [kind of c used] + ceil(sum_tables cost(option of the table) / N),
  cost(o) = shards per table x sum_p w_p total[o, l(p)],

and for the set S of shardings a placement uses, every table's cost is at least the cheapest option of S for its
group. The bound is the minimum over every non-empty S of the latencies S pays plus those cheapest costs: exact
when the greedy plan loads every GPU alike (identical tables dealt evenly) and table-wise is the cheapest option."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import IntArr
from madmax_opt.model.dlrm import Layout
from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_KIND,
    COLLECTIVE_LANES,
    LOOKUPS,
    TERM_INDEX,
    TERMS,
    ShardArrays,
    ShardOption,
    per_gpu_terms,
)
from madmax_opt.search.placement_ints import MEMORY, IntTables


def term_totals(coef: NDArray[Any], options: tuple[ShardOption, ...], layout: Layout) -> NDArray[Any]:
    """(options, terms): what one shard of each option adds to the sum of each term over all GPUs (in ``coef``'s
    dtype: the integer model's, or the float seconds and bytes of model/dlrm_embedding)."""
    out = np.zeros((len(options), len(TERMS)), dtype=coef.dtype)
    for o, opt in enumerate(options):  # one shard at location 0, summed over the GPUs (per_gpu_terms)
        one = ShardArrays(np.array([o]), np.array([0 if opt.located != "global" else -1]), np.array([1]))
        out[o] = per_gpu_terms(coef, options, one, layout).sum(axis=1)
    return out


def _lanes(totals: IntArr, greedy_loads: IntArr | None) -> dict[str, int]:
    """One term per phase: the busiest lane of the greedy plan where it uses the phase, else the lane with the
    largest total over the options (any choice gives a valid bound; these make it tight for an even plan)."""
    out: dict[str, int] = {}
    for phase in (*LOOKUPS, *COLLECTIVE_LANES):
        lanes = [phase] if phase in LOOKUPS else [f"{phase}.{ln}" for ln in COLLECTIVE_LANES[phase]]
        idx = [TERM_INDEX[t] for t in lanes]
        if greedy_loads is not None and greedy_loads[idx].max() > 0:
            out[phase] = idx[int(np.argmax(greedy_loads[idx].max(axis=1)))]
        else:
            out[phase] = idx[int(np.argmax(totals[:, idx].sum(axis=0)))]
    return out


def table_shards(options: tuple[ShardOption, ...]) -> IntArr:
    """Shards per table of each option: its split where GPU-located (column shards), else 1."""
    return np.array([o.split if o.located == "gpu" else 1 for o in options], dtype=np.int64)


def cheapest_sums(options: tuple[ShardOption, ...], counts: tuple[int, ...],
                  cost: NDArray[Any]) -> Iterator[tuple[tuple[str, ...], NDArray[Any]]]:
    """Per set U of the options' shardings that holds every group (each group has an option of U): U and the sum
    over tables of the least ``cost`` (per table, (options, ...)) among U's options of the table's group."""
    kind = np.array([o.sharding for o in options])
    members = [np.flatnonzero([o.group == j for o in options]) for j in range(len(counts))]
    kinds = sorted({o.sharding for o in options})
    tables = np.asarray(counts, dtype=cost.dtype)
    for r in range(1, len(kinds) + 1):
        for used in combinations(kinds, r):
            in_u = np.isin(kind, used)
            if all(in_u[m].any() for m in members):
                yield used, np.tensordot(tables, np.stack([cost[m[in_u[m]]].min(axis=0) for m in members]), axes=1)


def lower_bound(it: IntTables, greedy: ShardArrays | None = None) -> int:
    """A lower bound (ns) on the integer objective of every placement (memory ignored: still a lower bound)."""
    opts, n = it.opts, it.layout.gpus
    if not opts.options:
        return 0
    totals = term_totals(it.coef, opts.options, it.layout)
    loads = per_gpu_terms(it.coef, opts.options, greedy, it.layout) if greedy is not None else None
    lane = _lanes(totals, loads)
    per_shard = sum(it.weights[p] * totals[:, t] for p, t in lane.items())  # (options,) integers
    cost = per_shard * table_shards(opts.options)  # per table of each option
    best: int | None = None
    for used, lin in cheapest_sums(opts.options, opts.counts, cost):
        lat = sum(it.weights[c] * it.latency[c] for c in COLLECTIVE_LANES if COLLECTIVE_KIND[c] in used)
        value = lat + -(-int(lin) // n)  # ceil(lin / n): the objective is an integer
        best = value if best is None else min(best, value)
    return 0 if best is None else best


def model_variables(it: IntTables) -> int:
    """The number of variables of ``PlacementModel(it)`` without building it (tests/test_placement.py checks the
    count against the built model): per option its table count, per GPU-located option a count per GPU and a sum
    per node, per node-located option a count per node; a max per weighted phase with coefficients, a used flag
    per collective with latency, weight and members; a shared sum per (term, node) and per term with 2+ terms."""
    opts, lay = it.opts, it.layout
    n, m = lay.gpus, lay.nodes
    count = 0
    for opt in opts.options:
        count += 1 + (n + m if opt.located == "gpu" else m if opt.located == "node" else 0)
    terms = [MEMORY]
    for phase in (*LOOKUPS, *COLLECTIVE_LANES):
        lanes = [phase] if phase in LOOKUPS else [f"{phase}.{ln}" for ln in COLLECTIVE_LANES[phase]]
        idx = [TERM_INDEX[t] for t in lanes if it.coef[:, TERM_INDEX[t]].any()]
        if idx and it.weights[phase]:
            count += 1
            terms += idx
    for phase, lat in it.latency.items():
        if lat and it.weights[phase] and any(o.sharding == COLLECTIVE_KIND[phase] for o in opts.options):
            count += 1
    for t in set(terms):  # (c_self, c_node, c_remote) per option, Python ints (PlacementModel._coefs_of)
        cs, cn, cr = ([int(v) for v in it.coef[:, t, r]] for r in range(3))
        nz = [a != 0 or b != 0 or c != 0 for a, b, c in zip(cs, cn, cr, strict=True)]
        node_terms = sum(nz[o] and opt.located != "global" and cn[o] != cr[o] for o, opt in enumerate(opts.options))
        glob_terms = sum(nz[o] and (cs[o] if opt.located == "global" else cr[o]) != 0
                         for o, opt in enumerate(opts.options))
        count += m * (node_terms > 1) + (glob_terms > 1)
    return count
