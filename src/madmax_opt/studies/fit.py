"""Fit calibrations to measured training runs, and say which parameters the runs determine.

The parameters are the efficiency fields of :class:`madmax_opt.model.spec.Calibration` that the step-time model
prices with (``FIT_PARAMS``). A fit moves each run's *base* calibration (per GPU: the prior, or the pooled
calibration a pair fit starts from) by one factor per parameter shared by all its runs: efficiencies x factor
(capped at 1), ``layer_overhead_s`` + an increment. It keeps the parameters the runs cannot determine at the base,
and minimises the mean |ln(predicted / measured)| over the runs plus a shrinkage penalty toward the base, by
coordinate descent on fixed grids (deterministic: the first minimum wins). On runs of one GPU the factors are
values on ``FIT_GRID``; on runs of several GPUs (the pooled fits of ``validation_modern``) they are ratios to each
GPU's base. The same code fits the catalog (``validation_modern``) and a user's runs (``calibrate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from madmax_opt.analysis.evaluator import Model, metrics
from madmax_opt.core.numeric import Arr
from madmax_opt.io import catalog
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
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
OVERHEAD = "layer_overhead_s"  # the one additive parameter (seconds); the others are fractions moved by factors
MIN_SENSITIVITY = 0.10  # a run "depends" on a parameter: its ln(step time) moves >= 0.1 per unit ln(parameter)
MIN_DEPENDENT_RUNS = 2  # one run cannot separate a parameter from that run's own idiosyncrasies
MIN_SINGULAR_RATIO = 0.05  # condition-number bound (20) of the normalised sensitivity matrix
MAX_SWEEPS = 4
# Shrinkage toward the base: each parameter pays PRIOR_WEIGHT x |ln(value / base)| (layer_overhead_s: x |value -
# base| / 1 ms) in the objective, so a few runs cannot drag a weakly determined parameter far from its base.
# 0.05 was chosen among {0, 0.02, 0.05, 0.1} by the leave-one-source-out error on the modern data (so that error
# is slightly optimistic): 0 / 0.02 let a handful of fp8-only runs drag the bf16 efficiency away (LOSO 24 / 21 %).
PRIOR_WEIGHT = 0.05
OVERHEAD_SCALE_S = 1e-3

Bases = Mapping[str, Calibration]  # GPU name -> the calibration a fit starts from and shrinks toward
Factors = dict[str, float]  # parameter -> factor on the base (layer_overhead_s: increment in seconds)
# step times of (runs, factor sets) on bases: predict_scaled, or a memo of it (calibrate's leave-one-out fits)
Predict = Callable[[Sequence["Run"], Sequence[Mapping[str, float]], Bases], Arr]


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


def prior(gpu: str) -> Calibration:
    """The GPU's prior calibration (catalog ``calibration`` block: datasheet-based initial values or the A100 fit)."""
    return catalog.gpus()[gpu].calibration


def priors(runs: Sequence[Run]) -> dict[str, Calibration]:
    """Each run's GPU prior: the bases of a fit that starts from the catalog priors."""
    return {r.gpu: prior(r.gpu) for r in runs}


@dataclass(frozen=True)
class Fit:
    """A fit: factors on the bases, which parameters were fitted, which were left at the base and why."""

    factors: Factors  # fitted parameters only
    bases: dict[str, Calibration]
    left_out: dict[str, str]  # parameter -> reason it was not fitted
    predicted_s: Arr  # in-sample predictions
    error: Arr  # predicted / measured - 1

    def values(self, gpu: str) -> dict[str, float]:
        """The fitted parameters' values on ``gpu`` (its base moved by the factors)."""
        cal = self.bases[gpu].scaled(self.factors)
        return {n: round(cal.value(n), 6) for n in self.factors}

    @property
    def params(self) -> dict[str, float]:
        """The fitted values of a one-GPU fit."""
        (gpu,) = self.bases
        return self.values(gpu)

    @property
    def median_abs_err(self) -> float:
        return float(np.median(np.abs(self.error))) if len(self.error) else float("nan")


def _options(o: HardwareOption, cals: Sequence[Calibration]) -> tuple[HardwareOption, ...]:
    return tuple(HardwareOption(o.system, o.gpu.model_copy(update={"calibration": c}), o.gpus, o.supply) for c in cals)


def _predict(runs: Sequence[Run], cals_of: Callable[[Run], Sequence[Calibration]]) -> Arr:
    """Step times of every run under each of its calibrations, shape (runs, sets)."""
    rows = []
    for r in runs:
        cals = cals_of(r)
        problem = replace(r.problem, hardware=_options(r.problem.hardware[0], cals))
        plans = PlanArrays.from_plans([r.plan] * len(cals), list(range(len(cals))))
        rows.append(metrics(Model(problem), plans).step_time_s)
    return np.array(rows)


def predict(runs: Sequence[Run], params: Sequence[Mapping[str, float]]) -> Arr:
    """Step times of every run under every parameter set (values replacing the run's GPU prior), (runs, sets)."""
    return _predict(runs, lambda r: [prior(r.gpu).model_copy(update=dict(p)) for p in params])


def predict_scaled(runs: Sequence[Run], factor_sets: Sequence[Mapping[str, float]], bases: Bases) -> Arr:
    """Step times of every run under every factor set applied to its GPU's base, shape (runs, sets)."""
    return _predict(runs, lambda r: [bases[r.gpu].scaled(f) for f in factor_sets])


def factor_penalty(factors: Mapping[str, float]) -> float:
    """PRIOR_WEIGHT x (sum of |ln factor| + |overhead increment| / OVERHEAD_SCALE_S)."""
    return PRIOR_WEIGHT * sum(abs(f) / OVERHEAD_SCALE_S if n == OVERHEAD else abs(float(np.log(f)))
                              for n, f in factors.items())


def sensitivities(runs: Sequence[Run], bases: Bases | None = None, predict: Predict | None = None) -> Arr:
    """d ln(step time) / d ln(parameter) of every run at its base (default: prior), central differences of +-5 %."""
    bases = priors(runs) if bases is None else bases
    sets: list[Factors] = []
    for name in FIT_PARAMS:
        if name == OVERHEAD:  # probe at 1 ms: the elasticity of an overhead near 0 is near 0 whatever the runs say;
            sets += [{"fp8_gemm_eff": 1.0, name: OVERHEAD_SCALE_S * 1.05},  # at 1 ms it is its share of the step
                     {"fp8_gemm_eff": 1.0, name: OVERHEAD_SCALE_S / 1.05}]
        else:  # fp8_gemm_eff pinned (factor 1), so that gemm_eff's column measures the bf16 GEMMs alone
            sets += [{"fp8_gemm_eff": 1.0, name: 1.05}, {"fp8_gemm_eff": 1.0, name: 1.0 / 1.05}]
    t = np.log((predict or predict_scaled)(runs, sets, bases))
    hi, lo = t[:, 0::2], t[:, 1::2]
    return np.asarray((hi - lo) / (2.0 * np.log(1.05)))


def determined(runs: Sequence[Run], candidates: Sequence[str] = FIT_PARAMS,
               bases: Bases | None = None, predict: Predict | None = None) -> tuple[list[str], dict[str, str]]:
    """The parameters the runs determine (priority order), and why each other one is left at the base.

    A parameter is determined when >= MIN_DEPENDENT_RUNS runs' ln(step time) move by >= MIN_SENSITIVITY per unit
    ln(parameter), it is not collinear with the parameters already chosen (smallest / largest singular value of the
    column-normalised sensitivity matrix >= MIN_SINGULAR_RATIO), and the runs outnumber the parameters chosen so far.
    """
    jac = sensitivities(runs, bases, predict)
    chosen: list[int] = []
    left: dict[str, str] = {}
    for name in candidates:
        j = FIT_PARAMS.index(name)
        dependent = int(np.sum(np.abs(jac[:, j]) >= MIN_SENSITIVITY))
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


def _grid(name: str, bases: Bases) -> tuple[float, ...]:
    """FIT_GRID as factors (increments) on the first GPU's base: on runs of one GPU exactly the grid's values."""
    base = bases[min(bases)]
    if name == OVERHEAD:  # increments that put the first GPU's overhead on the grid's values
        return tuple(v - base.layer_overhead_s for v in FIT_GRID[name])
    ref = base.value(name)
    return tuple(v / ref for v in FIT_GRID[name])


def fit(runs: Sequence[Run], candidates: Sequence[str] = FIT_PARAMS, bases: Bases | None = None,
        predict: Predict | None = None) -> Fit:
    """Coordinate descent over the grids of the determined parameters, from the bases (default: the GPU priors);
    objective mean |ln(predicted / measured)| + factor_penalty. ``predict`` replaces predict_scaled (same values)."""
    bases = dict(priors(runs) if bases is None else {r.gpu: bases[r.gpu] for r in runs})
    measured = np.array([r.measured_s for r in runs])
    predict = predict or predict_scaled
    names, left = determined(runs, candidates, bases, predict)

    def loss(sets: Sequence[Factors]) -> Arr:
        misfit = np.mean(np.abs(np.log(predict(runs, sets, bases) / measured[:, None])), axis=0)
        return np.asarray(misfit + np.array([factor_penalty(s) for s in sets]))

    factors: Factors = {n: 0.0 if n == OVERHEAD else 1.0 for n in names}
    best = float(loss([factors])[0])
    for _ in range(MAX_SWEEPS):
        moved = False
        for n in names:
            sets = [{**factors, n: v} for v in _grid(n, bases)]
            trial = loss(sets)
            k = int(np.argmin(trial))
            if trial[k] < best - 1e-12:
                best, factors, moved = float(trial[k]), sets[k], True
        if not moved:
            break
    pred = predict(runs, [factors], bases)[:, 0]
    return Fit(factors, bases, left, pred, pred / measured - 1.0)
