"""Hardware options (a system at a cluster size), the trust record of their calibration, and their parameters as
arrays indexed by option."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from madmax_opt.model.collectives import Tiers
from madmax_opt.model.spec import GPU, System

MAX_TIERS = 3


class StepInterval(BaseModel):
    """The 80 % interval of a predicted step time: [lo x predicted, hi x predicted] (data/training_intervals.yaml)."""

    lo: float
    hi: float
    coverage: float = Field(description="nominal coverage of the interval")
    runs: int = Field(description="residuals it was built from")
    basis: str = Field(description="own: the family's runs at this level; pooled over families")
    loso_coverage: float | None = Field(None, description="measured leave-one-source-out coverage of its residuals")


class CalibrationRecord(BaseModel):
    """How much to trust a prediction: the calibration that priced it and its validation error (fractions)."""

    gpu: str
    framework: str
    status: Literal["calibrated", "uncalibrated"]
    level: str | None = Field(None, description="what priced it: calibrated (the pair's fit), family:NAME, prior")
    runs: int = 0
    sources: list[str] = Field(default_factory=list)
    in_sample_median_err: float | None = None
    loso_median_err: float | None = None
    uncalibrated_on: list[str] = Field(
        default_factory=list, description="serving: why a pair fitted on its runs is uncalibrated (the fit record's "
        "uncalibrated_on: in-sample, held-out points, unseen sources)")
    interval: StepInterval | None = Field(None, description="80 % interval of the step time at this level")
    ordered: list[str] = Field(
        default_factory=list, description="hardware order (serving, model/serving_calibration.ordered): the GPUs "
        "/ frameworks whose rates this calibration was raised or lowered to, with the fields that moved"
    )


@dataclass(frozen=True)
class HardwareOption:
    """One hardware choice of a problem: ``gpus`` GPUs of ``system``; a training problem's options carry the trust
    record of the calibration that prices them (resolved by io/calibration.py)."""

    system: System
    gpu: GPU
    gpus: int
    supply: int | None = None
    calibration_record: CalibrationRecord | None = None

    @property
    def name(self) -> str:
        return f"{self.system.name}x{self.gpus}"

    @property
    def price_per_hour(self) -> float:
        return self.system.price_per_gpu_hour * self.gpus


@dataclass(frozen=True)
class HardwareTable:
    """Columns of per-option parameters; index them with a plan's ``hw`` array."""

    options: tuple[HardwareOption, ...]
    gpus: NDArray[np.float64] = field(init=False)
    gpus_per_node: NDArray[np.float64] = field(init=False)
    hbm_bytes: NDArray[np.float64] = field(init=False)
    hbm_bw: NDArray[np.float64] = field(init=False)  # achieved: bandwidth x hbm_eff
    gemm_eff: NDArray[np.float64] = field(init=False)
    gemm_half_dim: NDArray[np.float64] = field(init=False)
    attn_eff: NDArray[np.float64] = field(init=False)
    layer_overhead_s: NDArray[np.float64] = field(init=False)
    grouped_gemm_ratio: NDArray[np.float64] = field(init=False)
    fp8_gemm_eff: NDArray[np.float64] = field(init=False)
    mxfp8_gemm_ratio: NDArray[np.float64] = field(init=False)
    price_per_gpu_hour: NDArray[np.float64] = field(init=False)
    power_w_per_gpu: NDArray[np.float64] = field(init=False)
    tier_size: NDArray[np.float64] = field(init=False)  # (MAX_TIERS, n_options)
    tier_bw: NDArray[np.float64] = field(init=False)
    tier_latency_s: NDArray[np.float64] = field(init=False)
    tier_rows: NDArray[np.int64] = field(init=False)  # rows of the tier_* tables that ``tiers`` hands out

    def __post_init__(self) -> None:
        def col(fn: object) -> NDArray[np.float64]:
            return np.array([fn(o) for o in self.options], dtype=np.float64)  # type: ignore[operator]

        set_ = object.__setattr__
        set_(self, "gpus", col(lambda o: o.gpus))
        set_(self, "gpus_per_node", col(lambda o: o.system.gpus_per_node))
        set_(self, "hbm_bytes", col(lambda o: o.gpu.hbm_bytes))
        set_(self, "hbm_bw", col(lambda o: o.gpu.hbm_bw * o.gpu.calibration.hbm_eff))
        set_(self, "gemm_eff", col(lambda o: o.gpu.calibration.gemm_eff))
        set_(self, "gemm_half_dim", col(lambda o: o.gpu.calibration.gemm_half_dim))
        set_(self, "attn_eff", col(lambda o: o.gpu.calibration.attn_eff))
        set_(self, "layer_overhead_s", col(lambda o: o.gpu.calibration.layer_overhead_s))
        set_(self, "grouped_gemm_ratio", col(lambda o: o.gpu.calibration.grouped_gemm_ratio))
        set_(self, "fp8_gemm_eff", col(lambda o: o.gpu.calibration.fp8_gemm_eff or o.gpu.calibration.gemm_eff))
        set_(self, "mxfp8_gemm_ratio", col(lambda o: o.gpu.calibration.mxfp8_gemm_ratio))
        set_(self, "price_per_gpu_hour", col(lambda o: o.system.price_per_gpu_hour))
        set_(self, "power_w_per_gpu", col(lambda o: o.system.power_w_per_gpu))
        size = np.full((MAX_TIERS, len(self.options)), np.inf)
        bw = np.zeros((MAX_TIERS, len(self.options)))
        lat = np.zeros((MAX_TIERS, len(self.options)))
        for j, o in enumerate(self.options):
            tiers = list(o.system.tiers)
            # pad at the front with copies of the innermost tier: a repeated size spans no new domain
            padded = [tiers[0]] * (MAX_TIERS - len(tiers)) + tiers
            for i, t in enumerate(padded):
                size[i, j] = np.inf if t.size is None else t.size
                bw[i, j] = t.bw * t.efficiency
                lat[i, j] = t.latency_s
        set_(self, "tier_size", size)
        set_(self, "tier_bw", bw)
        set_(self, "tier_latency_s", lat)
        # rows that open a new domain for some option; a padded copy (same size as the row before) adds no
        # collective phase, so ``tiers`` leaves it out and every collective does a third less work
        rows = [i for i in range(MAX_TIERS) if i == 0 or np.any(size[i] != size[i - 1])]
        set_(self, "tier_rows", np.array(rows, dtype=np.int64))

    def peak_flops(self, precision: str) -> NDArray[np.float64]:
        precision = "fp8" if precision == "mxfp8" else precision  # block scaling runs on the FP8 tensor cores
        out = []
        for o in self.options:
            peaks = o.gpu.peak_flops
            if precision not in peaks:
                raise ValueError(f"GPU {o.gpu.name} has no {precision} peak in the catalog")
            out.append(peaks[precision])
        return np.array(out, dtype=np.float64)

    def tiers(self, hw: NDArray[np.int64]) -> Tiers:
        """The tiers of the options ``hw`` (one column per plan), padded copies left out."""
        rows = self.tier_rows
        size, bw, lat = self.tier_size[rows], self.tier_bw[rows], self.tier_latency_s[rows]
        return Tiers(size=size[:, hw], bw=bw[:, hw], latency_s=lat[:, hw])
