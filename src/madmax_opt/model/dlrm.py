"""DLRM recommendation models (``family: dlrm``): spec, problem files, lowering and the cost model.

The cost model has two halves that meet in ``step_terms``:

- **Embeddings** (memory- and network-bound): every way of holding one table (a *shard option*: table-wise on a GPU,
  column-wise shards on GPUs, table-row-wise on a node, row-wise over all GPUs, data-parallel replicas) adds a fixed
  amount to per-GPU *terms* (lookup time, memory, and each lane of each collective) depending only on whether a GPU
  is the shard's owner, in the owner's node, or elsewhere. Those coefficients (``embedding_options``) are the
  single source of truth: the exact evaluator sums them in floats (``per_gpu_terms``, ``embedding_times``), the CP-SAT placement
  (``placement.py``) rounds them once to integers. A collective takes as long as its busiest GPU lane, so the
  embedding time is a sum of maxima over GPUs.
- **Dense** part (bottom/top MLPs, interaction, optional transformer block and MoE top MLP) as GEMMs timed by
  ``compute.gemm_time_s``, with DDP / FSDP / tensor-parallel (node) gradient and weight collectives from
  ``collectives``; vectorised over dense plans (``dense_terms``).

Embedding sharding as in TorchRec (EmbeddingShardingPlanner types) with FBGEMM's fused table-batched embedding
kernels (TBE): forward = input (ids) all-to-all, lookup + pooling, pooled-output all-to-all; backward = gradient
all-to-all, fused gradient + rowwise-Adagrad update (one fp32 state per row). Lookups stream rows at the GPU's
``hbm_eff x HBM bandwidth``; we use ``hbm_eff`` as the random-access row-gather efficiency too (no separate
measurement), and count every lookup as a distinct row (an upper bound: duplicate ids in a batch are not merged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.collectives import Tiers, all_gather_s, all_reduce_s, all_to_all_s, reduce_scatter_s
from madmax_opt.model.compute import gemm_time_s, memory_bound_time_s
from madmax_opt.model.hardware import HardwareOption, HardwareTable
from madmax_opt.model.objectives import ObjectiveName
from madmax_opt.model.spec import GPU, Strict

Arr = NDArray[np.float64]
IntArr = NDArray[np.int64]

EmbPrecision = Literal["fp32", "fp16", "bf16", "int8"]
EMB_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
DensePrecision = Literal["fp32", "bf16", "fp16"]
Sharding = Literal["table_wise", "column_wise", "table_row_wise", "row_wise", "data_parallel"]
SHARDINGS: tuple[str, ...] = ("table_wise", "column_wise", "table_row_wise", "row_wise", "data_parallel")
DenseStrategy = Literal["ddp", "fsdp"]
DENSE_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
DLRMObjective = ObjectiveName  # the objective registry (model/objectives.py)

LENGTH_BYTES = 4  # int32 lengths of the KeyedJaggedTensor, one per sample per table per destination shard
ROWWISE_STATE_BYTES = 4  # rowwise Adagrad: one fp32 accumulator per row (FBGEMM EXACT_ROWWISE_ADAGRAD)
# Adam update, memory-bound: fp32 reads w, g, m, v (16 B) and writes w, m, v (12 B); mixed precision as training.py
ADAM_TRAFFIC_BYTES = {"fp32": 28.0, "bf16": 34.0, "fp16": 34.0}
# model state per dense parameter: fp32 w + g + Adam m, v = 16 B; mixed: 2 B weights + 4 B grads + 12 B master/m/v
DENSE_STATE_BYTES = {"fp32": 16.0, "bf16": 18.0, "fp16": 18.0}
DENSE_WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
DENSE_GRAD_BYTES = 4.0  # fp32 gradients are all-reduced (DDP default; mixed precision keeps fp32 main grads)


# ================================================================================================ spec


class TableGroup(Strict):
    """``count`` identical embedding tables (a list of different tables is a list of groups of count 1)."""

    name: str = "tables"
    count: PositiveInt = Field(1, description="identical tables in this group")
    rows: PositiveInt
    dim: PositiveInt
    pooling: PositiveFloat = Field(description="pooling factor: mean ids looked up per sample in one table")
    precision: EmbPrecision = "fp16"

    @property
    def elem_bytes(self) -> int:
        return EMB_BYTES[self.precision]


class MLP(Strict):
    layers: PositiveInt
    width: PositiveInt = Field(description="output width of every layer but the last")


class MoE(Strict):
    """Mixture of experts in the top MLP: each layer but the final logit becomes ``experts`` copies, top-k routed."""

    experts: int = Field(ge=2)
    top_k: PositiveInt

    @model_validator(mode="after")
    def _k(self) -> MoE:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts}); allowed: 1..{self.experts}")
        return self


class SequenceBlock(Strict):
    """Transformer layers over a sequence of ``seq_len`` embedding vectors per sample (between the MLPs)."""

    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    ffn: PositiveInt
    seq_len: PositiveInt

    @model_validator(mode="after")
    def _heads(self) -> SequenceBlock:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads})")
        return self


class DLRMModel(Strict):
    """A DLRM (Naumov et al. 2019): bottom MLP on dense features, embedding tables on sparse features, feature
    interaction, top MLP. Optional MoE top MLP and transformer block (MAD-Max paper variants)."""

    family: Literal["dlrm"] = "dlrm"
    name: str = "custom"
    tables: list[TableGroup] = Field(min_length=1)
    dense_features: PositiveInt
    bottom_mlp: MLP
    top_mlp: MLP
    interaction: Literal["dot", "cat"] = "dot"
    compressed_features: int | None = Field(
        None, ge=2, description="dot: project the F = tables + 1 feature vectors linearly to this many first"
    )
    dense_precision: DensePrecision = "fp32"
    top_moe: MoE | None = None
    transformer: SequenceBlock | None = None
    source: str = "inline"

    @model_validator(mode="after")
    def _shapes(self) -> DLRMModel:
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table group names must be unique, got {names}")
        dims = sorted({t.dim for t in self.tables})
        if self.interaction == "dot" and len(dims) > 1:
            raise ValueError(f"dot interaction needs one embedding dim for all tables, got {dims}; allowed: "
                             "equal dims, or interaction: cat")
        if self.compressed_features is not None and self.interaction != "dot":
            raise ValueError("compressed_features needs interaction: dot")
        return self

    @property
    def n_tables(self) -> int:
        return sum(t.count for t in self.tables)

    @property
    def embedding_params(self) -> int:
        return sum(t.count * t.rows * t.dim for t in self.tables)


class DLRMTask(Strict):
    kind: Literal["train", "inference"] = "train"
    global_batch: PositiveInt = Field(description="samples per step (all GPUs together)")
    train_samples: PositiveFloat | None = Field(None, description="samples to train on (objective time_to_train)")
    index_bytes: Literal[4, 8] = Field(8, description="bytes per sparse id (TorchRec KJT values, int64 default)")


Knob = int | list[int] | None


class DLRMSpace(Strict):
    """Restrictions of the plan space; absence leaves a knob free."""

    dense: DenseStrategy | list[DenseStrategy] | None = None
    tp: Knob = Field(None, description="tensor parallelism of the MLPs inside a node (with ddp)")
    ep: Knob = Field(None, description="expert parallelism of the MoE top MLP")
    shardings: list[Sharding] | None = Field(None, min_length=1, description="allowed embedding shardings")
    column_splits: list[int] = Field([2, 4], description="column-wise: shards per table to consider")

    @model_validator(mode="after")
    def _splits(self) -> DLRMSpace:
        if any(k < 2 for k in self.column_splits):
            raise ValueError(f"column_splits must be >= 2, got {self.column_splits}")
        return self


class DLRMStack(Strict):
    pipeline_input_dist: bool = Field(
        False, description="TorchRec TrainPipelineSparseDist: the next batch's id all-to-all runs during this step"
    )
    tf32: bool = Field(True, description="fp32 GEMMs run on TF32 tensor cores where the GPU has them")
    memory_reserve_fraction: float = Field(0.05, ge=0.0, lt=1.0)


class DLRMConstraints(Strict):
    max_gpus: PositiveInt | None = None
    max_cost_per_hour: PositiveFloat | None = None
    min_samples_per_s: PositiveFloat | None = None


class DensePlan(Strict):
    strategy: DenseStrategy = "ddp"
    tp: PositiveInt = 1
    ep: PositiveInt = 1


class ShardEntry(Strict):
    """``count`` tables of group ``group`` held the same way."""

    group: str
    count: PositiveInt = 1
    sharding: Sharding
    gpus: list[NonNegativeInt] | None = Field(
        None, description="table_wise: [gpu]; column_wise: one GPU per column shard"
    )
    node: NonNegativeInt | None = Field(None, description="table_row_wise: the node whose GPUs split the rows")

    @model_validator(mode="after")
    def _where(self) -> ShardEntry:
        s = self.sharding
        if s == "table_wise" and (self.gpus is None or len(self.gpus) != 1 or self.node is not None):
            raise ValueError("table_wise needs gpus: [one GPU] and no node")
        if s == "column_wise" and (self.gpus is None or len(self.gpus) < 2 or self.node is not None):
            raise ValueError("column_wise needs gpus: [one GPU per column shard, at least 2] and no node")
        if s == "table_row_wise" and (self.node is None or self.gpus is not None):
            raise ValueError("table_row_wise needs node and no gpus")
        if s in ("row_wise", "data_parallel") and (self.node is not None or self.gpus is not None):
            raise ValueError(f"{s} spans all GPUs: give neither gpus nor node")
        return self


class DLRMPlan(Strict):
    system: str | None = None
    gpus: PositiveInt | None = None
    dense: DensePlan = DensePlan()
    placement: list[ShardEntry] | Literal["greedy"] = Field(
        "greedy", description="per-group shard entries, or greedy (table-wise, largest first to least loaded)"
    )


# ============================================================================================ loading


# =========================================================================================== lowering


@dataclass(frozen=True)
class DenseGemm:
    """y[rows, n] = x[rows, k] @ W[k, n] with ``rows = tokens`` per sample (1 for MLP layers)."""

    name: str
    k: int
    n: int
    tokens: int
    block: Literal["bottom", "top", "local"]  # local: replicated, never tensor-parallel (projection, transformer)
    row_parallel: bool = False  # TP: second GEMM of a column/row-parallel pair
    expert: bool = False

    @property
    def flops_per_sample(self) -> int:
        return 2 * self.k * self.n * self.tokens  # one MAC per weight per row

    @property
    def params(self) -> int:
        return self.k * self.n + self.n  # weights + bias


@dataclass(frozen=True)
class DLRMWorkload:
    model: DLRMModel
    gemms: tuple[DenseGemm, ...]
    interaction_flops_per_sample: float  # batched dot products (bmm over the feature vectors)
    interaction_dim: int  # smallest bmm dimension (GEMM efficiency)
    interaction_out: int  # top-MLP input width
    attn_flops_per_sample: float  # transformer block: QK^T and AV
    act_bytes: float  # dense activation element size
    act_bytes_per_sample: float  # activations kept for the backward pass
    elementwise_bytes_per_sample: float  # forward ReLU / norm traffic
    experts: int
    top_k: int

    @property
    def dense_params(self) -> int:
        """Parameters outside the experts (counted once)."""
        return sum(g.params for g in self.gemms if not g.expert)

    @property
    def expert_params(self) -> int:
        """All experts' parameters together."""
        return sum(g.params for g in self.gemms if g.expert) * self.experts

    @property
    def params(self) -> int:
        return self.dense_params + self.expert_params + self.model.embedding_params

    @property
    def dense_fwd_flops_per_sample(self) -> float:
        gemm = sum(g.flops_per_sample * (self.top_k if g.expert else 1) for g in self.gemms)
        return gemm + self.interaction_flops_per_sample + self.attn_flops_per_sample


def _mlp(name: str, block: Literal["bottom", "top"], k_in: int, widths: list[int], expert: bool) -> list[DenseGemm]:
    out, k = [], k_in
    for i, n in enumerate(widths):
        out.append(DenseGemm(f"{name}{i}", k, n, 1, block, row_parallel=i % 2 == 1, expert=expert))
        k = n
    return out


def lower(model: DLRMModel) -> DLRMWorkload:
    """A DLRM as dense GEMMs per sample, interaction FLOPs and activation bytes (embeddings: ``embedding_options``)."""
    act = DENSE_WEIGHT_BYTES[model.dense_precision]
    dims = {t.dim for t in model.tables}
    d = next(iter(dims)) if model.interaction == "dot" else model.bottom_mlp.width
    bottom_widths = [model.bottom_mlp.width] * (model.bottom_mlp.layers - 1) + [d]
    gemms = _mlp("bottom", "bottom", model.dense_features, bottom_widths, expert=False)
    features = model.n_tables + 1  # pooled embeddings + the bottom MLP output
    local: list[DenseGemm] = []
    if model.interaction == "dot":
        c = model.compressed_features
        if c is not None:  # Z[d, c] = E[d, F] @ W[F, c] per sample: a linear compression of the feature axis
            local.append(DenseGemm("compress", features, c, d, "local"))
        f = c or features
        inter_flops = 2.0 * f * f * d  # bmm of (f x d) by (d x f); the lower triangle is kept
        inter_dim = min(f, d)
        inter_out = f * (f - 1) // 2 + d
    else:
        inter_flops, inter_dim = 0.0, 1
        inter_out = sum(t.count * t.dim for t in model.tables) + model.bottom_mlp.width
    attn, act_tf = 0.0, 0.0
    if model.transformer is not None:
        tb = model.transformer
        h, s = tb.hidden, tb.seq_len
        local.append(DenseGemm("seq_in", d, h, s, "local"))
        for i in range(tb.layers):
            local += [DenseGemm(f"seq{i}_qkv", h, 3 * h, s, "local"), DenseGemm(f"seq{i}_proj", h, h, s, "local"),
                      DenseGemm(f"seq{i}_up", h, tb.ffn, s, "local"), DenseGemm(f"seq{i}_down", tb.ffn, h, s, "local")]
        attn = tb.layers * 4.0 * s * s * h  # QK^T and AV: 2*s*h FLOPs each per token, s tokens
        # Korthikanti et al. 2022 eq. (1) per token and layer, 34h + 5as bytes at 2-byte activations
        act_tf = tb.layers * s * (34.0 * h + 5.0 * tb.heads * s) * act / 2.0
        inter_out += h  # the block's mean-pooled output joins the top-MLP input
    moe = model.top_moe
    top_widths = [model.top_mlp.width] * (model.top_mlp.layers - 1) + [1]
    top = _mlp("top", "top", inter_out, top_widths[:-1], expert=moe is not None)
    top += [DenseGemm("top_out", top_widths[-2] if len(top_widths) > 1 else inter_out, 1, 1, "top",
                      row_parallel=len(top_widths) % 2 == 0)]
    if moe is not None:  # router: a (k x experts) GEMM per MoE layer
        top += [DenseGemm(f"router{i}", g.k, moe.experts, 1, "local") for i, g in enumerate(top) if g.expert]
    gemms = gemms + local + top
    top_k = moe.top_k if moe else 1
    # each GEMM keeps its input for the weight gradient and its output for the ReLU mask (fp32 or 16-bit)
    act_gemm = sum(g.tokens * (g.k + g.n) * act * (top_k if g.expert else 1) for g in gemms)
    act_inter = ((model.compressed_features or features) * d + inter_out) * act
    elem = sum(2.0 * g.tokens * g.n * act * (top_k if g.expert else 1) for g in gemms)  # ReLU: read + write
    return DLRMWorkload(
        model=model,
        gemms=tuple(gemms),
        interaction_flops_per_sample=inter_flops,
        interaction_dim=inter_dim,
        interaction_out=inter_out,
        attn_flops_per_sample=attn,
        act_bytes=act,
        act_bytes_per_sample=act_gemm + act_inter + act_tf,
        elementwise_bytes_per_sample=elem,
        experts=moe.experts if moe else 1,
        top_k=top_k,
    )


# ============================================================================================= layout


@dataclass(frozen=True)
class Layout:
    """One hardware option seen by the embedding model: N GPUs in M nodes of G (node = scale-up domain)."""

    option: HardwareOption
    gpus: int
    node: int  # G: GPUs per node in this job (the scale-up domain, or N when smaller)
    nodes: int  # M = N / G
    intra_bw: float  # effective one-way bytes/s per GPU inside a node (bandwidth x efficiency)
    inter_bw: float  # ... across nodes (the outermost tier)
    hbm_bw: float  # achieved HBM bytes/s (bandwidth x hbm_eff)
    capacity_bytes: float  # HBM minus the reserve
    tiers: Tiers  # the system's tiers for one plan column (collectives.*)

    @property
    def node_of(self) -> IntArr:
        return np.arange(self.gpus, dtype=np.int64) // self.node


def layout_of(option: HardwareOption, stack: DLRMStack) -> Layout:
    tiers = option.system.tiers
    size = tiers[0].size if len(tiers) > 1 else None
    node = min(size or option.gpus, option.gpus)
    if option.gpus % node:
        raise ValueError(f"{option.gpus} GPUs is not a whole number of {node}-GPU nodes")
    table = HardwareTable((option,))
    return Layout(
        option=option,
        gpus=option.gpus,
        node=node,
        nodes=option.gpus // node,
        intra_bw=tiers[0].bw * tiers[0].efficiency,
        inter_bw=tiers[-1].bw * tiers[-1].efficiency,
        hbm_bw=option.gpu.hbm_bw * option.gpu.calibration.hbm_eff,
        capacity_bytes=option.gpu.hbm_bytes * (1.0 - stack.memory_reserve_fraction),
        tiers=table.tiers(np.zeros(1, dtype=np.int64)),
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

    @property
    def bottleneck_s(self) -> float:
        """Lookups + communication of one step without any overlap: what the placement minimises (training)."""
        return self.lookup_fwd_s + self.lookup_bwd_s + self.input_s + 2 * self.output_s + self.dp_allreduce_s


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


def compact_placement(shards: ShardArrays, opts: EmbeddingOptions, model: DLRMModel) -> list[dict[str, Any]]:
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
        entry: dict[str, Any] = {"group": model.tables[grp].name, "count": k, "sharding": sharding}
        if LOCATED[sharding] == "gpu":
            entry["gpus"] = list(loc)
        elif LOCATED[sharding] == "node":
            entry["node"] = loc[0]
        out.append(entry)
    return out


# ================================================================================== dense cost model

DENSE_INVALID: dict[int, str] = {
    1: "global_batch must be divisible by the number of GPUs",
    2: "tp must be a power of two that divides the node size",
    3: "tp > 1 is modelled with ddp only",
    4: "tp > 1 with a MoE top MLP is not modelled",
    5: "ep must divide the number of experts and of GPUs (and needs a MoE top MLP when > 1)",
    6: "memory per GPU exceeds capacity",
}
DENSE_MEMORY_REASON = 6


@dataclass(frozen=True)
class DensePlans:
    """Dense plans as columns: strategy (index into DENSE_STRATEGIES), tp, ep."""

    strategy: IntArr
    tp: IntArr
    ep: IntArr

    def __len__(self) -> int:
        return int(self.strategy.shape[0])

    def plan(self, i: int) -> DensePlan:
        return DensePlan(strategy=DENSE_STRATEGIES[int(self.strategy[i])], tp=int(self.tp[i]), ep=int(self.ep[i]))

    @staticmethod
    def of(plans: list[DensePlan]) -> DensePlans:
        return DensePlans(np.array([DENSE_STRATEGIES.index(p.strategy) for p in plans], dtype=np.int64),
                          np.array([p.tp for p in plans], dtype=np.int64),
                          np.array([p.ep for p in plans], dtype=np.int64))


def _knob(values: Any, default: list[int]) -> list[int]:
    if values is None:
        return default
    return sorted(set([values] if isinstance(values, int) else values))


def enumerate_dense(sp: DLRMSpace, m: DLRMModel, lay: Layout) -> DensePlans:
    """The dense plans of the space on one hardware option (validity is ``dense_terms``' job)."""
    strategies = list(DENSE_STRATEGIES) if sp.dense is None else ([sp.dense] if isinstance(sp.dense, str)
                                                                   else list(sp.dense))
    tps = _knob(sp.tp, [t for t in (1, 2, 4, 8, 16) if t <= lay.node])
    experts = m.top_moe.experts if m.top_moe else 1
    eps = _knob(sp.ep, [e for e in range(1, experts + 1) if experts % e == 0 and lay.gpus % e == 0])
    rows = [(DENSE_STRATEGIES.index(s), t, e) for s in strategies for t in tps for e in eps
            if not (s == "fsdp" and t > 1)]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return DensePlans(arr[:, 0], arr[:, 1], arr[:, 2])


@dataclass(frozen=True)
class DenseTerms:
    """Per dense plan (arrays): compute and communication of the dense part of one step."""

    bottom_fwd_s: Arr
    bottom_bwd_s: Arr
    top_fwd_s: Arr  # interaction, transformer block, top MLP (compute)
    top_bwd_s: Arr
    tp_comm_s: Arr  # tensor-parallel activation collectives, fwd + bwd (on the critical path)
    moe_a2a_s: Arr  # expert dispatch/combine all-to-alls, fwd + bwd (on the critical path)
    sync_s: Arr  # DDP: gradient all-reduce; FSDP: backward gathers + gradient reduce-scatter
    fsdp_fwd_s: Arr  # FSDP: forward weight gathers
    optimizer_s: Arr
    memory: dict[str, Arr]  # weights, gradients, optimizer, activations, buffers
    invalid: IntArr
    fwd_flops_per_gpu: Arr

    @property
    def memory_bytes(self) -> Arr:
        return np.sum(list(self.memory.values()), axis=0)


def dense_peak_flops(gpu: GPU, precision: str, stack: DLRMStack) -> float:
    """fp32 GEMMs use TF32 tensor cores when allowed and present (PyTorch allow_tf32), else fp32 CUDA cores."""
    peaks = gpu.peak_flops
    key = "tf32" if precision == "fp32" and stack.tf32 and "tf32" in peaks else precision
    if key not in peaks:
        raise ProblemError(f"GPU {gpu.name} has no {key} peak in the catalog", field="model.dense_precision")
    return float(peaks[key])


def dense_terms(wl: DLRMWorkload, task: DLRMTask, stack: DLRMStack, lay: Layout, plans: DensePlans) -> DenseTerms:
    """The dense part for every plan in ``plans`` (vectorised)."""
    gpu = lay.option.gpu
    tiers = lay.tiers
    N = float(lay.gpus)
    b = task.global_batch / N
    tp, ep = plans.tp.astype(np.float64), plans.ep.astype(np.float64)
    fsdp = plans.strategy == DENSE_STRATEGIES.index("fsdp")
    ones = np.ones(len(plans))
    peak = dense_peak_flops(gpu, wl.model.dense_precision, stack) * ones
    eff, half = gpu.calibration.gemm_eff * ones, gpu.calibration.gemm_half_dim * ones
    hbm = lay.hbm_bw * ones
    act = wl.act_bytes
    wb, st = DENSE_WEIGHT_BYTES[wl.model.dense_precision], DENSE_STATE_BYTES[wl.model.dense_precision]

    fwd = {"bottom": 0.0 * ones, "top": 0.0 * ones}
    tp_fwd, tp_bwd, moe_fwd = 0.0 * ones, 0.0 * ones, 0.0 * ones
    flops_gpu = 0.0 * ones
    for block in ("bottom", "top"):
        members = [g for g in wl.gemms if g.block == block or (block == "top" and g.block == "local")]
        tp_members = [g for g in members if g.block != "local" and not g.expert]
        for g in members:
            if g.expert:  # tokens per expert: the EP group's routed tokens spread over the experts
                rows = ep * b * wl.top_k * g.tokens / wl.experts
                flops = b * wl.top_k * g.flops_per_sample * ones
                dim = np.minimum(rows, min(g.k, g.n))
                routed = b * wl.top_k * g.tokens * act
                dispatch = all_to_all_s(routed * g.k * ones, ep, ones, tiers)
                combine = all_to_all_s(routed * g.n * ones, ep, ones, tiers)
                moe_fwd = moe_fwd + np.where(ep > 1, dispatch + combine, 0.0)
            elif g.block == "local":
                flops = b * g.flops_per_sample * ones
                dim = np.minimum(b * g.tokens, min(g.k, g.n)) * ones
            else:  # TP: the group's t*b samples against 1/t of the weights (column: n/t, row: k/t)
                rows = tp * b * g.tokens
                sharded = (g.k if g.row_parallel else g.n) / tp
                flops = b * g.flops_per_sample * ones
                dim = np.minimum(np.minimum(rows, sharded), float(g.n if g.row_parallel else g.k))
            t = gemm_time_s(flops, dim, peak, eff, half)
            t = t + memory_bound_time_s(2.0 * b * g.tokens * g.n * act * (wl.top_k if g.expert else 1) * ones,
                                        hbm)  # ReLU / bias: read + write the output
            fwd[block] = fwd[block] + t
            flops_gpu = flops_gpu + flops
        # Megatron pairs: all-reduce of each row-parallel GEMM's output (fwd) and of each column-parallel GEMM's
        # input grad (bwd); the block input is all-gathered over the group (fwd) and its grad reduce-scattered (bwd)
        for g in tp_members:
            size = tp * b * g.tokens * (g.n if g.row_parallel else g.k) * act
            ar = np.where(tp > 1, all_reduce_s(size, tp, ones, tiers), 0.0)
            if g.row_parallel:
                tp_fwd = tp_fwd + ar
            else:
                tp_bwd = tp_bwd + ar
        if tp_members:
            first, last = tp_members[0], tp_members[-1]
            edge = all_gather_s(tp * b * first.k * act * ones, tp, ones, tiers)
            if not last.row_parallel:  # a block ending on a column-parallel GEMM gathers its output
                edge = edge + all_gather_s(tp * b * last.n * act * ones, tp, ones, tiers)
            tp_fwd = tp_fwd + np.where(tp > 1, edge, 0.0)
            tp_bwd = tp_bwd + np.where(tp > 1, edge, 0.0)
    inter = gemm_time_s(b * wl.interaction_flops_per_sample * ones, float(wl.interaction_dim) * ones, peak, eff,
                        half) if wl.interaction_flops_per_sample else 0.0 * ones
    attn = b * wl.attn_flops_per_sample / (peak * gpu.calibration.attn_eff) * ones
    top_fwd = fwd["top"] + inter + attn
    flops_gpu = flops_gpu + b * (wl.interaction_flops_per_sample + wl.attn_flops_per_sample)
    train = task.kind == "train"
    bwd_factor = 2.0 if train else 0.0  # activation grad + weight grad GEMMs

    # parameters per GPU: TP-sharded MLP weights, replicated local ones, experts split over ep
    tp_params = float(sum(g.params for g in wl.gemms if g.block != "local" and not g.expert))
    rep_params = float(sum(g.params for g in wl.gemms if g.block == "local"))
    exp_params = float(wl.expert_params)
    local_params = tp_params / tp + rep_params + exp_params / ep
    gb = DENSE_GRAD_BYTES
    one = ones
    # one all-reduce per parameter kind that exists: replicated, TP-sharded (over N/t, stride t), experts (N/ep)
    ar_dense = (np.where(rep_params > 0, all_reduce_s(rep_params * gb * one, N * one, one, tiers), 0.0)
                + np.where(tp_params > 0, all_reduce_s(tp_params / tp * gb, N / tp, tp, tiers), 0.0)
                + np.where(exp_params > 0, all_reduce_s(exp_params / ep * gb, N / ep, ep, tiers), 0.0))
    dense_p = tp_params + rep_params
    n_units = float(len([g for g in wl.gemms if not g.expert])) + (float(len([g for g in wl.gemms if g.expert]))
                                                                  if exp_params else 0.0)
    lat_ag = all_gather_s(0.0 * one, N * one, one, tiers)
    gather = (all_gather_s(dense_p * wb * one, N * one, one, tiers)
              + np.where(exp_params > 0, all_gather_s(exp_params / ep * wb, N / ep, ep, tiers), 0.0)
              + (n_units - 1.0) * lat_ag)  # one gather per layer (FSDP unit)
    scatter = (reduce_scatter_s(dense_p * gb * one, N * one, one, tiers)
               + np.where(exp_params > 0, reduce_scatter_s(exp_params / ep * gb, N / ep, ep, tiers), 0.0)
               + (n_units - 1.0) * lat_ag)
    single = N == 1
    sync = np.where(single, 0.0, np.where(fsdp, gather + scatter, ar_dense)) * train
    fsdp_fwd = np.where(fsdp & (not single), gather, 0.0) * train
    opt_params = np.where(fsdp, (dense_p + exp_params) / N, local_params)
    optimizer = memory_bound_time_s(opt_params * ADAM_TRAFFIC_BYTES[wl.model.dense_precision], hbm) * train

    largest = float(max(g.params for g in wl.gemms))
    weights = np.where(fsdp, (dense_p + exp_params) / N * wb + 2.0 * largest * wb, local_params * wb)
    state = np.where(fsdp, (dense_p + exp_params) / N, local_params) * (st - wb) * train
    acts = b * wl.act_bytes_per_sample * (1.0 if train else 0.0) * ones
    if not train:  # inference keeps one layer's input and output at a time
        acts = b * max(g.tokens * (g.k + g.n) * act for g in wl.gemms) * ones
    memory = {"weights": weights, "optimizer_and_grads": state, "activations": acts}

    node = float(lay.node)
    checks = [
        (1, task.global_batch % lay.gpus != 0),
        (2, (node % tp != 0) | (np.log2(tp) % 1 != 0)),
        (3, (tp > 1) & fsdp),
        (4, (tp > 1) & (wl.experts > 1)),
        (5, (wl.experts % plans.ep != 0) | (lay.gpus % plans.ep != 0) | ((plans.ep > 1) & (wl.experts == 1))),
    ]
    code = np.zeros(len(plans), dtype=np.int64)
    for c, bad in reversed(checks):
        code = np.where(bad, c, code)
    return DenseTerms(
        bottom_fwd_s=fwd["bottom"],
        bottom_bwd_s=bwd_factor * fwd["bottom"],
        top_fwd_s=top_fwd,
        top_bwd_s=bwd_factor * top_fwd,
        tp_comm_s=tp_fwd + tp_bwd * train,
        moe_a2a_s=moe_fwd * (2.0 if train else 1.0),  # the backward sends the gradients the same way
        sync_s=sync,
        fsdp_fwd_s=fsdp_fwd,
        optimizer_s=optimizer,
        memory=memory,
        invalid=code,
        fwd_flops_per_gpu=flops_gpu,
    )


# ===================================================================================== step assembly

STEP_TERMS: tuple[str, ...] = (
    "lookup_fwd", "bottom_fwd", "a2a_fwd", "fsdp_fwd", "top_fwd", "tp_comm", "moe_a2a", "top_bwd", "bottom_bwd",
    "a2a_bwd", "lookup_bwd", "grad_sync", "optimizer",
)


def step_terms(dense: DenseTerms, emb: EmbeddingTimes, stack: DLRMStack, task: DLRMTask) -> tuple[
        dict[str, Arr], dict[str, Arr]]:
    """(additive step terms, overlapped communication) per dense plan. Two streams (MAD-Max): compute and comm.

    forward:  Lf + max(Cin + Cout, Bf) + Tf  -- the bottom MLP (needs no embedding) fills the waits for the id
              all-to-all (Cin, before the lookups) and the pooled all-to-all (Cout, after them), split at layers;
              with ``pipeline_input_dist`` Cin runs during the previous step's top MLP instead.
    backward: Tb + max(Cgrad, Bb) + Lb  -- the gradient all-to-all overlaps the bottom MLP's backward.
    sync:     DDP gradient all-reduce (+ data-parallel tables' all-reduce) runs whenever the comm stream is free
              during backward: exposed = max(0, sync - (Tb + max(0, Bb - Cgrad) + Lb)); FSDP forward gathers
              likewise behind Lf, the bottom MLP's spare time and Tf.
    TP collectives and MoE all-to-alls sit on the critical path (not overlapped).
    """
    train = task.kind == "train"
    lf, lb = emb.lookup_fwd_s, emb.lookup_bwd_s if train else 0.0
    cin, cout = emb.input_s, emb.output_s
    bf, bb, tf, tb = dense.bottom_fwd_s, dense.bottom_bwd_s, dense.top_fwd_s, dense.top_bwd_s
    cin_exposed = np.maximum(0.0, cin - (tf + tb)) if stack.pipeline_input_dist else cin + 0.0 * bf
    a2a_fwd = np.maximum(0.0, cin_exposed + cout - bf)
    cgrad = cout if train else 0.0
    a2a_bwd = np.maximum(0.0, cgrad - bb)
    fwd_idle = lf + np.maximum(0.0, bf - cin_exposed - cout) + tf
    fsdp_fwd = np.maximum(0.0, dense.fsdp_fwd_s - fwd_idle)
    sync = dense.sync_s + (emb.dp_allreduce_s if train else 0.0)
    bwd_idle = tb + np.maximum(0.0, bb - cgrad) + lb
    grad_sync = np.maximum(0.0, sync - bwd_idle) if train else 0.0 * bf
    time = {
        "lookup_fwd": lf + 0.0 * bf,
        "bottom_fwd": bf,
        "a2a_fwd": a2a_fwd,
        "fsdp_fwd": fsdp_fwd,
        "top_fwd": tf,
        "tp_comm": dense.tp_comm_s,
        "moe_a2a": dense.moe_a2a_s,
        "top_bwd": tb,
        "bottom_bwd": bb,
        "a2a_bwd": a2a_bwd,
        "lookup_bwd": lb + 0.0 * bf,
        "grad_sync": grad_sync,
        "optimizer": dense.optimizer_s,
    }
    hidden = {
        "a2a_fwd": cin + cout - a2a_fwd - (cin - cin_exposed),
        "input_dist_pipelined": cin - cin_exposed,
        "a2a_bwd": cgrad - a2a_bwd,
        "grad_sync": sync - grad_sync,
        "fsdp_fwd": dense.fsdp_fwd_s - fsdp_fwd,
    }
    return time, hidden


def step_time_s(time: dict[str, Arr]) -> Arr:
    return np.sum([time[k] for k in STEP_TERMS], axis=0)
