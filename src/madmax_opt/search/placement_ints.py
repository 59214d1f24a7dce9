"""The placement instance in integers (search/placement.py): every coefficient rounded once (time to 1 ns, memory
up to 1 MB), and the integer objective of a placement, the arithmetic CP-SAT optimises."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from madmax_opt.core.numeric import IntArr
from madmax_opt.core.units import MB, NS
from madmax_opt.model.dlrm import Layout
from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_LANES,
    LOOKUPS,
    TERM_INDEX,
    EmbeddingOptions,
    ShardArrays,
    collective_maxima,
    collectives_used,
    per_gpu_terms,
)

MEMORY = TERM_INDEX["memory"]


@dataclass(frozen=True)
class IntTables:
    """The placement instance in integers: coefficients (options, terms, 3), latencies, weights, capacity."""

    opts: EmbeddingOptions
    coef: IntArr
    latency: dict[str, int]
    weights: dict[str, int]
    capacity_mb: int  # per GPU, for embeddings (HBM minus reserve minus the dense part)
    layout: Layout


def int_tables(opts: EmbeddingOptions, lay: Layout, weights: dict[str, int], capacity_bytes: float) -> IntTables:
    """Round every coefficient once: times to the nearest ns, memory up to whole MB (so an integer-feasible plan
    is feasible in bytes); capacity down to whole MB."""
    seconds = opts.coef.copy()
    seconds[:, MEMORY, :] = 0.0  # bytes: rounded separately (bytes x 1e9 would overflow int64)
    coef = np.rint(seconds * NS).astype(np.int64)
    coef[:, MEMORY, :] = np.ceil(opts.coef[:, MEMORY, :] / MB - 1e-9).astype(np.int64)
    latency = {c: round(v * NS) for c, v in opts.latency_s.items()}
    return IntTables(opts, coef, latency, weights, int(np.floor(capacity_bytes / MB)), lay)


def int_objective(it: IntTables, shards: ShardArrays) -> tuple[int, bool]:
    """(integer objective in ns, memory-feasible) of a placement: the same arithmetic CP-SAT optimises."""
    totals = per_gpu_terms(it.coef, it.opts.options, shards, it.layout)
    mx = collective_maxima(totals)
    used = collectives_used(it.opts.options, shards)
    obj = sum(it.weights[k] * int(mx[k]) for k in LOOKUPS)
    obj += sum(it.weights[c] * (int(mx[c]) + (it.latency[c] if c in used else 0)) for c in COLLECTIVE_LANES)
    return obj, bool(totals[MEMORY].max() <= it.capacity_mb)
