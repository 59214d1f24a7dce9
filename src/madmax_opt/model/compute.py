"""Compute-time terms: GEMMs with shape-aware efficiency, attention kernels and memory-bound ops (vectorised), and
the measured utilisation ceilings no compute pass exceeds."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import yaml

from madmax_opt.core.numeric import Arr


def gemm_efficiency(dim: Arr, eff_max: Arr, half_dim: Arr) -> Arr:
    """eff = eff_max * d / (d + d_half): small per-GPU GEMM dimensions fill fewer tiles/SMs (saturating fit)."""
    return eff_max * dim / (dim + half_dim)


def gemm_time_s(flops: Arr, dim: Arr, peak_flops: Arr, eff_max: Arr, half_dim: Arr) -> Arr:
    """t = FLOPs / (peak x eff(d)), d = smallest per-GPU dimension of the GEMM."""
    return flops / (peak_flops * gemm_efficiency(dim, eff_max, half_dim))


def memory_bound_time_s(bytes_moved: Arr, hbm_bw_achieved: Arr) -> Arr:
    """t = bytes / (HBM bandwidth x hbm_eff) for elementwise/normalisation kernels."""
    return bytes_moved / hbm_bw_achieved


LOW_PRECISION_GEMMS: tuple[str, ...] = ("fp8", "mxfp8")
# HBM bytes per element of a GEMM operand to quantise it for an FP8 GEMM (Transformer Engine cast-transpose kernels):
# fp8 per-tensor current scaling = amax pass (read 2 B) + cast + transpose (read 2 B, write 1 B row-wise + 1 B
# column-wise) = 6 B (TE Float8CurrentScaling; Megatron-Bridge "FP8-CS"); mxfp8 = one pass writing both copies and
# one E8M0 scale per 32 elements, no amax pass = 2 + 2 * (1 + 1/32) B (TE MXFP8BlockScaling, OCP MX spec v1.0).
CAST_BYTES_PER_ELEMENT: dict[str, float] = {"fp8": 6.0, "mxfp8": 2.0 + 2.0 * (1.0 + 1.0 / 32.0)}
# Extra weight copies Transformer Engine keeps for FP8 GEMMs: the quantised weight and its transpose, 1 B each
# (+ the MX scales): TE Linear caches them across micro-batches (``is_first_microbatch``) under Megatron-Core.
FP8_WEIGHT_COPY_BYTES: dict[str, float] = {"fp8": 2.0, "mxfp8": 2.0 * (1.0 + 1.0 / 32.0)}


def cast_time_s(elements: Arr, precision: str, hbm_bw_achieved: Arr) -> Arr:
    """t = elements x cast bytes per element / achieved HBM bandwidth (0 for bf16/fp16 GEMMs)."""
    return elements * CAST_BYTES_PER_ELEMENT.get(precision, 0.0) / hbm_bw_achieved


# ---- utilisation ceilings: the best MFU / HFU measured per GPU and precision (data/utilization_ceilings.yaml) ----
CEILINGS_FILE = ("data", "utilization_ceilings.yaml")
UNMEASURED_PRECISIONS: dict[str, str] = {"fp16": "bf16", "tf32": "bf16", "fp32": "bf16"}  # no runs: bf16's values


@dataclass(frozen=True)
class Ceiling:
    """Best measured utilisation of a (GPU, precision) over the peak: ``hfu`` (executed FLOPs: the ceiling the model
    enforces on every compute pass) and ``mfu`` (model FLOPs; lower where the best runs recomputed activations)."""

    mfu: float
    hfu: float
    source: str


@cache
def _ceiling_data() -> dict[str, Any]:
    text = resources.files("madmax_opt").joinpath(*CEILINGS_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def utilization_ceiling(gpu: str, precision: str) -> Ceiling:
    """The GPU's own entry (a derived GPU ``base+change`` takes its base's), else the best on any GPU at the
    precision; HFU is never below MFU (executed FLOPs include the model's)."""
    data = _ceiling_data()
    prec = UNMEASURED_PRECISIONS.get(precision, precision)
    entry = data["gpus"].get(gpu.split("+", 1)[0], {}).get(prec) or data["any"][prec]
    return Ceiling(float(entry["mfu"]), max(float(entry["hfu"]), float(entry["mfu"])), str(entry["source"]))


def at_ceiling_s(time_s: Arr, flops: Arr, peak_flops: Arr, ceiling: Arr) -> Arr:
    """t = max(t, FLOPs / (peak x ceiling)): no pass runs faster than the best utilisation ever measured."""
    return np.maximum(time_s, flops / (peak_flops * ceiling))
