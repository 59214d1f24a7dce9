"""Which calibration prices a plan: an overlay file, the GPU's fit for the problem's framework, the framework
family's pooled fit, or the prior.

A GPU's catalog entry holds a prior ``calibration`` (datasheet-based initial values, or the A100 fit) and fitted
``frameworks.<name>`` overrides with the record of their fit. A problem file may name an overlay written by
``madmax-opt calibrate`` (``calibration: cluster.yaml``, relative to the problem file) whose entries replace the
catalog's fit for their (GPU, framework). A pair with no fit is flagged ``uncalibrated`` and priced with its
framework family's fit pooled over the measured GPUs (``data/training_families.yaml``: factors on the datasheet
prior; level ``family``), or with the prior itself (level ``prior``) where the family has no fit or the prior is a
fit of its own (``prior_kind: fitted``, the A100s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.spec import (
    FRAMEWORK_FAMILY,
    GPU,
    Calibration,
    FamilyCalibration,
    Framework,
    FrameworkCalibration,
    Strict,
)

OVERLAY_KIND = "madmax-opt calibration overlay"


class OverlayEntry(FrameworkCalibration):
    """One fitted (GPU, framework) calibration of an overlay file."""

    gpu: str
    framework: Framework


class Overlay(Strict):
    """An overlay file written by ``madmax-opt calibrate``."""

    kind: Literal["madmax-opt calibration overlay"] = "madmax-opt calibration overlay"
    calibrations: list[OverlayEntry] = Field(min_length=1)


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
    """The GPU with the calibration that prices ``framework``: the overlay's fit, else the catalog's, else the prior."""
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
    """Every hardware option with its GPU's calibration for ``framework`` (``overlay`` first)."""
    return [HardwareOption(o.system, with_framework(o.gpu, framework, overlay), o.gpus, o.supply) for o in options]


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
        return CalibrationRecord(gpu=gpu.name, framework=framework, status="uncalibrated", level="prior")
    f = fitted.fit if fitted is not None else family.fit  # type: ignore[union-attr]
    return CalibrationRecord(gpu=gpu.name, framework=framework, runs=f.runs, sources=list(f.sources),
                             status="calibrated" if fitted is not None else "uncalibrated",
                             level="calibrated" if family is None else f"family:{family.name}",
                             in_sample_median_err=f.in_sample_median_err, loso_median_err=f.loso_median_err)


def record_dict(gpu: GPU, framework: str) -> dict[str, Any]:
    """``record`` as the JSON object of evaluate/solve records."""
    return record(gpu, framework).model_dump()
