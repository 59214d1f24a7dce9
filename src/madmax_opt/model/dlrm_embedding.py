"""DLRM embeddings: shard options (table-wise, column-wise, table-row-wise, row-wise, data-parallel) as per-GPU
coefficients of lookup time, memory and each collective lane; their exact evaluation and a plan's shards.

Forward = input (ids) all-to-all, lookup + pooling, pooled-output all-to-all; backward = gradient all-to-all, fused
gradient + rowwise-Adagrad update (one fp32 state per row). Lookups stream rows at ``hbm_eff x HBM bandwidth`` (used
as the random-access row-gather efficiency too), every lookup counted as a distinct row (an upper bound)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from numpy.typing import NDArray
from typing_extensions import NotRequired

from madmax_opt.core.errors import ProblemError
from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.model.collectives import all_reduce_s, all_to_all_s, reduce_scatter_s
from madmax_opt.model.dlrm import Layout
from madmax_opt.model.dlrm_spec import (
    LENGTH_BYTES,
    ROWWISE_STATE_BYTES,
    SHARDINGS,
    DLRMModel,
    DLRMTask,
    ShardEntry,
    TableGroup,
)

# =============================================================================== embedding coefficients

A2A_LANES: tuple[str, ...] = ("send_intra", "send_inter", "recv_intra", "recv_inter")
COLLECTIVE_LANES: dict[str, tuple[str, ...]] = {
    "tw_in": A2A_LANES,
    "tw_out": A2A_LANES,
    "cw_in": A2A_LANES,
    "cw_out": A2A_LANES,
    "twrw_in": A2A_LANES,
    "twrw_out_intra": ("send_intra", "recv_intra"),  # intra-node reduce-scatter of the partial pooled sums
    "twrw_out_inter": ("send_inter", "recv_inter"),  # then a rail-aligned all-to-all across nodes
    "rw_in": ("time",),  # balanced collectives: one per-GPU time from collectives.*
    "rw_out": ("time",),
    "dp_allreduce": ("time",),
}
INPUT_COLLECTIVES: tuple[str, ...] = ("tw_in", "cw_in", "twrw_in", "rw_in")
OUTPUT_COLLECTIVES: tuple[str, ...] = ("tw_out", "cw_out", "twrw_out_intra", "twrw_out_inter", "rw_out")
LOOKUPS: tuple[str, ...] = ("lookup_fwd", "lookup_bwd")
COLLECTIVE_KIND: dict[str, str] = {
    "tw_in": "table_wise", "tw_out": "table_wise", "cw_in": "column_wise", "cw_out": "column_wise",
    "twrw_in": "table_row_wise", "twrw_out_intra": "table_row_wise", "twrw_out_inter": "table_row_wise",
    "rw_in": "row_wise", "rw_out": "row_wise", "dp_allreduce": "data_parallel",
}
TERMS: tuple[str, ...] = (
    *LOOKUPS, "memory", *(f"{c}.{lane}" for c, lanes in COLLECTIVE_LANES.items() for lane in lanes)
)
TERM_INDEX: dict[str, int] = {t: i for i, t in enumerate(TERMS)}
SELF, NODE, REMOTE = 0, 1, 2  # a GPU's relation to a shard's location: owner, same node, another node
LOCATED: dict[str, str] = {"table_wise": "gpu", "column_wise": "gpu", "table_row_wise": "node",
                           "row_wise": "global", "data_parallel": "global"}


@dataclass(frozen=True)
class ShardOption:
    """One way to hold a table of group ``group``; column_wise has ``split`` shards of dim/split columns."""

    group: int
    sharding: str
    split: int = 1

    @property
    def located(self) -> str:
        return LOCATED[self.sharding]


@dataclass(frozen=True)
class EmbeddingOptions:
    """Per option, term and relation (owner / same node / other node): seconds (lookups, lanes) or bytes (memory).

    ``coef[o, t, r]`` is what one shard of option ``o`` adds to term ``t`` of a GPU in relation ``r`` to the
    shard's location (table_row_wise: every GPU of the node counts as SELF and NODE; row_wise and
    data_parallel: every GPU gets the same). ``latency_s`` is the fixed cost of each collective when used.
    """

    options: tuple[ShardOption, ...]
    coef: Arr  # (options, terms, 3)
    latency_s: dict[str, float]
    counts: tuple[int, ...]  # tables per group

    def index(self, group: int, sharding: str, split: int = 1) -> int | None:
        for i, o in enumerate(self.options):
            if (o.group, o.sharding, o.split) == (group, sharding, split):
                return i
        return None


def _lanes(out: dict[tuple[str, int], float], prefix: str, rel: int, **lanes: float) -> None:
    for lane, value in lanes.items():
        out[(f"{prefix}.{lane}", rel)] = out.get((f"{prefix}.{lane}", rel), 0.0) + value


def shard_coefficients(t: TableGroup, sharding: str, split: int, task: DLRMTask, lay: Layout) -> Arr:
    """The (terms, 3) coefficients of one shard of a ``t`` table held as ``sharding`` (TorchRec semantics)."""
    B = float(task.global_batch)
    N, G, M = float(lay.gpus), float(lay.node), float(lay.nodes)
    b = B / N  # samples per GPU
    e, P, x, ln = float(t.elem_bytes), float(t.pooling), float(task.index_bytes), float(LENGTH_BYTES)
    R, d = float(t.rows), float(t.dim)
    hbm, w0, w1 = lay.hbm_bw, lay.intra_bw, lay.inter_bw
    st = float(ROWWISE_STATE_BYTES)
    train = task.kind == "train"
    st_mem = st if train else 0.0  # optimizer state and gradient buffers exist only in training
    bufs = 2.0 if train else 1.0  # pooled output (+ its gradient)
    v: dict[tuple[str, int], float] = {}
    if sharding in ("table_wise", "column_wise"):
        ds = d / split
        # fwd: gather B*P rows of ds*e bytes (+ their ids), write B pooled rows; bwd: read pooled grads, read +
        # write each row and its rowwise-Adagrad state (FBGEMM fused backward-optimizer)
        v[("lookup_fwd", SELF)] = B * (P * (ds * e + x) + ds * e) / hbm
        v[("lookup_bwd", SELF)] = B * (P * (2 * ds * e + 2 * st + x) + ds * e) / hbm
        v[("memory", SELF)] = R * (ds * e + st_mem) + bufs * B * ds * e + B * P * x  # rows (+ state), out, ids
        ids = b * (P * x + ln)  # one GPU's ids (+ lengths) of this table
        pooled = b * ds * e  # one GPU's pooled output of this shard
        c = "tw" if sharding == "table_wise" else "cw"
        _lanes(v, f"{c}_in", SELF, recv_intra=(G - 1) * ids / w0, recv_inter=(N - G) * ids / w1)
        _lanes(v, f"{c}_in", NODE, send_intra=ids / w0)
        _lanes(v, f"{c}_in", REMOTE, send_inter=ids / w1)
        _lanes(v, f"{c}_out", SELF, send_intra=(G - 1) * pooled / w0, send_inter=(N - G) * pooled / w1)
        _lanes(v, f"{c}_out", NODE, recv_intra=pooled / w0)
        _lanes(v, f"{c}_out", REMOTE, recv_inter=pooled / w1)
    elif sharding == "table_row_wise":  # rows split over the G GPUs of one node
        for rel in (SELF, NODE):
            v[("lookup_fwd", rel)] = B * (P * (d * e + x) / G + d * e) / hbm
            v[("lookup_bwd", rel)] = B * (P * (2 * d * e + 2 * st + x) / G + d * e) / hbm
            v[("memory", rel)] = R / G * (d * e + st_mem) + bufs * B * d * e + B * P * x / G
            per_src = b * (P * x / G + ln)  # what each GPU sends to one GPU of the node
            _lanes(v, "twrw_in", rel, send_intra=(G - 1) * per_src / w0, recv_intra=(G - 1) * per_src / w0,
                   recv_inter=(N - G) * per_src / w1)
            rs = (G - 1) * (B / G) * d * e / w0  # reduce-scatter of B partial pooled rows inside the node
            _lanes(v, "twrw_out_intra", rel, send_intra=rs, recv_intra=rs)
            _lanes(v, "twrw_out_inter", rel, send_inter=(M - 1) * b * d * e / w1)
        _lanes(v, "twrw_in", REMOTE, send_inter=G * b * (P * x / G + ln) / w1)
        _lanes(v, "twrw_out_inter", REMOTE, recv_inter=b * d * e / w1)
    elif sharding == "row_wise":  # rows split over all N GPUs; outputs reduce-scattered
        one = np.ones(1)
        a2a = all_to_all_s(one * b * (P * x + N * ln), one * N, one, lay.tiers) - all_to_all_s(0 * one, one * N, one,
                                                                                                 lay.tiers)
        rs_all = reduce_scatter_s(one * B * d * e, one * N, one, lay.tiers) - reduce_scatter_s(0 * one, one * N,
                                                                                              one, lay.tiers)
        for rel in (SELF, NODE, REMOTE):
            v[("lookup_fwd", rel)] = B * (P * (d * e + x) / N + d * e) / hbm
            v[("lookup_bwd", rel)] = B * (P * (2 * d * e + 2 * st + x) / N + d * e) / hbm
            v[("memory", rel)] = R / N * (d * e + st_mem) + bufs * B * d * e + B * P * x / N
            v[("rw_in.time", rel)] = float(a2a[0])
            v[("rw_out.time", rel)] = float(rs_all[0])
    elif sharding == "data_parallel":  # a replica everywhere; dense gradient all-reduced, whole table updated
        one = np.ones(1)
        ar = all_reduce_s(one * R * d * e, one * N, one, lay.tiers) - all_reduce_s(0 * one, one * N, one, lay.tiers)
        for rel in (SELF, NODE, REMOTE):
            v[("lookup_fwd", rel)] = b * (P * (d * e + x) + d * e) / hbm
            # zero the dense grad, scatter-add b*P rows, then read grad + read/write rows and state of every row
            v[("lookup_bwd", rel)] = (R * (4 * d * e + 2 * st) + b * P * (d * e + x)) / hbm
            v[("memory", rel)] = R * (d * e + st_mem) + (R * d * e if train else 0.0) + bufs * b * d * e + b * P * x
            v[("dp_allreduce.time", rel)] = float(ar[0])
    else:
        raise ValueError(f"unknown sharding {sharding!r}")
    out = np.zeros((len(TERMS), 3))
    for (term, rel), value in v.items():
        out[TERM_INDEX[term], rel] = value
    return out


def collective_latency_s(lay: Layout) -> dict[str, float]:
    """Fixed cost of each embedding collective when it runs (the tiers it crosses; collectives.* alpha terms)."""
    one = np.ones(1)
    n = one * lay.gpus
    a2a = float(all_to_all_s(0 * one, n, one, lay.tiers)[0])
    rs = float(reduce_scatter_s(0 * one, n, one, lay.tiers)[0])
    ar = float(all_reduce_s(0 * one, n, one, lay.tiers)[0])
    intra = lay.option.system.tiers[0].latency_s if lay.node > 1 else 0.0
    inter = lay.option.system.tiers[-1].latency_s if lay.nodes > 1 else 0.0
    out = {c: a2a for c in ("tw_in", "tw_out", "cw_in", "cw_out", "twrw_in", "rw_in")}
    out.update(twrw_out_intra=intra, twrw_out_inter=inter, rw_out=rs, dp_allreduce=ar)
    return out


def embedding_options(
    model: DLRMModel,
    task: DLRMTask,
    lay: Layout,
    shardings: tuple[str, ...] = SHARDINGS,
    splits: tuple[int, ...] = (2, 4),
    capacity_bytes: float | None = None,
) -> EmbeddingOptions:
    """Every allowed way to hold each group's tables, with coefficients. With ``capacity_bytes``, options whose one
    shard alone exceeds it are dropped (they cannot be in any feasible plan). Column-wise splits must divide the
    dim; table_row_wise needs more than one node (on one node it is row_wise)."""
    opts: list[ShardOption] = []
    coefs: list[Arr] = []
    for j, t in enumerate(model.tables):
        kinds: list[tuple[str, int]] = []
        for s in shardings:
            if s == "column_wise":
                kinds += [(s, k) for k in splits if t.dim % k == 0 and k <= lay.gpus]
            elif s == "table_row_wise":
                if lay.nodes > 1 and lay.node > 1:
                    kinds.append((s, 1))
            elif s == "row_wise":
                if lay.gpus > 1:
                    kinds.append((s, 1))
            else:
                kinds.append((s, 1))
        for s, k in kinds:
            c = shard_coefficients(t, s, k, task, lay)
            if capacity_bytes is not None and c[TERM_INDEX["memory"]].max() > capacity_bytes:
                continue
            opts.append(ShardOption(j, s, k))
            coefs.append(c)
    coef = np.stack(coefs) if coefs else np.zeros((0, len(TERMS), 3))
    return EmbeddingOptions(tuple(opts), coef, collective_latency_s(lay), tuple(t.count for t in model.tables))


# ================================================================================ embedding evaluation


@dataclass(frozen=True)
class ShardArrays:
    """A concrete placement: one row per shard kind and location, ``count`` shards of option ``option`` at
    ``location`` (a GPU for gpu-located options, a node for table_row_wise, -1 for global ones)."""

    option: IntArr
    location: IntArr
    count: IntArr


def per_gpu_terms(coef: NDArray[Any], options: tuple[ShardOption, ...], shards: ShardArrays, lay: Layout) -> Any:
    """(terms, N) totals of ``coef`` (floats or rounded integers) over the shards of a placement.

    GPU g gets, from each shard at location L: coef[SELF] if g owns it, coef[NODE] if g shares L's node, else
    coef[REMOTE]; computed per node with sums so that it is linear in the shard counts (the CP-SAT form).
    """
    n, g_, m = lay.gpus, lay.node, lay.nodes
    dtype = coef.dtype
    out = np.zeros((len(TERMS), n), dtype=dtype)
    if len(shards.option) == 0:
        return out
    located = np.array([options[int(o)].located for o in shards.option])
    cnt = shards.count.astype(dtype)
    c = coef[shards.option] * cnt[:, None, None]  # (shards, terms, 3)
    node_of = np.arange(n) // g_
    gpu = located == "gpu"
    if gpu.any():
        loc = shards.location[gpu]
        cg = c[gpu]
        own_self = np.zeros((len(TERMS), n), dtype=dtype)
        own_node = np.zeros((len(TERMS), n), dtype=dtype)
        np.add.at(own_self.T, loc, cg[:, :, SELF])
        np.add.at(own_node.T, loc, cg[:, :, NODE])
        node_same = np.zeros((len(TERMS), m), dtype=dtype)
        node_remote = np.zeros((len(TERMS), m), dtype=dtype)
        np.add.at(node_same.T, loc // g_, cg[:, :, NODE])
        np.add.at(node_remote.T, loc // g_, cg[:, :, REMOTE])
        total_remote = cg[:, :, REMOTE].sum(axis=0)
        out += own_self + node_same[:, node_of] - own_node + total_remote[:, None] - node_remote[:, node_of]
    nd = located == "node"
    if nd.any():
        cn = c[nd]
        node_same = np.zeros((len(TERMS), m), dtype=dtype)
        node_remote = np.zeros((len(TERMS), m), dtype=dtype)
        np.add.at(node_same.T, shards.location[nd], cn[:, :, NODE])
        np.add.at(node_remote.T, shards.location[nd], cn[:, :, REMOTE])
        out += node_same[:, node_of] + cn[:, :, REMOTE].sum(axis=0)[:, None] - node_remote[:, node_of]
    gl = located == "global"
    if gl.any():
        out += c[gl][:, :, SELF].sum(axis=0)[:, None]
    return out


def collectives_used(options: tuple[ShardOption, ...], shards: ShardArrays) -> set[str]:
    kinds = {options[int(o)].sharding for o, k in zip(shards.option, shards.count, strict=True) if k > 0}
    return {c for c, kind in COLLECTIVE_KIND.items() if kind in kinds}


def collective_maxima(totals: NDArray[Any]) -> dict[str, Any]:
    """Busiest GPU lane of each collective and the busiest GPU of each lookup phase (floats or integers)."""
    out: dict[str, Any] = {k: totals[TERM_INDEX[k]].max() for k in LOOKUPS}
    for c, lanes in COLLECTIVE_LANES.items():
        out[c] = max(totals[TERM_INDEX[f"{c}.{lane}"]].max() for lane in lanes)
    return out


def phase_weights(task: DLRMTask) -> dict[str, int]:
    """How often each lookup phase and collective runs per step: outputs twice in training (the gradient
    all-to-all is the transpose: same bytes per lane), inputs once; inference runs forward only."""
    train = task.kind == "train"
    w = {"lookup_fwd": 1, "lookup_bwd": int(train), "dp_allreduce": int(train)}
    w.update({c: 1 for c in INPUT_COLLECTIVES})
    w.update({c: 2 if train else 1 for c in OUTPUT_COLLECTIVES})
    return w


@dataclass(frozen=True)
class EmbeddingTimes:
    """The embedding part of one step for a concrete placement (exact floats)."""

    lookup_fwd_s: float
    lookup_bwd_s: float
    input_s: float  # id all-to-alls (one per sharding type used), forward only
    output_s: float  # pooled-embedding all-to-alls / reduce-scatters, forward (the backward is the same again)
    dp_allreduce_s: float  # gradient all-reduce of the data-parallel tables
    per_collective_s: dict[str, float]
    memory_bytes: Arr  # per GPU
    totals: Arr  # (terms, N)


def embedding_times(opts: EmbeddingOptions, shards: ShardArrays, lay: Layout) -> EmbeddingTimes:
    totals = per_gpu_terms(opts.coef, opts.options, shards, lay)
    mx = collective_maxima(totals)
    used = collectives_used(opts.options, shards)
    per = {c: float(mx[c]) + (opts.latency_s[c] if c in used else 0.0) for c in COLLECTIVE_LANES}
    return EmbeddingTimes(
        lookup_fwd_s=float(mx["lookup_fwd"]),
        lookup_bwd_s=float(mx["lookup_bwd"]),
        input_s=sum(per[c] for c in INPUT_COLLECTIVES),
        output_s=sum(per[c] for c in OUTPUT_COLLECTIVES),
        dp_allreduce_s=per["dp_allreduce"],
        per_collective_s=per,
        memory_bytes=totals[TERM_INDEX["memory"]],
        totals=totals,
    )


def placement_objective_s(times: EmbeddingTimes, task: DLRMTask) -> float:
    """The placement objective: sum over lookup phases and collectives of weight x (busiest GPU [+ latency])."""
    w = phase_weights(task)
    return (w["lookup_fwd"] * times.lookup_fwd_s + w["lookup_bwd"] * times.lookup_bwd_s
            + sum(w[c] * times.per_collective_s[c] for c in COLLECTIVE_LANES))


def shards_from_plan(entries: list[ShardEntry], model: DLRMModel, opts: EmbeddingOptions, lay: Layout,
                     *, file: str | None = None, field: str = "placement") -> ShardArrays:
    """Check a plan's placement (counts, GPUs, nodes) and turn it into shard rows (column shards one row each)."""
    names = {t.name: j for j, t in enumerate(model.tables)}
    seen = [0] * len(model.tables)
    rows: list[tuple[int, int, int]] = []
    for i, s in enumerate(entries):
        where = f"{field}[{i}]"
        if s.group not in names:
            raise ProblemError(f"unknown table group {s.group!r}; allowed: {', '.join(names)}", file=file,
                               field=f"{where}.group")
        j = names[s.group]
        seen[j] += s.count
        split = len(s.gpus) if s.sharding == "column_wise" and s.gpus else 1
        o = opts.index(j, s.sharding, split)
        if o is None:
            allowed = sorted({f"{opts.options[k].sharding}" + (f"/{opts.options[k].split}" if opts.options[k].split
                              > 1 else "") for k in range(len(opts.options)) if opts.options[k].group == j})
            raise ProblemError(f"{s.sharding} (split {split}) is not possible here; allowed: {', '.join(allowed)}",
                               file=file, field=f"{where}.sharding")
        if s.gpus is not None:
            bad = [g for g in s.gpus if g >= lay.gpus]
            if bad:
                raise ProblemError(f"GPU {bad[0]} does not exist; allowed: 0..{lay.gpus - 1}", file=file,
                                   field=f"{where}.gpus")
            rows.extend((o, g, s.count) for g in s.gpus)
        elif s.node is not None:
            if s.node >= lay.nodes:
                raise ProblemError(f"node {s.node} does not exist; allowed: 0..{lay.nodes - 1}", file=file,
                                   field=f"{where}.node")
            rows.append((o, s.node, s.count))
        else:
            rows.append((o, -1, s.count))
    for j, t in enumerate(model.tables):
        if seen[j] != t.count:
            raise ProblemError(f"group {t.name!r} has {t.count} tables but the placement holds {seen[j]}",
                               file=file, field=field)
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return ShardArrays(arr[:, 0], arr[:, 1], arr[:, 2])


class ShardEntryJSON(TypedDict):
    """A plan file's placement entry (model/dlrm_spec.ShardEntry) as records write it: only the keys it has."""

    group: str
    count: int
    sharding: str
    gpus: NotRequired[list[int]]  # table_wise, column_wise
    node: NotRequired[int]  # table_row_wise


def compact_placement(shards: ShardArrays, opts: EmbeddingOptions, model: DLRMModel) -> list[ShardEntryJSON]:
    """Shard rows back to plan entries (column shards of one table regrouped; equal entries merged)."""
    merged: dict[tuple[int, str, tuple[int, ...], int], int] = {}
    cw: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for o, loc, k in zip(shards.option.tolist(), shards.location.tolist(), shards.count.tolist(), strict=True):
        opt = opts.options[o]
        if opt.sharding == "column_wise":
            cw.setdefault((opt.group, opt.split), []).extend([(loc, 1)] * k)
            continue
        key: tuple[int, str, tuple[int, ...], int] = (opt.group, opt.sharding,
                                                       (loc,) if opt.located != "global" else (), 1)
        merged[key] = merged.get(key, 0) + k
    for (grp, split), locs in cw.items():  # deal the shards out table by table (costs are per shard)
        gpus = sorted(g for g, _ in locs)
        for t in range(len(gpus) // split):
            key = (grp, "column_wise", tuple(gpus[t::len(gpus) // split]), split)
            merged[key] = merged.get(key, 0) + 1
    out = []
    for (grp, sharding, loc, _), k in sorted(merged.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        entry: ShardEntryJSON = {"group": model.tables[grp].name, "count": k, "sharding": sharding}
        if LOCATED[sharding] == "gpu":
            entry["gpus"] = list(loc)
        elif LOCATED[sharding] == "node":
            entry["node"] = loc[0]
        out.append(entry)
    return out
