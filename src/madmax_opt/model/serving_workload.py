"""Serving plans as columns, the model lowered once with its request mix, precisions and KV-cache sizes.

Shared by the serving cost model (``inference``) and the search (``search.serving_space``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields

import numpy as np

from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.model.spec import InferenceTask, RequestShape, Stack, Task, TransformerModel
from madmax_opt.model.workload import TransformerWorkload, lower

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
# NVFP4: E2M1 values with one E4M3 scale per 16-value block = 4 + 8/16 bits (NVIDIA Blackwell NVFP4 format)
BYTES_PER_VALUE: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5625,
}
# GEMM math precision per weight precision: fp8/int8 are W8A8 (TensorRT-LLM FP8, SmoothQuant), fp4 is W4A4 NVFP4
# (Blackwell FP4 tensor cores), int4 is weight-only W4A16 (AWQ/GPTQ dequantise to 16 bit): memory, not FLOPs.
GEMM_PRECISION: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "bf16",
    "fp4": "fp4",
}
# NVFP4 checkpoints (TensorRT-LLM / ModelOpt) keep an FP8 KV cache
DEFAULT_KV_PRECISION: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "bf16",
    "fp4": "fp8",
}
# Weight-only fallback: a GPU without tensor cores for a weight format runs it dequantised into 16-bit GEMMs (W4A16:
# vLLM's Marlin / Triton MXFP4 MoE kernels for gpt-oss on Hopper, vllm/model_executor/layers/quantization/mxfp4.py)
WEIGHT_ONLY_GEMM: dict[str, str] = {"fp4": "bf16", "int4": "bf16"}


@dataclass(frozen=True)
class PrecisionParts:
    """A serving precision in three parts: stored weights, GEMM inputs (activations and the math), KV cache. The
    task's ``precision`` is the short form (the weights'); the GEMM part follows the GPU (``precision_parts``)."""

    weights: str
    gemm: str
    kv: str


def gemm_precision(precision: str, peak_flops: Collection[str]) -> str | None:
    """The GEMM precision ``precision`` weights run at on a GPU with these peaks: W8A8 / W4A4 where the tensor cores
    exist, else the weight-only fallback (fp4 -> bf16 math), else None (fp8 before Hopper)."""
    native = GEMM_PRECISION[precision]
    if native in peak_flops:
        return native
    fallback = WEIGHT_ONLY_GEMM.get(precision)
    return fallback if fallback is not None and fallback in peak_flops else None


def precision_parts(precision: str, peak_flops: Collection[str], kv_precision: str | None) -> PrecisionParts | None:
    """(weights, GEMM, KV) of a short-form precision on a GPU; None where the GPU cannot run it."""
    gemm = gemm_precision(precision, peak_flops)
    if gemm is None:
        return None
    return PrecisionParts(weights=precision, gemm=gemm, kv=kv_precision or DEFAULT_KV_PRECISION[precision])


LOGIT_BYTES = 4.0  # fp32 logits of the last position of each sequence (sampling)
# Tokens of one batched prefill pass (vLLM max_num_batched_tokens / TensorRT-LLM max_num_tokens default 8192):
# prompts shorter than this are prefilled k = floor(8192 / p) at a time for throughput.
PREFILL_PASS_TOKENS = 8192.0
STEP_TERMS: tuple[str, ...] = (
    "gemm",
    "attention",
    "elementwise",
    "tp_comm",
    "expert_gemm",
    "ep_comm",
    "overhead",
    "head",
    "pp_comm",
    "draft",
    "prefill",
    "kv_transfer",
)

INVALID_REASONS: dict[int, str] = {
    1: "dp*tp*pp must equal the number of GPUs",
    2: "tp must divide heads and divide kv_heads or be a multiple of them (KV heads are replicated)",
    3: "pp must divide the number of layers",
    4: "tp must divide the scale-up domain or be a multiple of it",
    5: "the GPU has no peak FLOP/s for this precision (e.g. fp8 needs Hopper or newer)",
    6: "prefill_replicas must be 0 without disaggregation, and below dp with it (decode needs a replica)",
    7: "weights, activations and the KV cache of one sequence exceed the GPU memory",
    8: "ep must be 1 for a dense model; for MoE, 1 or a multiple of tp that divides dp x tp and the experts "
    "(ep > tp, experts shared by attention replicas, is not modelled with disaggregated prefill)",
}
MEMORY_REASON = 7


@dataclass(frozen=True)
class ServingArrays:
    """Serving plans as columns: ``precision`` indexes PRECISIONS, ``hw`` the problem's hardware options."""

    dp: IntArr
    tp: IntArr
    pp: IntArr
    batch: IntArr  # offered concurrency per (decode) replica: requests in the system, running or queued
    precision: IntArr
    prefill_dp: IntArr  # replicas that only prefill (disaggregated); 0 = prefill interleaved with decode
    hw: IntArr
    ep: IntArr  # expert parallelism (MoE): GPUs one layer's experts are spread over
    max_seqs: IntArr  # cap on the running batch (max_num_seqs); 0 = the framework's default

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def gpus(self) -> IntArr:
        return self.dp * self.tp * self.pp

    def take(self, index: IntArr | list[int]) -> ServingArrays:
        idx = np.asarray(index, dtype=np.int64)
        return ServingArrays(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def concat(parts: list[ServingArrays]) -> ServingArrays:
        return ServingArrays(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ServingArrays)}
        )

    @staticmethod
    def empty() -> ServingArrays:
        return ServingArrays(*(np.zeros(0, dtype=np.int64) for _ in fields(ServingArrays)))


@dataclass(frozen=True)
class ServingWorkload:
    """The model lowered once (GEMM shapes, parameters, per-token bytes) plus the request mix."""

    wl: TransformerWorkload
    requests: tuple[RequestShape, ...]
    share: Arr  # request shares, summing to 1

    @property
    def model(self) -> TransformerModel:
        return self.wl.model

    @property
    def attn_flops_per_key(self) -> float:
        """QK^T + AV FLOPs of one query token against one key, all heads, in prefill: 4 a d_h (workload, per key);
        MLA: the decompressed multi-head form, 2 a (d_nope + d_rope + d_v) (``mla_attn_flops_per_key``)."""
        if self.model.mla_kv_dim is not None:
            return mla_attn_flops_per_key(self.model, decode=False)
        return self.wl.attn_flops_per_token / self.wl.seq_len

    @property
    def decode_attn_flops_per_key(self) -> float:
        """The same in decode: as in prefill, except MLA's absorbed form over the cached latent
        (``mla_attn_flops_per_key``)."""
        if self.model.mla_kv_dim is not None:
            return mla_attn_flops_per_key(self.model, decode=True)
        return self.attn_flops_per_key

    @property
    def mean_output(self) -> float:
        return float(sum(w * r.output_len for w, r in zip(self.share, self.requests, strict=True)))

    def running_mean(self, per_request: list[float]) -> float:
        """Mean over running sequences: a request of output o stays o decode steps, so it weighs share * o."""
        num = sum(
            w * r.output_len * v for w, r, v in zip(self.share, self.requests, per_request, strict=True)
        )
        return float(num / self.mean_output)

    @property
    def mean_context(self) -> float:
        """Keys a decode step attends to, averaged over running sequences: p + o/2 (context grows 1 per step)."""
        return self.running_mean([r.prompt_len + r.output_len / 2.0 for r in self.requests])

    @property
    def tokens_held(self) -> float:
        """KV-cache tokens reserved per running sequence: its full p + o (no preemption)."""
        return self.running_mean([float(r.prompt_len + r.output_len) for r in self.requests])

    @property
    def tokens_held_on_demand(self) -> float:
        """KV-cache tokens a running sequence holds on average when blocks are allocated as it grows: p + o/2."""
        return self.mean_context


def serving_workload(model: TransformerModel, task: InferenceTask, stack: Stack) -> ServingWorkload:
    reqs = tuple(task.requests())
    longest = max(r.prompt_len + r.output_len for r in reqs)
    wl = lower(model, Task(kind="pretrain", seq_len=longest, global_batch=1), stack)  # shapes only
    weights = np.array([r.weight for r in reqs], dtype=np.float64)
    return ServingWorkload(wl=wl, requests=reqs, share=weights / weights.sum())


def mla_attn_flops_per_key(model: TransformerModel, *, decode: bool) -> float:
    """Attention FLOPs of one query token against one key, all heads a, for MLA (DeepSeek-V2, arXiv 2405.04434,
    Sec. 2.1.2-2.1.3). Prefill runs the decompressed multi-head form: QK^T over d_nope + d_rope = 192 and AV over
    d_v = 128 per head, 2 a (192 + 128). Decode runs the absorbed form (W_UK into the query, W_UV after the
    attention), each head attending the cached latent directly: QK^T over the latent and rope key (mla_kv_dim =
    576) and AV over the latent (kv_lora_rank = 512), 2 a (576 + 512): 9.7x the MHA-of-head-dim-56 count, which
    makes MLA decode attention compute-bound (FlashMLA README: 'computation-bound' configurations at up to 580 - 660
    TFLOPS on H800). The widths are the catalog model's (``TransformerModel.mla``)."""
    mla = model.mla
    assert mla is not None
    heads = float(model.heads)
    if decode:
        return 2.0 * heads * (mla.kv_dim + mla.kv_lora_rank)
    return 2.0 * heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)


def kv_bytes_per_token(model: TransformerModel, kv_bytes_per_value: float) -> float:
    """KV cache of one token, whole model: 2 (K and V) x layers x kv_heads x head_dim x bytes (GQA: kv_heads);
    MLA: layers x latent width x bytes (DeepSeek-V2 Sec. 2.1: the compressed c_KV and the rope key are cached)."""
    if model.mla_kv_dim is not None:
        return float(model.layers * model.mla_kv_dim * kv_bytes_per_value)
    return 2.0 * model.layers * model.n_kv_heads * model.head_dim * kv_bytes_per_value


def kv_heads_per_gpu(model: TransformerModel, tp: Arr) -> Arr:
    """KV heads one TP rank holds: kv_heads / tp, or 1 when tp > kv_heads (each rank keeps a replica)."""
    return np.maximum(model.n_kv_heads / tp, 1.0)


def kv_values_per_gpu(model: TransformerModel, tp: Arr) -> Arr:
    """KV values of one token and layer on one GPU: 2 kv_heads/tp head_dim; MLA: the whole latent on every rank."""
    if model.mla_kv_dim is not None:
        return float(model.mla_kv_dim) * np.ones_like(tp)
    return 2.0 * kv_heads_per_gpu(model, tp) * model.head_dim
