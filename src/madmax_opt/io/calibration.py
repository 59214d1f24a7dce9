"""Which calibration prices a plan: an overlay file, the GPU's fit for the problem's framework, the framework
family's pooled fit, or the prior.

A GPU's catalog entry holds a prior ``calibration`` (datasheet-based initial values, or the A100 fit) and fitted
``frameworks.<name>`` overrides with the record of their fit. A problem file may name an overlay written by
``madmax-opt calibrate`` (``calibration: cluster.yaml``, relative to the problem file) whose entries replace the
catalog's fit for their (GPU, framework): ``calibrations`` in training problems, ``serving`` (serving parameters,
io.serving_catalog.serving_data) in inference problems. A pair with no fit is flagged ``uncalibrated`` and priced with its
framework family's fit pooled over the measured GPUs (``data/training_families.yaml``: factors on the datasheet
prior; level ``family``), or with the prior itself (level ``prior``) where the family has no fit or the prior is a
fit of its own (``prior_kind: fitted``, the A100s).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.model.hardware import CalibrationRecord, HardwareOption, StepInterval
from madmax_opt.model.hardware_spec import TRAINING_PEAKS, hardware_order
from madmax_opt.model.serving_calibration import FitRecord, ServingParams
from madmax_opt.model.spec import (
    FRAMEWORK_FAMILY,
    GPU,
    Calibration,
    FamilyCalibration,
    Framework,
    FrameworkCalibration,
    ServingFrameworkName,
    Strict,
)

OVERLAY_KIND = "madmax-opt calibration overlay"


class OverlayEntry(FrameworkCalibration):
    """One fitted (GPU, framework) calibration of an overlay file."""

    gpu: str
    framework: Framework


class ServingOverlayFit(FitRecord):
    """The record of a serving fit to a user's runs (``studies.serving_calibrate``): FitRecord's fields (residuals:
    ln(predicted / measured) of every metric in sample) plus what the fit started from and its leave-one-run-out
    errors."""

    prior: str = Field(description="the calibration the fit started from (and is pulled towards)")
    metrics: list[str] = Field(default_factory=list, description="run:metric of each residual, in order")
    loo_median_err: float | None = Field(None, description="median |error| of each run's metrics predicted by the "
                                         "fit of the other runs (None: a single run)")
    loo_errors: list[float] = Field(default_factory=list, description="predicted / measured - 1 per metric, left out")


class ServingOverlayEntry(Strict):
    """One fitted (GPU, serving framework) calibration of an overlay file: it replaces the catalog's entry of the
    pair in data/serving_calibration.yaml for the problems that name the overlay."""

    gpu: str
    framework: ServingFrameworkName
    params: ServingParams
    fit: ServingOverlayFit


class Overlay(Strict):
    """An overlay file written by ``madmax-opt calibrate``: training fits (``calibrations``) and serving fits
    (``serving``); at least one entry."""

    kind: Literal["madmax-opt calibration overlay"] = "madmax-opt calibration overlay"
    calibrations: list[OverlayEntry] = Field(default_factory=list)
    serving: list[ServingOverlayEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> Overlay:
        if not self.calibrations and not self.serving:
            raise ValueError("no entry; allowed: at least one entry in calibrations (training) or serving")
        return self


@cache
def intervals() -> dict[str, dict[str, StepInterval]]:
    """family -> level -> interval, from data/training_intervals.yaml (``madmax-opt validate --write-catalog``)."""
    text = resources.files("madmax_opt").joinpath("data", "training_intervals.yaml").read_text(encoding="utf-8")
    raw: dict[str, Any] = yaml.safe_load(text)
    coverage = float(raw.pop("coverage"))
    return {fam: {lv: StepInterval(coverage=coverage, **{k: v for k, v in d.items() if k != "sources"})
                  for lv, d in levels.items()} for fam, levels in raw.items()}


def step_interval(framework: str, level: str | None) -> StepInterval | None:
    """The interval of a prediction priced at ``level`` (calibrated, family:NAME, prior) under ``framework``: its
    family's row, else the level pooled over families."""
    kind = "family" if level and level.startswith("family:") else (level or "prior")
    table = intervals()
    own = table.get(FRAMEWORK_FAMILY.get(framework, ""), {}).get(kind)
    return own if own is not None else table.get("pooled", {}).get(kind)


def check_overlay_file(path: Path, *, file: str | None, field: str = "calibration") -> None:
    """A missing overlay is a one-line error naming the problem file and its field (problem.py reads the file)."""
    if not path.is_file():
        raise ProblemError(f"overlay file not found (looked for {path.resolve()}); allowed: a file written by "
                           "madmax-opt calibrate, relative to the problem file", file=file, field=field)


def _fitted_values(current: Calibration, prior: Calibration, fitted: FrameworkCalibration) -> dict[str, float]:
    """The fit applied to ``current`` as the fit moved the prior: efficiencies x fit / prior (capped at 1), the
    overhead + (fit - prior). On a catalog GPU current = prior, so this is the fit itself; a what-if GPU (``derive``:
    gemm_efficiency x 1.25) keeps its scaling on top of the fit."""
    out: dict[str, float] = {}
    for name, value in fitted.overrides().items():
        if name == "layer_overhead_s":
            out[name] = max(0.0, current.layer_overhead_s + value - prior.layer_overhead_s)
            continue
        cur = getattr(current, name)
        base = getattr(prior, name)
        cur = current.gemm_eff if cur is None else cur  # fp8_gemm_eff unset = gemm_eff
        base = prior.gemm_eff if base is None else base
        scaled = cur * value / base if base else value
        out[name] = scaled if name == "gemm_half_dim" else min(1.0, scaled)
    return out


def with_framework(gpu: GPU, framework: str, overlay: Overlay | None = None) -> GPU:
    """The GPU with the calibration that prices ``framework``: the overlay's fit, else the catalog's, else the
    family's or the prior; then ordered against every catalog GPU of its software platform it dominates or is
    dominated by (hardware_spec.hardware_order with ``bounded``; ``dominates`` compares only GPUs of one platform:
    Megatron-Core / Transformer Engine and PyTorch run other kernels on ROCm than on CUDA)."""
    own = _own(gpu, framework, overlay)
    base = gpu.name.split("+", 1)[0]  # a derived what-if GPU is not ordered against the GPU it was derived from

    def own_of(name: str) -> tuple[Calibration, int]:
        g = own if name == gpu.name else _own(catalog.gpus()[name], framework, overlay)
        return g.calibration, trust(g, framework, overlay)

    others = {n: g for n, g in catalog.gpus().items() if n != base}
    calibration, _ = hardware_order(gpu, own_of, others, bounded, TRAINING_PEAKS)
    return own.model_copy(update={"calibration": calibration})


def trust(gpu: GPU, framework: str, overlay: Overlay | None = None) -> int:
    """How much the calibration pricing ``framework`` on ``gpu`` rests on runs: 3 the user's own fit (an overlay
    written by ``calibrate``: never moved), 2 a catalog fit of the pair (or a prior that is a fit), 1 the framework
    family's pooled fit, 0 the datasheet prior."""
    base = gpu.name.split("+", 1)[0]
    if overlay is not None and any(e.gpu == base and e.framework == framework for e in overlay.calibrations):
        return 3
    if framework in gpu.frameworks or gpu.calibration.prior_kind == "fitted":
        return 2
    return 1 if family_fit(gpu, framework) is not None else 0


def bounded(cal: Calibration, gpu: GPU, other_cal: Calibration, other: GPU, raise_: bool
            ) -> tuple[Calibration, list[str]]:
    """``cal`` (pricing ``gpu``) raised to (``raise_``: gpu dominates other) or lowered to ``other``'s absolute
    rates (peak x efficiency, HBM bandwidth x efficiency; GEMM half-dimension and per-layer overhead at most / at
    least, MoE and MXFP8 ratios at least / at most), and the fields that moved: training's bound for
    hardware_spec.hardware_order, which decides which GPU moves (the one whose calibration rests on fewer runs,
    ``trust``). Without the order, calibration levels (pair fit, family fit, prior) could price a better GPU slower
    than a worse one."""
    def ratio(p: str) -> float:
        return float(other.peak_flops.get(p, 0.0) / gpu.peak_flops.get(p, 1.0))  # type: ignore[call-overload]

    up, down = (max, min) if raise_ else (min, max)
    r16 = ratio("bf16")
    r8 = ratio("fp8") if "fp8" in other.peak_flops and "fp8" in gpu.peak_flops else r16
    gemm = up(cal.gemm_eff, min(1.0, other_cal.gemm_eff * r16))
    fp8 = up(cal.value("fp8_gemm_eff"), min(1.0, other_cal.value("fp8_gemm_eff") * r8))
    moved = cal.model_copy(update={
        "gemm_eff": gemm,
        "fp8_gemm_eff": fp8 if (cal.fp8_gemm_eff is not None or fp8 != gemm) else None,
        "gemm_half_dim": down(cal.gemm_half_dim, other_cal.gemm_half_dim),
        "attn_eff": up(cal.attn_eff, min(1.0, other_cal.attn_eff * r16)),
        "hbm_eff": up(cal.hbm_eff, min(1.0, other_cal.hbm_eff * other.hbm_bw / gpu.hbm_bw)),
        "layer_overhead_s": down(cal.layer_overhead_s, other_cal.layer_overhead_s),
        "grouped_gemm_ratio": up(cal.grouped_gemm_ratio, other_cal.grouped_gemm_ratio),
        "mxfp8_gemm_ratio": up(cal.mxfp8_gemm_ratio, other_cal.mxfp8_gemm_ratio),
    })
    return moved, sorted(k for k, v in moved.model_dump().items() if v != getattr(cal, k))


def _own(gpu: GPU, framework: str, overlay: Overlay | None = None) -> GPU:
    """The GPU with its own calibration for ``framework``: the overlay's fit, else the catalog's, else the family's
    pooled fit on the prior, else the prior."""
    frameworks = dict(gpu.frameworks)
    for e in overlay.calibrations if overlay else []:
        if e.gpu == gpu.name.split("+", 1)[0]:
            frameworks[e.framework] = FrameworkCalibration(**e.model_dump(exclude={"gpu", "framework"}))
    fitted = frameworks.get(framework)  # type: ignore[call-overload]
    if fitted is None:
        family = family_fit(gpu, framework)
        calibration = gpu.calibration if family is None else gpu.calibration.scaled(family.factors)
        return gpu.model_copy(update={"calibration": calibration, "frameworks": frameworks})
    # the prior the fit started from: the catalog entry (a derived GPU is named base+change, io/derive.py)
    base = catalog.gpus().get(gpu.name.split("+", 1)[0])
    prior = base.calibration if base is not None else gpu.calibration
    calibration = gpu.calibration.model_copy(update=_fitted_values(gpu.calibration, prior, fitted))
    return gpu.model_copy(update={"calibration": calibration, "frameworks": frameworks})


def apply(options: list[HardwareOption], framework: str, overlay: Overlay | None) -> list[HardwareOption]:
    """Every hardware option with its GPU's calibration for ``framework`` (``overlay`` first) and the trust record of
    that calibration (``record``), which the evaluator copies into every record."""
    return [with_record(replace(o, gpu=with_framework(o.gpu, framework, overlay)), framework) for o in options]


def with_record(option: HardwareOption, framework: str) -> HardwareOption:
    """``option`` carrying the trust record of its GPU's calibration under ``framework``."""
    return replace(option, calibration_record=record(option.gpu, framework))


def family_fit(gpu: GPU, framework: str) -> FamilyCalibration | None:
    """The pooled fit of ``framework``'s family that prices ``gpu`` when the pair has no fit (None: the prior)."""
    if gpu.calibration.prior_kind == "fitted":
        return None
    return catalog.families().get(FRAMEWORK_FAMILY.get(framework, ""))


def record(gpu: GPU, framework: str) -> CalibrationRecord:
    """The trust record of a prediction on ``gpu`` under ``framework``."""
    fitted = gpu.frameworks.get(framework)  # type: ignore[call-overload]
    family = family_fit(gpu, framework) if fitted is None else None
    if fitted is None and family is None:
        return CalibrationRecord(gpu=gpu.name, framework=framework, status="uncalibrated", level="prior",
                                 interval=step_interval(framework, "prior"))
    f = fitted.fit if fitted is not None else family.fit  # type: ignore[union-attr]
    return CalibrationRecord(gpu=gpu.name, framework=framework, runs=f.runs, sources=list(f.sources),
                             status="calibrated" if fitted is not None else "uncalibrated",
                             level="calibrated" if family is None else f"family:{family.name}",
                             in_sample_median_err=f.in_sample_median_err, loso_median_err=f.loso_median_err,
                             interval=step_interval(framework, "calibrated" if family is None else "family:"))


def record_dict(gpu: GPU, framework: str) -> dict[str, Any]:
    """``record`` as the JSON object of evaluate/solve records."""
    return record(gpu, framework).model_dump()
