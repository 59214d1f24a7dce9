"""The serving calibration catalog (``data/serving_calibration.yaml``) and its columns for a problem's hardware."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.hardware import CalibrationRecord, HardwareOption
from madmax_opt.model.serving_calibration import (
    DEFAULT_SERVING_FRAMEWORK,
    SERVING_FRAMEWORKS,
    CalibrationColumns,
    ServingCatalog,
)
from madmax_opt.model.spec import Stack

CATALOG_FILE = "serving_calibration.yaml"


@cache
def serving_catalog() -> ServingCatalog:
    text = resources.files("madmax_opt").joinpath("data").joinpath(CATALOG_FILE).read_text()
    try:
        return ServingCatalog(**yaml.safe_load(text))
    except ValidationError as exc:  # a broken catalog is a bug in the package, but say where
        raise ProblemError(str(exc).splitlines()[0], file=f"catalog {CATALOG_FILE}") from None


def serving_framework(stack: Stack, *, file: str | None) -> str:
    """The serving framework of ``stack.framework``: vLLM unless set; a training stack is a one-line error."""
    if "framework" not in stack.model_fields_set:
        return DEFAULT_SERVING_FRAMEWORK
    if stack.framework not in SERVING_FRAMEWORKS:
        raise ProblemError(
            f"{stack.framework!r} is a training framework; allowed for inference: {', '.join(SERVING_FRAMEWORKS)}",
            file=file,
            field="stack.framework",
        )
    return stack.framework


def calibration_columns(
    options: Sequence[HardwareOption], framework: str, catalog: ServingCatalog | None = None
) -> tuple[CalibrationColumns, list[dict[str, Any]]]:
    """Per-option calibration columns and, per option, the trust record of what priced it (``CalibrationRecord``
    plus ``level``: calibrated on this GPU, the framework's pooled fit from other GPUs, or the prior)."""
    cat = catalog or serving_catalog()
    resolved = [cat.resolve(o.gpu.name, framework) for o in options]
    labels: list[dict[str, Any]] = []
    for o, (_, level, fit) in zip(options, resolved, strict=True):
        rec = CalibrationRecord(gpu=o.gpu.name, framework=framework, status="uncalibrated")
        if fit is not None:
            rec = CalibrationRecord(
                gpu=o.gpu.name,
                framework=framework,
                # a pair fitted on its runs whose error stays above 30 % is still flagged (issue 23)
                status="calibrated" if level == "calibrated" and fit.status == "calibrated" else "uncalibrated",
                runs=fit.runs,
                sources=list(fit.sources),
                in_sample_median_err=fit.in_sample_median_err,
                loso_median_err=fit.loso_median_err,
            )
        labels.append({**rec.model_dump(), "level": level})
    return CalibrationColumns.of([p for p, _, _ in resolved], cat.frameworks[framework]), labels
