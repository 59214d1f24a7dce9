"""DLRM recommendation models (``family: dlrm``): the problem-file shapes (tables, MLPs, task, space, stack,
constraints, plans) and their byte constants; loading is ``madmax_opt.io.dlrm_problem``."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from madmax_opt.model.objectives import ObjectiveName
from madmax_opt.model.spec import Strict

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
