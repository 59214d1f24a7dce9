"""Serving calibration levels: a GPU family's pooled fit, the uncalibrated flag of a poor pair fit (issue 23)."""

from __future__ import annotations

from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.serving_calibration import (
    ANY,
    FitRecord,
    ServingCalibrationEntry,
    ServingParams,
    calibration_columns,
    compose,
    resolve_params,
)


def _params(gemm: float, overhead_s: float) -> ServingParams:
    return ServingParams(gemm_eff=gemm, attn_eff=0.5, hbm_eff=0.7, layer_overhead_s=overhead_s,
                         prefill_overhead_s=0.0, grouped_gemm_ratio=0.5, comm_eff=1.0)


def test_a_gpu_without_runs_takes_its_family_hardware_and_the_framework_runtime() -> None:
    prior, family, sglang = _params(0.7, 1e-5), _params(0.4, 9e-5), _params(0.6, 5e-5)
    fitted = {("family:blackwell", ANY): family, (ANY, "sglang"): sglang}
    params, level = resolve_params("b300", "sglang", fitted, prior, "blackwell")
    assert level == "family:blackwell"
    assert params.gemm_eff == 0.4 and params.layer_overhead_s == 5e-5  # hardware from the family, runtime from sglang
    assert params == compose(family, sglang)
    # a GPU with a pooled fit of its own does not use the family
    own = _params(0.5, 2e-5)
    params, level = resolve_params("b300", "sglang", {**fitted, ("b300", ANY): own}, prior, "blackwell")
    assert level == "composed" and params.gemm_eff == 0.5


def test_the_catalog_names_the_families() -> None:
    fam = serving_catalog().gpu_family_of()
    assert fam["b300"] == fam["b200"] == "blackwell" and fam["mi355x"] == fam["mi300x"] == "instinct"
    assert all(g in catalog.gpus() for g in fam)


def test_a_pair_fit_worse_than_30_percent_is_recorded_uncalibrated() -> None:
    cat = serving_catalog()
    record = FitRecord(runs=3, sources=["x"], method="test", in_sample_median_err=0.35, status="uncalibrated")
    entry = ServingCalibrationEntry(gpu="h100-sxm", framework="sglang", params=_params(0.6, 1e-5), fit=record)
    poor = cat.model_copy(update={"entries": [entry]})
    options = hardware_options_for("h100-sxm")
    _, labels = calibration_columns(options, "sglang", poor)
    assert labels[0]["level"] == "calibrated" and labels[0]["status"] == "uncalibrated"
    good = poor.model_copy(update={"entries": [entry.model_copy(update={"fit": record.model_copy(
        update={"status": "calibrated"})})]})
    assert calibration_columns(options, "sglang", good)[1][0]["status"] == "calibrated"


def hardware_options_for(gpu: str) -> list[HardwareOption]:
    p = problem_from_dict({"model": "llama3-8b", "hardware": {"gpu": gpu, "gpus": 1},
                           "task": {"kind": "inference", "prompt_len": 8, "output_len": 8}})
    return list(p.hardware)

