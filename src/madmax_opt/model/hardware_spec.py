"""The hardware catalog's shapes (pydantic v2): GPUs with their calibration (per framework and family) and systems
with their network tiers, price and power; and ``Strict``, the base of every problem shape (model/spec.py re-exports
all of them). SI units throughout (bytes, seconds, FLOP/s, bytes/s, W, US$).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

Precision = Literal["bf16", "fp16", "fp8", "fp32", "tf32", "int8", "int4", "fp4"]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
# The software platform a GPU's frameworks are built for: the same framework (vLLM, SGLang, PyTorch) runs other
# kernels on each (CUDA: cuBLAS / CUTLASS / FlashAttention / FlashInfer; ROCm: hipBLASLt / Composable Kernel / AITER)
Platform = Literal["cuda", "rocm"]


class Strict(BaseModel):
    """Base: unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Calibration(Strict):
    """Per-GPU-type efficiency factors (never per test case). ``source`` says where they come from."""

    gemm_eff: Fraction = Field(description="fraction of peak FLOP/s reached by large bf16 GEMMs")
    gemm_half_dim: float = Field(
        ge=0.0, description="per-GPU GEMM dimension at which efficiency halves: eff = gemm_eff * d / (d + half)"
    )
    attn_eff: Fraction = Field(description="fraction of peak reached by fused/flash attention kernels")
    hbm_eff: Fraction = Field(description="fraction of HBM bandwidth reached by memory-bound kernels")
    layer_overhead_s: float = Field(
        0.0, ge=0.0, description="fixed kernel-launch/framework time per transformer layer per micro-batch pass"
    )
    grouped_gemm_ratio: Fraction = Field(
        0.61,
        description="MoE grouped-GEMM efficiency relative to dense GEMMs; default from B200 measurements "
        "(grouped 0.30 / dense 0.49 of peak, docs/reference/hardware.md)",
    )
    fp8_gemm_eff: Fraction | None = Field(
        None, description="fraction of the FP8 peak reached by large FP8 GEMMs; default: gemm_eff"
    )
    mxfp8_gemm_ratio: Fraction = Field(
        1.0, description="MXFP8 (block-scaled) GEMM throughput relative to per-tensor-scaled FP8 GEMMs"
    )
    prior_kind: Literal["datasheet", "fitted"] = Field(
        "datasheet",
        description="datasheet: initial values (moved by a framework family's pooled fit where the GPU has no fit "
        "of its own); fitted: the prior is itself a fit on measured runs (the A100 sets) and is used as it is",
    )
    source: str

    def value(self, name: str) -> float:
        """A fitted field's value (fp8_gemm_eff unset follows gemm_eff)."""
        v = getattr(self, name)
        return float(self.gemm_eff if v is None else v)

    def scaled(self, factors: Mapping[str, float]) -> Calibration:
        """Moved by a fit's factors: value = own value x factor (capped at 1), layer_overhead_s + increment (s).
        An unset fp8_gemm_eff without a factor of its own keeps following gemm_eff."""
        update: dict[str, float] = {}
        for name, f in factors.items():
            own = self.value(name)
            update[name] = max(0.0, own + f) if name == "layer_overhead_s" else min(1.0, own * f)
        return self.model_copy(update=update)


class TrainingFramework(StrEnum):
    """The training frameworks the cost model prices. Compare ``stack.framework`` with these members, never with a
    bare string: a misspelled member is an AttributeError (and a mypy error), a misspelled string a silent False."""

    MEGATRON_CORE = "megatron-core"
    TORCHTITAN = "torchtitan"
    PYTORCH_FSDP = "pytorch-fsdp"


# the problem file's field (a Literal keeps its values plain strings in records and dumps); tests/test_frameworks.py
# checks that it names exactly the TrainingFramework members
Framework = Literal["megatron-core", "torchtitan", "pytorch-fsdp"]
FRAMEWORKS: tuple[str, ...] = tuple(f.value for f in TrainingFramework)
# Software family of each training framework, whose pooled fit prices a GPU without a fit of its own: Megatron-Core
# (Transformer Engine kernels, distributed optimizer) vs PyTorch-native FSDP (torchtitan: FSDP2; pytorch-fsdp: FSDP1
# as in llm-foundry; eager PyTorch / torch.compile kernels and SDPA attention).
FRAMEWORK_FAMILY: dict[str, str] = {
    "megatron-core": "megatron", "torchtitan": "pytorch-fsdp", "pytorch-fsdp": "pytorch-fsdp"
}
# serving runtimes (inference tasks; default vllm there): priced by data/serving_calibration.yaml
ServingFrameworkName = Literal["vllm", "tensorrt-llm", "sglang", "atom"]


class FrameworkFit(Strict):
    """How one (GPU, framework) calibration was fitted: the runs, their sources and the errors (fractions)."""

    runs: int = Field(ge=0)
    sources: list[str]
    fitted: list[str] = Field(description="calibration fields fitted on the runs (the rest keep the GPU prior)")
    in_sample_median_err: float = Field(ge=0.0)
    loso_median_err: float | None = Field(None, ge=0.0, description="leave-one-source-out median |error|")
    method: str


class FrameworkCalibration(Strict):
    """Fitted overrides of a GPU's calibration for one software framework, with the record of the fit."""

    gemm_eff: Fraction | None = None
    gemm_half_dim: float | None = Field(None, ge=0.0)
    attn_eff: Fraction | None = None
    hbm_eff: Fraction | None = None
    layer_overhead_s: float | None = Field(None, ge=0.0)
    fp8_gemm_eff: Fraction | None = None
    mxfp8_gemm_ratio: Fraction | None = None
    grouped_gemm_ratio: Fraction | None = None
    fit: FrameworkFit

    def overrides(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump(exclude={"fit"}).items() if v is not None}


class FamilyCalibration(Strict):
    """A framework family's fit pooled over its GPUs and frameworks: factors on each GPU's datasheet prior."""

    name: str
    frameworks: list[Framework]
    factors: dict[str, float] = Field(description="per fitted field: factor on the prior (layer_overhead_s: + s)")
    fit: FrameworkFit


class GPU(Strict):
    name: str
    description: str = ""
    peak_flops: dict[Precision, PositiveFloat] = Field(description="dense peak FLOP/s per precision")
    hbm_bytes: PositiveFloat
    hbm_bw: PositiveFloat = Field(description="HBM bandwidth, bytes/s")
    tdp_w: PositiveFloat
    standard_system: str | None = Field(
        None, description="catalog system that `hardware: {gpu: NAME}` stands for (its standard node)"
    )
    calibration: Calibration
    frameworks: dict[Framework, FrameworkCalibration] = Field(
        default_factory=dict, description="fitted calibration per software framework (measured runs)"
    )
    platform: Platform = Field(
        description="the software platform the frameworks build their kernels for on this GPU (cuda: NVIDIA; rocm: "
        "AMD); the hardware order compares only GPUs of one platform (``dominates``)"
    )
    source: str


TRAINING_PEAKS: tuple[str, ...] = ("bf16", "fp16", "fp8")  # the peaks a training plan is priced with


def dominates(x: GPU, y: GPU, peaks: tuple[str, ...] = TRAINING_PEAKS) -> bool:
    """``x`` is at least as good as ``y`` on every datasheet figure that prices a plan: the peak of each precision in
    ``peaks`` that ``y`` lists (training: TRAINING_PEAKS; serving adds fp4, model/serving_calibration.py), HBM
    capacity and HBM bandwidth; and both run the same software ``platform``. The one definition of hardware
    dominance: training's calibration order (io/calibration.py) and serving's (model/serving_calibration.py) both use
    it. GPUs of different platforms are never ordered: a framework's ROCm build runs other kernels than its CUDA
    build (docs/serving.md, "The hardware order"), so the datasheet alone does not say which one runs a plan faster."""
    return (x.platform == y.platform
            and all(x.peak_flops.get(p, 0.0) >= y.peak_flops[p]
                for p in peaks if p in y.peak_flops)
            and x.hbm_bytes >= y.hbm_bytes and x.hbm_bw >= y.hbm_bw)



P = TypeVar("P")
# (params of x, x, params of y, y, raise_) -> params of x raised to (raise_) or lowered to y's rates, moved fields
Bounder = Callable[[P, "GPU", P, "GPU", bool], tuple[P, list[str]]]


def hardware_order(spec: GPU, own: Callable[[str], tuple[P, int]], gpus: Mapping[str, GPU], bounded: Bounder[P],
                   peaks: tuple[str, ...], label: Callable[[str], str] = str) -> tuple[P, list[str]]:
    """The calibration parameters pricing ``spec`` in the hardware order over ``gpus`` (training's in
    io/calibration.py, serving's in model/serving_calibration.py): ``own(name)`` gives a GPU's own parameters and
    their trust (how much they rest on runs), ``bounded`` moves parameters to another GPU's rates. Two passes, so
    that the result is the same whatever order the GPUs come in and a GPU that dominates another is never priced
    below it: (1) the parameters are lowered to every GPU that strictly dominates ``spec`` with more trust; (2)
    raised to every GPU ``spec`` dominates with at least its trust, each taken as lowered by (1). Returns the
    parameters and the moves ("raised to LABEL: fields")."""
    cache: dict[str, tuple[P, int]] = {}

    def own_of(name: str) -> tuple[P, int]:
        if name not in cache:
            cache[name] = own(name)
        return cache[name]

    def lowered(g: GPU, params: P, level: int, moves: list[str] | None) -> P:
        for name, other in gpus.items():
            if name != g.name and dominates(other, g, peaks) and not dominates(g, other, peaks):
                q, t = own_of(name)
                if t > level:
                    params, fields = bounded(params, g, q, other, False)
                    if fields and moves is not None:
                        moves.append(f"lowered to {label(name)}: {', '.join(fields)}")
        return params

    moves: list[str] = []
    mine, level = own_of(spec.name)
    params = lowered(spec, mine, level, moves)
    for name, other in gpus.items():
        if name != spec.name and dominates(spec, other, peaks):
            q, t = own_of(name)
            if t >= level:
                params, fields = bounded(params, spec, lowered(other, q, t, None), other, True)
                if fields:
                    moves.append(f"raised to {label(name)}: {', '.join(fields)}")
    return params, moves

class Tier(Strict):
    """One level of the network: GPUs in one domain of this tier, per-GPU one-way bandwidth, latency."""

    name: str
    size: PositiveInt | None = Field(None, description="GPUs in one domain; None for the outermost tier")
    bw: PositiveFloat = Field(description="one-direction bandwidth per GPU, bytes/s")
    latency_s: float = Field(ge=0.0)
    efficiency: Fraction = Field(description="achieved fraction of bw for large collectives (NCCL bus bw)")


class System(Strict):
    name: str
    description: str = ""
    gpu: str
    gpus_per_node: PositiveInt
    tiers: list[Tier] = Field(min_length=1, max_length=3)
    price_per_gpu_hour: float = Field(ge=0.0, description="US$ per GPU-hour")
    power_w_per_gpu: PositiveFloat = Field(description="wall power per GPU incl. host share, W")
    source: str

    @model_validator(mode="after")
    def _tiers_nest(self) -> System:
        sizes = [t.size for t in self.tiers]
        if sizes[-1] is not None:
            raise ValueError("the last tier must have size null (it spans the whole cluster)")
        inner = [s for s in sizes[:-1]]
        if any(s is None for s in inner):
            raise ValueError("only the last tier may have size null")
        prev = 1
        for s in inner:
            assert s is not None
            if s % prev or s <= prev:
                raise ValueError(f"tier sizes must nest (each a multiple of the previous), got {sizes}")
            prev = s
        return self
