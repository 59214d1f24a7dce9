"""Fit one calibration per (GPU, framework) to measured training runs, and say which parameters the runs determine.

The parameters are the efficiency fields of :class:`madmax_opt.model.spec.Calibration` that the step-time model
prices with (``FIT_PARAMS``). A fit starts from the GPU's prior (the catalog ``calibration`` block, never a previous
fit), keeps the parameters the runs cannot determine at that prior, and minimises the mean |ln(predicted /
measured)| over the runs by coordinate descent on fixed grids (deterministic: the first minimum wins). The same code
fits the catalog (``validation_modern``) and a user's runs (``calibrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from madmax_opt.analysis.evaluator import Model, metrics
from madmax_opt.core.numeric import Arr
from madmax_opt.io import catalog
from madmax_opt.io.problem_file import Problem
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import Calibration, Plan

# Priority order: a parameter enters the fit only if the runs determine it together with those before it.
FIT_PARAMS: tuple[str, ...] = (
    "gemm_eff", "fp8_gemm_eff", "attn_eff", "grouped_gemm_ratio", "layer_overhead_s", "mxfp8_gemm_ratio"
)
FIT_GRID: dict[str, tuple[float, ...]] = {
    "gemm_eff": tuple(round(0.20 + 0.01 * i, 2) for i in range(76)),  # 0.20 .. 0.95
    "fp8_gemm_eff": tuple(round(0.15 + 0.01 * i, 2) for i in range(81)),  # 0.15 .. 0.95 of the FP8 peak
    "attn_eff": tuple(round(0.10 + 0.01 * i, 2) for i in range(86)),  # 0.10 .. 0.95
    "layer_overhead_s": tuple(round(5e-5 * i, 6) for i in range(61)),  # 0 .. 3 ms per layer and pass
    "mxfp8_gemm_ratio": tuple(round(0.60 + 0.01 * i, 2) for i in range(41)),  # 0.60 .. 1.00
    "grouped_gemm_ratio": tuple(round(0.20 + 0.01 * i, 2) for i in range(81)),  # 0.20 .. 1.00 of dense
}
MIN_SENSITIVITY = 0.10  # a run "depends" on a parameter: its ln(step time) moves >= 0.1 per unit ln(parameter)
MIN_DEPENDENT_RUNS = 2  # one run cannot separate a parameter from that run's own idiosyncrasies
MIN_SINGULAR_RATIO = 0.05  # condition-number bound (20) of the normalised sensitivity matrix
MAX_SWEEPS = 4
# Shrinkage toward the prior: each parameter pays PRIOR_WEIGHT x |ln(value / prior)| (layer_overhead_s: x |value -
# prior| / 1 ms) in the objective, so a few runs cannot drag a weakly determined parameter far from its prior.
# 0.05 was chosen among {0, 0.02, 0.05, 0.1} by the leave-one-source-out error on the modern data (so that error
# is slightly optimistic): 0 / 0.02 let a handful of fp8-only runs drag the bf16 efficiency away (LOSO 24 / 21 %).
PRIOR_WEIGHT = 0.05
OVERHEAD_SCALE_S = 1e-3


@dataclass(frozen=True)
class Run:
    """One measured training run: its problem (one hardware option), the plan that ran, the measured step time."""

    name: str
    source: str
    problem: Problem
    plan: Plan
    measured_s: float

    @property
    def gpu(self) -> str:
        return self.problem.hardware[0].gpu.name

    @property
    def framework(self) -> str:
        return self.problem.stack.framework


@dataclass(frozen=True)
class Fit:
    """A fitted calibration: the parameter values, which were fitted, which were left at the prior and why."""

    params: dict[str, float]  # fitted values only
    left_out: dict[str, str]  # parameter -> reason it was not fitted
    predicted_s: Arr  # in-sample predictions
    error: Arr  # predicted / measured - 1

    @property
    def median_abs_err(self) -> float:
        return float(np.median(np.abs(self.error))) if len(self.error) else float("nan")


def prior(gpu: str) -> Calibration:
    """The GPU's prior calibration (catalog ``calibration`` block: datasheet-based initial values or the A100 fit)."""
    return catalog.gpus()[gpu].calibration


def _options(o: HardwareOption, params: Sequence[dict[str, float]]) -> tuple[HardwareOption, ...]:
    base = prior(o.gpu.name)
    return tuple(
        HardwareOption(o.system, o.gpu.model_copy(update={"calibration": base.model_copy(update=p)}), o.gpus, o.supply)
        for p in params
    )


def predict(runs: Sequence[Run], params: Sequence[dict[str, float]]) -> Arr:
    """Step times of every run under every parameter set (prior + overrides), shape (runs, sets)."""
    out = np.zeros((len(runs), len(params)))
    for i, r in enumerate(runs):
        problem = replace(r.problem, hardware=_options(r.problem.hardware[0], params))
        model = Model(problem)
        plans = PlanArrays.from_plans([r.plan] * len(params), list(range(len(params))))
        out[i] = metrics(model, plans).step_time_s
    return out


def prior_value(cal: Calibration, name: str) -> float:
    value = getattr(cal, name)
    return float(cal.gemm_eff if value is None else value)  # fp8_gemm_eff defaults to gemm_eff


def penalty(cal: Calibration, params: dict[str, float]) -> float:
    """PRIOR_WEIGHT x (sum of |ln(value / prior)|, overheads in units of OVERHEAD_SCALE_S)."""
    total = 0.0
    for name, value in params.items():
        p0 = prior_value(cal, name)
        total += abs(value - p0) / OVERHEAD_SCALE_S if name == "layer_overhead_s" else abs(np.log(value / p0))
    return PRIOR_WEIGHT * total


def _loss(pred: Arr, measured: Arr, cal: Calibration, sets: Sequence[dict[str, float]]) -> Arr:
    """Mean |ln(predicted / measured)| over the runs + the prior penalty, per parameter set."""
    misfit = np.mean(np.abs(np.log(pred / measured[:, None])), axis=0)
    return np.asarray(misfit + np.array([penalty(cal, s) for s in sets]))


def sensitivities(runs: Sequence[Run], base: dict[str, float] | None = None) -> Arr:
    """d ln(step time) / d ln(parameter) of every run at the prior (+ ``base``), central differences of +-5 %."""
    cal = prior(runs[0].gpu)
    # fp8_gemm_eff unset follows gemm_eff: pin it, so that gemm_eff's column measures the bf16 GEMMs alone
    base = {"fp8_gemm_eff": prior_value(cal, "fp8_gemm_eff"), **(base or {})}
    sets: list[dict[str, float]] = []
    for name in FIT_PARAMS:
        value = base.get(name, prior_value(cal, name))
        if name == "layer_overhead_s":  # probe at >= 1 ms: the elasticity of an overhead near 0 is near 0 whatever
            value = max(value, OVERHEAD_SCALE_S)  # the runs say; at 1 ms it is the share of the step it would take
        for f in (1.05, 1.0 / 1.05):
            v = value * f
            if name != "layer_overhead_s":  # fractions
                v = min(v, 1.0)
            sets.append({**base, name: v})
    t = np.log(predict(runs, sets))
    hi, lo = t[:, 0::2], t[:, 1::2]
    return np.asarray((hi - lo) / (2.0 * np.log(1.05)))


def determined(runs: Sequence[Run], candidates: Sequence[str] = FIT_PARAMS) -> tuple[list[str], dict[str, str]]:
    """The parameters the runs determine (priority order), and why each other one is left at the prior.

    A parameter is determined when >= MIN_DEPENDENT_RUNS runs' ln(step time) move by >= MIN_SENSITIVITY per unit
    ln(parameter),
    it is not collinear with the parameters already chosen (smallest / largest singular value of the column-
    normalised sensitivity matrix >= MIN_SINGULAR_RATIO), and the runs outnumber the parameters chosen so far.
    """
    jac = sensitivities(runs)
    chosen: list[int] = []
    left: dict[str, str] = {}
    for name in candidates:
        j = FIT_PARAMS.index(name)
        col = jac[:, j]
        dependent = int(np.sum(np.abs(col) >= MIN_SENSITIVITY))
        if dependent < MIN_DEPENDENT_RUNS:
            left[name] = (f"{dependent} run(s) depend on it (step-time elasticity >= {MIN_SENSITIVITY:g}), "
                          f"{MIN_DEPENDENT_RUNS} needed")
            continue
        if len(chosen) >= len(runs):
            left[name] = f"{len(runs)} run(s) determine at most {len(runs)} parameter(s)"
            continue
        m = jac[:, [*chosen, j]]
        m = m / np.linalg.norm(m, axis=0)
        s = np.linalg.svd(m, compute_uv=False)
        if s[-1] / s[0] < MIN_SINGULAR_RATIO:
            others = ", ".join(FIT_PARAMS[c] for c in chosen)
            left[name] = f"the runs cannot tell it apart from {others}"
            continue
        chosen.append(j)
    return [FIT_PARAMS[j] for j in chosen], left


def fit(runs: Sequence[Run], candidates: Sequence[str] = FIT_PARAMS) -> Fit:
    """Coordinate descent over FIT_GRID of the determined parameters, from the prior; mean |ln error| objective."""
    measured = np.array([r.measured_s for r in runs])
    names, left = determined(runs, candidates)
    cal = prior(runs[0].gpu)
    params = {n: prior_value(cal, n) for n in names}
    best = float(_loss(predict(runs, [params]), measured, cal, [params])[0])
    for _ in range(MAX_SWEEPS):
        moved = False
        for n in names:
            sets = [{**params, n: v} for v in FIT_GRID[n]]
            loss = _loss(predict(runs, sets), measured, cal, sets)
            k = int(np.argmin(loss))
            if loss[k] < best - 1e-12:
                best, params, moved = float(loss[k]), sets[k], True
        if not moved:
            break
    pred = predict(runs, [params])[:, 0]
    return Fit(params, left, pred, pred / measured - 1.0)
