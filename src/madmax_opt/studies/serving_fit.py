"""Fit the serving calibration per (GPU, framework) on the measured serving runs, with leave-one-source-out errors.

Method (MAP estimate, Levenberg-Marquardt on log errors with a numeric Jacobian):

    minimise  sum_runs ln(predicted / measured)^2  +  sum_params ((x - x_prior) / sigma)^2
    x = (ln gemm_eff, ln attn_eff, ln hbm_eff, ln grouped_gemm_ratio, ln comm_eff, layer overhead in us,
         prefill overhead in ms)

Two levels: each framework is first fitted on all its runs (every GPU) around the universal prior of
``data/serving_calibration.yaml``; each (GPU, framework) pair is then fitted on its own runs around its framework's
values. A parameter its runs do not move stays at the prior (e.g. grouped_gemm_ratio without MoE runs). Leave one
source out: drop every run of a source, refit both levels, predict the dropped runs with what the rest resolves to
(the pair's fit if the pair still has runs, else the framework's, else the prior): the error a user sees on a
cluster and software version the fit has not seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from madmax_opt.io.serving_catalog import CATALOG_FILE, serving_catalog
from madmax_opt.model.serving_calibration import (
    ANY,
    FitRecord,
    ServingCalibrationEntry,
    ServingParams,
    resolve_params,
)
from madmax_opt.studies.serving_cases import PreparedCase, prepared_cases

EFFS: tuple[str, ...] = ("gemm_eff", "attn_eff", "hbm_eff", "grouped_gemm_ratio", "comm_eff")
UPPER = np.log([1.0, 1.0, 1.0, 1.0, 2.0, np.inf, np.inf])  # box of x (the overheads have no upper bound)
N = len(EFFS) + 2
SIGMA = np.array([1.0] * len(EFFS) + [100.0, 2.0])  # ln-efficiency sigmas; overheads in us and ms
STEPS = np.array([1e-3] * len(EFFS) + [0.1, 0.01])  # forward-difference steps of the Jacobian
MAX_ITERATIONS = 30
FIT = (
    "MAP fit: Levenberg-Marquardt on ln(predicted/measured), log-normal prior sigma 1.0 on the efficiencies and "
    "100 us on the per-layer overhead, 2 ms on the prefill overhead"
)
METHOD_PAIR = FIT + ", on this pair's runs, around the composition of its GPU's and its framework's pooled fits"
METHOD_POOLED = FIT + ", on the framework's runs on every GPU, around the universal prior"
METHOD_GPU = FIT + ", on the GPU's runs under every framework, around the universal prior (hardware efficiencies used)"


def to_x(p: ServingParams) -> np.ndarray:
    return np.array([*(np.log(getattr(p, k)) for k in EFFS), p.layer_overhead_s * 1e6, p.prefill_overhead_s * 1e3])


def from_x(x: np.ndarray) -> ServingParams:
    effs = {k: float(np.exp(v)) for k, v in zip(EFFS, x[: len(EFFS)], strict=True)}
    return ServingParams(
        **effs, layer_overhead_s=float(max(x[-2], 0.0)) * 1e-6, prefill_overhead_s=float(max(x[-1], 0.0)) * 1e-3
    )


def log_errors_many(cases: Sequence[PreparedCase], xs: list[np.ndarray]) -> np.ndarray:
    """ln(predicted / measured), one row per parameter vector, one column per case."""
    params = [from_x(x) for x in xs]
    return np.stack([np.log(c.predict_many(params) / c.case.measured) for c in cases], axis=1)


def map_cost(cases: Sequence[PreparedCase], prior: ServingParams, p: ServingParams, sigma: np.ndarray = SIGMA) -> float:
    """The minimised objective: sum of squared ln errors plus the prior's squared z-scores."""
    x = to_x(p)
    r = np.concatenate([log_errors_many(cases, [x])[0], (x - to_x(prior)) / sigma])
    return float(r @ r)


def fit(cases: Sequence[PreparedCase], prior: ServingParams, sigma: np.ndarray = SIGMA) -> ServingParams:
    """The MAP parameters of ``cases`` around ``prior`` (the prior itself when there are no cases)."""
    if not cases:
        return prior
    x0 = to_x(prior)

    def residuals_many(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([log_errors_many(cases, xs), np.stack([(x - x0) / sigma for x in xs])], axis=1)

    def residuals(x: np.ndarray) -> np.ndarray:
        return residuals_many([x])[0]

    def clamp(x: np.ndarray) -> np.ndarray:  # efficiencies within their bounds, overhead >= 0: the feasible box
        out = np.minimum(x, UPPER)
        out[-2:] = np.maximum(out[-2:], 0.0)
        return out

    x, lam = x0.copy(), 1e-2
    r = residuals(x)
    cost = float(r @ r)
    done = False
    for _ in range(MAX_ITERATIONS):
        probes = residuals_many([x + np.eye(N)[j] * STEPS[j] for j in range(N)])
        jac = ((probes - r) / STEPS[:, None]).T
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-9), -jtr)
            x_new = clamp(x + step)
            r_new = residuals(x_new)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                x, r, lam, improved = x_new, r_new, lam / 3.0, True
                done = cost - cost_new < 1e-8 * max(cost, 1e-12)
                cost = cost_new
                break
            lam *= 4.0
        if not improved or done:
            break
    return from_x(x)


@dataclass(frozen=True)
class Fit:
    pooled: dict[str, ServingParams]  # per framework, over its GPUs
    by_gpu: dict[str, ServingParams]  # per GPU, over its frameworks (its hardware-bound efficiencies are used)
    pairs: dict[tuple[str, str], ServingParams]  # per (gpu, framework)
    prior: ServingParams

    @property
    def fitted(self) -> dict[tuple[str, str], ServingParams]:
        """Every fitted set by catalog key: (gpu, fw), ("*", fw) and (gpu, "*")."""
        return {
            **self.pairs,
            **{(ANY, fw): p for fw, p in self.pooled.items()},
            **{(g, ANY): p for g, p in self.by_gpu.items()},
        }

    def resolve(self, gpu: str, framework: str) -> ServingParams:
        return resolve_params(gpu, framework, self.fitted, self.prior)[0]


def fit_all(cases: Sequence[PreparedCase], prior: ServingParams | None = None) -> Fit:
    """Framework-pooled and GPU-pooled fits around the prior, then each pair around what it would resolve to
    without its own runs (the composition of the two)."""
    prior = prior or serving_catalog().prior
    pooled = {fw: fit([c for c in cases if c.case.framework == fw], prior) for fw in sorted({c.case.framework for c in cases})}
    by_gpu = {g: fit([c for c in cases if c.case.gpu == g], prior) for g in sorted({c.case.gpu for c in cases})}
    base = Fit(pooled, by_gpu, {}, prior)
    pairs = {pair: fit([c for c in cases if c.case.pair == pair], base.resolve(*pair))
             for pair in sorted({c.case.pair for c in cases})}
    return Fit(pooled, by_gpu, pairs, prior)


@dataclass(frozen=True)
class Evaluation:
    """Every case's in-sample and leave-one-source-out error (predicted / measured - 1)."""

    fit: Fit
    in_sample: dict[str, float]  # by case id
    loso: dict[str, float]
    cases: tuple[PreparedCase, ...]

    def median(self, errors: dict[str, float], ids: Sequence[str] | None = None) -> float:
        keys = list(errors) if ids is None else list(ids)
        return statistics.median(abs(errors[k]) for k in keys) if keys else float("nan")


@cache
def evaluate_all() -> Evaluation:
    """The full fit, its in-sample errors and the leave-one-source-out errors (a minute on two cores)."""
    cases = prepared_cases()
    full = fit_all(cases)
    in_sample = {c.case.id: c.error(full.resolve(*c.case.pair)) for c in cases}
    loso: dict[str, float] = {}
    for source in sorted({c.case.source for c in cases}):
        rest = fit_all([c for c in cases if c.case.source != source])
        for c in cases:
            if c.case.source == source:
                loso[c.case.id] = c.error(rest.resolve(*c.case.pair))
    return Evaluation(full, in_sample, loso, cases)


def catalog_entries(ev: Evaluation) -> list[ServingCalibrationEntry]:
    """The fitted parameter sets with the record of each fit (runs, sources, in-sample and LOSO errors)."""
    out = []
    for (gpu, fw), params in ev.fit.fitted.items():
        mine = [c.case for c in ev.cases if fw in (ANY, c.case.framework) and gpu in (ANY, c.case.gpu)]
        ids = [c.id for c in mine]
        method = METHOD_POOLED if gpu == ANY else METHOD_GPU if fw == ANY else METHOD_PAIR
        record = FitRecord(
            runs=len(mine),
            sources=sorted({c.source for c in mine}),
            method=method,
            in_sample_median_err=round(ev.median(ev.in_sample, ids), 4),
            loso_median_err=round(ev.median(ev.loso, ids), 4),
        )
        rounded = ServingParams(**{k: float(f"{v:.4g}") for k, v in params.model_dump().items()})
        out.append(ServingCalibrationEntry(gpu=gpu, framework=fw, params=rounded, fit=record))
    return out


def write_catalog(path: Path, ev: Evaluation | None = None) -> Path:
    """Rewrite the serving calibration file with the fitted entries (prior and framework defaults kept)."""
    ev = ev or evaluate_all()
    cat = serving_catalog()
    data = cat.model_copy(update={"entries": catalog_entries(ev)}).model_dump(mode="json")
    header = (
        "# Serving calibration (class madmax_opt.model.serving_calibration.ServingCatalog): parameters per (GPU,\n"
        "# serving framework), fitted ONLY on the measured serving runs of data/validation/modern/inference.yaml.\n"
        "# Regenerated by `madmax-opt fit-serving` (studies/serving_fit.py); do not edit the entries by hand.\n"
        "# gpu '*' = the framework's fit pooled over GPUs (used, flagged uncalibrated, for GPUs without runs).\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=115))
    return path


def default_catalog_path() -> Path:
    return Path(str(resources.files("madmax_opt").joinpath("data").joinpath(CATALOG_FILE)))
