"""A better first hint than the greedy plan for groups of many identical tables (search/placement.py).

When a group's count is not a multiple of the GPU count, greedy table-wise leaves ``count mod N`` GPUs one table
heavier; those extra tables may be cheaper held another way (DLRM-I, 512 tables on 96 GPUs: 32 GPUs hold 6
tables and 64 hold 5, where 32 tables row-sharded inside the nodes beat the sixth table on a GPU). For every such
group and every option of it that is not held on single GPUs (table-row-wise, row-wise, data-parallel), the
candidate moves the group's ``count mod N`` extra tables to that option, dealt evenly (table-row-wise: one more on
the first nodes), and places the rest with greedy. The
best candidate that fits memory and beats greedy is CP-SAT's first hint and incumbent (CP-SAT still proves the
optimum; a candidate only changes where the search starts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from madmax_opt.model.dlrm_embedding import ShardArrays
from madmax_opt.search.placement_ints import IntTables, int_objective


def improved_hint(it: IntTables, greedy_obj: int,
                  place: Callable[[IntTables], ShardArrays | None]) -> tuple[int, ShardArrays] | None:
    """(objective, plan) of the best candidate below ``greedy_obj``, or None; ``place`` is greedy_placement."""
    opts, lay = it.opts, it.layout
    best: tuple[int, ShardArrays] | None = None
    for j, count in enumerate(opts.counts):
        extra = count % lay.gpus
        if count <= lay.gpus or extra == 0:
            continue  # a group that greedy deals evenly, or fewer tables than GPUs (heterogeneous instances)
        counts = tuple(c - extra if k == j else c for k, c in enumerate(opts.counts))
        rest = place(replace(it, opts=replace(opts, counts=counts)))
        if rest is None:
            continue
        for o, opt in enumerate(opts.options):
            if opt.group != j or opt.located == "gpu":
                continue
            if opt.located == "node":
                per_node = [extra // lay.nodes + (k < extra % lay.nodes) for k in range(lay.nodes)]
                rows = [(o, k, n) for k, n in enumerate(per_node) if n]
            else:
                rows = [(o, -1, extra)]
            add = np.array(rows, dtype=np.int64).reshape(-1, 3)
            shards = ShardArrays(np.concatenate([rest.option, add[:, 0]]),
                                 np.concatenate([rest.location, add[:, 1]]),
                                 np.concatenate([rest.count, add[:, 2]]))
            obj, fits = int_objective(it, shards)
            if fits and obj < greedy_obj and (best is None or obj < best[0]):
                best = (obj, shards)
    return best
