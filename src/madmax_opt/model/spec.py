"""Validated problem specification (pydantic v2): model, hardware, task, space, stack, objective.

Everything here is SI units (bytes, seconds, FLOP/s, bytes/s). Catalog names are resolved by
``madmax_opt.io.problem_file`` which turns a YAML file into a :class:`Problem`; this module only holds the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.model.hardware_spec import (  # noqa: F401 (the catalog's shapes, re-exported: part of a problem)
    FRAMEWORK_FAMILY,
    FRAMEWORKS,
    GPU,
    Calibration,
    FamilyCalibration,
    Fraction,
    Framework,
    FrameworkCalibration,
    FrameworkFit,
    Precision,
    ServingFrameworkName,
    Strict,
    System,
    Tier,
    TrainingFramework,
)
from madmax_opt.model.objectives import ObjectiveName

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")


class RC(IntEnum):
    """A plan array's recompute code: the index of its mode in RECOMPUTE_MODES."""

    NONE = RECOMPUTE_MODES.index("none")
    SELECTIVE = RECOMPUTE_MODES.index("selective")
    FULL = RECOMPUTE_MODES.index("full")


@dataclass(frozen=True)
class ProcessGroup:
    """Marks a plan field as a parallel degree: it sizes a process group, so input files bound it like a GPU count
    (io/limits) and the plan-settings registry lists it (model/plan_settings.PARALLEL_DEGREES); ``serving``: a
    serving plan shares it (plan_settings.SHARED_DEGREES), otherwise a serving plan refuses it."""

    serving: bool = True


Degree = Annotated[PositiveInt, ProcessGroup()]  # a degree training and serving plans share
TrainingDegree = Annotated[PositiveInt, ProcessGroup(serving=False)]  # a degree only training plans have

# ----------------------------------------------------------------------------------------------- models


class MLA(Strict):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): keys and values come from a cached
    latent of ``kv_lora_rank`` values plus a decoupled RoPE key of ``qk_rope_head_dim`` per token and layer; the
    names are those of the Hugging Face config.json."""

    kv_lora_rank: PositiveInt = Field(description="width of the cached key/value latent c_KV")
    q_lora_rank: PositiveInt | None = Field(None, description="width of the query latent; None: queries are not "
                                            "compressed (DeepSeek-V2-Lite)")
    qk_nope_head_dim: PositiveInt = Field(description="per-head query/key width without RoPE")
    qk_rope_head_dim: PositiveInt = Field(description="per-head query/key width with RoPE (the key shared by heads)")
    v_head_dim: PositiveInt = Field(description="per-head value width")

    @property
    def kv_dim(self) -> int:
        """Cached values per token and layer: kv_lora_rank + qk_rope_head_dim (DeepSeek-V2 Sec. 2.1.3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MoE(Strict):
    """Mixture-of-experts MLP: every layer's MLP is ``num_experts`` experts of which each token uses ``top_k``."""

    num_experts: PositiveInt
    top_k: PositiveInt
    expert_ffn: PositiveInt = Field(description="FFN width of one expert")
    shared_experts: int = Field(0, ge=0, description="always-active experts (DeepSeek style), each expert_ffn wide")
    capacity_factor: float = Field(
        1.0, ge=1.0, description="tokens an expert processes relative to a perfect split (padding / dropless max)"
    )
    load_imbalance: float = Field(
        1.0, ge=1.0, description="busiest rank's routed tokens relative to the mean (sets the critical path)"
    )

    @model_validator(mode="after")
    def _k(self) -> MoE:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        return self


# dtype of a published checkpoint's (largest) weights: mxfp4 = OCP microscaling FP4 (gpt-oss experts), nvfp4 =
# NVIDIA FP4 with 16-element FP8 scales; fp8 = e4m3 block-scaled (DeepSeek-V3/R1)
NativePrecision = Literal["fp32", "bf16", "fp16", "fp8", "mxfp4", "nvfp4", "int4"]
NATIVE_PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "mxfp4", "nvfp4", "int4")


class TransformerModel(Strict):
    """A transformer: decoder LLM (``family: llm``, dense or MoE) or encoder ViT (``family: vit``)."""

    family: Literal["llm", "vit"] = "llm"
    name: str = "custom"
    hf_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="Hugging Face repository id of the public checkpoint (owner/name); None for paper or synthetic "
        "models",
    )
    native_precision: NativePrecision | None = Field(
        None, description="dtype the public checkpoint ships its weights in (bf16, fp8, mxfp4, ...); None without one"
    )
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = Field(None, description="GQA key/value heads; default = heads (MHA)")
    ffn: PositiveInt
    ffn_kind: Literal["gelu", "swiglu"] = "gelu"
    vocab: int = Field(0, ge=0, description="vocabulary size; 0 for ViT")
    tied_embeddings: bool = False
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = Field(False, description="linear layers carry bias vectors")
    image_size: PositiveInt | None = None
    patch_size: PositiveInt | None = None
    channels: PositiveInt = 3
    moe: MoE | None = Field(None, description="mixture-of-experts MLP (replaces the dense MLP of every layer)")
    mla: MLA | None = Field(None, description="multi-head latent attention (DeepSeek-V2 / V3): its widths")
    source: str = "inline"

    @property
    def mla_kv_dim(self) -> int | None:
        """Values MLA caches per token and layer (the latent plus the RoPE key), the same on every TP rank; None
        without MLA (the cache is then 2 x kv_heads x head_dim)."""
        return None if self.mla is None else self.mla.kv_dim

    @model_validator(mode="after")
    def _shapes(self) -> TransformerModel:
        if self.hidden % self.heads:
            divisors = [d for d in range(1, min(self.hidden, 1024) + 1) if self.hidden % d == 0]
            raise ValueError(
                f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); "
                f"allowed heads: {', '.join(map(str, divisors))}"
            )
        if self.heads % self.n_kv_heads:
            divisors = [d for d in range(1, self.heads + 1) if self.heads % d == 0]
            raise ValueError(
                f"heads ({self.heads}) is not divisible by kv_heads ({self.n_kv_heads}); "
                f"allowed kv_heads: {', '.join(map(str, divisors))}"
            )
        if self.family == "llm" and self.vocab <= 0:
            raise ValueError("an llm needs vocab > 0")
        if self.family == "vit" and (self.image_size is None or self.patch_size is None):
            raise ValueError("a vit needs image_size and patch_size")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def vit_seq_len(self) -> int:
        """Patches per image plus the class token."""
        assert self.image_size is not None and self.patch_size is not None
        return (self.image_size // self.patch_size) ** 2 + 1


# ------------------------------------------------------------------------------------------ task, etc.


class Task(Strict):
    kind: Literal["pretrain", "finetune"] = "pretrain"
    seq_len: PositiveInt | None = Field(None, description="tokens per sequence (ViT: derived from the image)")
    global_batch: PositiveInt = Field(description="sequences (images) per optimizer step")
    precision: Literal["bf16", "fp16", "fp8", "mxfp8"] = Field(
        "bf16", description="GEMM precision: fp8 = per-tensor scaling (Transformer Engine), mxfp8 = 32-element "
        "block scaling (Blackwell); attention, norms and the LM head stay bf16"
    )
    frozen_layers: int = Field(0, ge=0, description="finetune: leading transformer layers without gradients")
    lora_rank: int = Field(0, ge=0, description="finetune: LoRA rank (0 = full fine-tuning)")
    train_tokens: PositiveFloat | None = Field(None, description="token budget for objective time_to_train")

    @model_validator(mode="after")
    def _finetune_only(self) -> Task:
        if self.kind == "pretrain" and (self.frozen_layers or self.lora_rank):
            raise ValueError("frozen_layers and lora_rank need kind: finetune")
        return self


InferencePrecision = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
KVPrecision = Literal["bf16", "fp16", "fp8", "int8"]


class RequestShape(Strict):
    """One kind of serving request: prompt and generated tokens, with its relative share of requests."""

    prompt_len: PositiveInt
    output_len: PositiveInt
    weight: PositiveFloat = Field(1.0, description="relative share of requests of this shape")


PERCENTILE_TARGETS: tuple[str, ...] = tuple(f"{m}_p{p}_s" for m in ("ttft", "tpot") for p in (50, 90, 99))


class InferenceTask(Strict):
    """LLM serving with continuous batching: request shapes, precision and latency/throughput targets."""

    kind: Literal["inference"]
    prompt_len: PositiveInt | None = Field(None, description="prompt tokens per request")
    output_len: PositiveInt | None = Field(None, description="generated tokens per request")
    mix: list[RequestShape] | None = Field(None, min_length=1, description="weighted request shapes (instead "
                                           "of prompt_len/output_len)")
    precision: InferencePrecision | list[InferencePrecision] = Field(
        "bf16", description="weight precision(s) to search; int4 is weight-only (W4A16), fp8/int8 are W8A8"
    )
    kv_precision: KVPrecision | None = Field(None, description="KV-cache precision; default: the weights' (int4: bf16)")
    ttft_s: PositiveFloat | None = Field(None, description="target time to first token, s")
    tpot_s: PositiveFloat | None = Field(None, description="target time per output token, s")
    min_throughput: PositiveFloat | None = Field(None, description="output tokens/s of the whole deployment")
    disaggregated: bool = Field(False, description="separate prefill and decode replicas, KV sent over the network")
    speculative_tokens: int = Field(
        0, ge=0, le=8, description="draft tokens verified per decode step (MTP / EAGLE speculative decoding); the "
        "share accepted is the serving calibration's spec_acceptance"
    )
    arrival_rate: PositiveFloat | None = Field(
        None, description="online serving: Poisson arrivals, requests/s the deployment must carry (instead of a "
        "saturated batch); latency targets may then be percentiles (model/queueing.py)"
    )
    ttft_p50_s: PositiveFloat | None = Field(None, description="with arrival_rate: target median TTFT, s")
    ttft_p90_s: PositiveFloat | None = Field(None, description="with arrival_rate: target p90 TTFT, s")
    ttft_p99_s: PositiveFloat | None = Field(None, description="with arrival_rate: target p99 TTFT, s")
    tpot_p50_s: PositiveFloat | None = Field(None, description="with arrival_rate: target median TPOT, s")
    tpot_p90_s: PositiveFloat | None = Field(None, description="with arrival_rate: target p90 TPOT, s")
    tpot_p99_s: PositiveFloat | None = Field(None, description="with arrival_rate: target p99 TPOT, s")

    @model_validator(mode="after")
    def _online(self) -> InferenceTask:
        given = [k for k in PERCENTILE_TARGETS if getattr(self, k) is not None]
        if given and self.arrival_rate is None:
            raise ValueError(f"{', '.join(given)}: percentile targets need arrival_rate (requests/s)")
        if self.arrival_rate is not None and self.disaggregated:
            raise ValueError("arrival_rate with disaggregated: true is not modelled yet; allowed: disaggregated false")
        return self

    def latency_targets(self) -> dict[str, float]:
        """Online serving targets by name (``ttft_p99_s``, ..., and the means ``ttft_s`` / ``tpot_s``)."""
        names = (*PERCENTILE_TARGETS, "ttft_s", "tpot_s")
        return {k: float(getattr(self, k)) for k in names if getattr(self, k) is not None}

    @model_validator(mode="after")
    def _shapes(self) -> InferenceTask:
        single = self.prompt_len is not None or self.output_len is not None
        if single == (self.mix is not None):
            raise ValueError("give either prompt_len and output_len, or mix; allowed: one of the two")
        if single and (self.prompt_len is None or self.output_len is None):
            raise ValueError("give both prompt_len and output_len (or a mix)")
        if isinstance(self.precision, list) and not self.precision:
            raise ValueError("precision is an empty list; allowed: one or more of bf16, fp16, fp8, int8, int4, fp4")
        return self

    def requests(self) -> list[RequestShape]:
        if self.mix is not None:
            return list(self.mix)
        assert self.prompt_len is not None and self.output_len is not None
        return [RequestShape(prompt_len=self.prompt_len, output_len=self.output_len)]

    def precisions(self) -> list[str]:
        return list(dict.fromkeys(self.precision if isinstance(self.precision, list) else [self.precision]))


class Stack(Strict):
    """Software-stack behaviour. Defaults: Megatron-Core + Transformer Engine + NCCL (2024-26)."""

    framework: Framework | ServingFrameworkName = Field(
        "megatron-core",
        description="which calibrated efficiency and overlap profile prices the plan: megatron-core (distributed "
        "optimizer, TE kernels), torchtitan (FSDP2 prefetch, float8 all-gather), pytorch-fsdp (FSDP FULL_SHARD); "
        "inference: vllm (the default there), tensorrt-llm, sglang",
    )

    flash_attention: bool = Field(True, description="fused/flash attention: no s^2 activations, causal skip")
    ep_comm_overlap: bool = Field(
        False, description="overlap MoE token all-to-all with expert GEMMs (off in Megatron-Core by default)"
    )
    tp_comm_overlap: bool = Field(False, description="overlap TP/SP collectives with GEMMs (Megatron --tp-comm-overlap)")
    dp_overlap: bool = Field(True, description="overlap DP gradient reduction with backward (bucketed DDP)")
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Megatron main-grad precision")
    optimizer_dtype: Literal["fp32", "bf16-moments", "bf16"] = Field(
        "fp32", description="Adam state per trainable parameter: fp32 (master weights + m + v, 12 B; Megatron-Core "
        "default), bf16-moments (fp32 master, bf16 m and v, 8 B; Megatron-Core --use-precision-aware-optimizer "
        "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), bf16 (master, m, v all bf16, 6 B; NeMo 1.0 "
        "distributed_fused_adam with optim.dtype bf16, as its SFT recipes ship)",
    )
    fp8_params: bool = Field(
        False, description="fp8/mxfp8 tasks: FP8 primary weights (Megatron-Core --fp8-param-gather, NeMo "
        "fp8_params): each weight held as FP8 plus its transpose instead of bf16 plus the FP8 cache; ZeRO/FSDP "
        "all-gathers FP8",
    )
    dropout: bool = Field(False, description="dropout layers store masks (GPT-3-era); off for LLaMA-style models")
    pp_scatter_gather: bool = Field(
        False,
        description="pipeline sends split over the TP ranks, all-gathered on arrival (Megatron-LM 2021-23 "
        "scatter/gather, DeepSpeed pipe partitioned activations); Megatron-Core sends whole tensors unless SP",
    )
    memory_reserve_fraction: float = Field(
        0.05, ge=0.0, lt=1.0, description="HBM held back for CUDA context, NCCL buffers and fragmentation"
    )
    gqa_decode_kernel: bool = Field(
        True,
        description="inference: decode attention reads each KV head once per GQA group (FlashInfer, TensorRT-LLM "
        "XQA); false: once per query head (vLLM PagedAttention v1/v2, FasterTransformer MMHA, 2023 stacks)",
    )


Knob = int | list[int] | None


class Space(Strict):
    """Restrictions of the plan space; a scalar fixes a knob, a list restricts it, absence leaves it free."""

    uneven_stages: bool = Field(
        False, description="also search uneven pipelines: layers and recompute chosen per stage (CP-SAT)"
    )
    mixed_stages: bool = Field(
        False,
        description="with uneven_stages: each pipeline stage may run on another listed system (GPU type), "
        "within each type's supply",
    )
    dp: Knob = None
    tp: Knob = None
    pp: Knob = None
    cp: Knob = None
    vpp: Knob = None
    mbs: Knob = None
    zero: Knob = None
    recompute: Recompute | list[Recompute] | None = None
    sp: bool | list[bool] | None = None
    ep: Knob = None


class Constraints(Strict):
    max_gpus: PositiveInt | None = None
    max_cost_per_hour: PositiveFloat | None = Field(None, description="US$ per hour for the whole job")
    min_throughput: PositiveFloat | None = Field(None, description="tokens/s")
    deadline_hours: PositiveFloat | None = Field(
        None, description="training: train task.train_tokens within this many hours (as sweep files accept it): a "
        "floor of train_tokens / (3600 x hours) tokens/s"
    )
    budget_usd: PositiveFloat | None = Field(
        None, description="training: train task.train_tokens for at most this many US$ (as sweep files accept it): "
        "the run's hours x the plan's $/h"
    )

    def deadline_floor(self, train_tokens: float | None) -> float | None:
        """tokens/s that deadline_hours needs: train_tokens / (deadline_hours x 3600 s/h); None without both."""
        if self.deadline_hours is None or train_tokens is None:
            return None
        return train_tokens / (self.deadline_hours * SECONDS_PER_HOUR)  # the sweep's floor, the same expression

    def throughput_floor(self, train_tokens: float | None) -> float | None:
        """The tokens/s the constraints require: the larger of min_throughput and the deadline's floor."""
        floors = [x for x in (self.min_throughput, self.deadline_floor(train_tokens)) if x is not None]
        return max(floors) if floors else None


Objective = ObjectiveName  # the names of the objective registry (model/objectives.py)


def min_stage_layers(stage: int, pp: int, vpp: int) -> int:
    """Fewest layers pipeline stage ``stage`` may hold with ``vpp`` virtual chunks: one per chunk, except that the
    first chunk of the first stage may hold only the embedding and the last chunk of the last stage only the loss
    (Megatron-Core ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``)."""
    return max(1, vpp - (stage == 0) - (stage == pp - 1))


class Plan(Strict):
    """A parallelization plan (the public names). ``system`` picks the hardware option by name."""

    dp: Degree = 1
    tp: Degree = 1
    pp: Degree = 1
    cp: TrainingDegree = 1
    vpp: PositiveInt = 1
    mbs: PositiveInt = 1
    zero: int = Field(0, ge=0, le=3)
    recompute: Recompute = "none"
    sp: bool = False
    ep: Degree = Field(1, description="expert parallelism (MoE): experts sharded over ep ranks of dp x cp")
    system: str | None = None
    batch: PositiveInt | None = Field(None, description="inference: concurrent sequences per replica (dp replicas)")
    stage_layers: list[PositiveInt] | None = Field(
        None, description="uneven pipeline: transformer layers per stage (sums to the model's layers)"
    )
    stage_recompute: list[Recompute] | None = Field(None, description="uneven pipeline: recompute mode per stage")
    stage_systems: list[str] | None = Field(
        None, description="mixed pipeline: the system (GPU type) of every stage; needs stage_layers"
    )

    @model_validator(mode="after")
    def _stages(self) -> Plan:
        for name in ("stage_layers", "stage_recompute", "stage_systems"):
            v = getattr(self, name)
            if v is not None and len(v) != self.pp:
                raise ValueError(f"{name} needs one entry per pipeline stage (pp={self.pp}), got {len(v)}")
        if (self.stage_layers is None) != (self.stage_recompute is None):
            raise ValueError("give stage_layers and stage_recompute together")
        if self.stage_systems is not None and self.stage_layers is None:
            raise ValueError("stage_systems needs stage_layers and stage_recompute")
        if self.stage_layers is not None and self.vpp > 1:  # interleaved: every virtual chunk holds a layer
            short = [s for s, n in enumerate(self.stage_layers) if n < min_stage_layers(s, self.pp, self.vpp)]
            if short:
                raise ValueError(
                    f"with vpp={self.vpp} stage {short[0]} needs at least "
                    f"{min_stage_layers(short[0], self.pp, self.vpp)} layers (one per virtual chunk; on the first "
                    "and last stage one chunk may hold only the embedding / the loss)"
                )
        return self

    @property
    def uneven(self) -> bool:
        return self.stage_layers is not None

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp
