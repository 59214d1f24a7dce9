"""Fit the serving calibration per (GPU, framework) on the measured serving runs, with leave-one-source-out errors.

Method (MAP estimate, Levenberg-Marquardt on log errors with a numeric Jacobian):

    minimise  sum_runs ln(predicted / measured)^2  +  sum_params ((x - x_prior) / sigma)^2
    x = (ln gemm_eff, ln attn_eff, ln hbm_eff, ln grouped_gemm_ratio, ln comm_eff, ln spec_acceptance,
         layer overhead in us,
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from madmax_opt.io.serving_catalog import CATALOG_FILE, serving_catalog
from madmax_opt.model.serving_calibration import (
    ANY,
    UNSEEN_SOURCES,
    FitRecord,
    IntervalFactors,
    ServingCalibrationEntry,
    ServingParams,
    ordered,
    resolve_params,
    trust,
)
from madmax_opt.model.spec import GPU
from madmax_opt.studies.inferencex import prepared_metrics
from madmax_opt.studies.serving_cases import CaseInfo, FitCase, prepared_cases

EFFS: tuple[str, ...] = ("gemm_eff", "attn_eff", "hbm_eff", "grouped_gemm_ratio", "comm_eff", "spec_acceptance")
UPPER = np.log([1.0, 1.0, 1.0, 1.0, 2.0, 1.0, np.inf, np.inf])  # box of x (the overheads have no upper bound)
N = len(EFFS) + 2
SIGMA = np.array([1.0] * len(EFFS) + [100.0, 2.0])  # ln-efficiency sigmas; overheads in us and ms
STEPS = np.array([1e-3] * len(EFFS) + [0.1, 0.01])  # forward-difference steps of the Jacobian
MAX_ITERATIONS = 30
TOLERANCE = 1e-4  # stop when an iteration lowers the cost by less than this fraction (errors move < 0.1 %)
FIT = (
    "MAP fit: Levenberg-Marquardt on ln(predicted/measured), log-normal prior sigma 1.0 on the efficiencies and "
    "100 us on the per-layer overhead, 2 ms on the prefill overhead"
)
METHOD_PAIR = FIT + ", on this pair's runs, around the composition of its GPU's and its framework's pooled fits"
METHOD_POOLED = FIT + ", on the framework's runs on every GPU, around the universal prior"
METHOD_GPU = FIT + ", on the GPU's runs under every framework, around the universal prior (hardware efficiencies used)"
METHOD_FAMILY = FIT + (", on the runs of the family's GPUs under every framework, around the universal prior (hardware "
                       "efficiencies used for a GPU of the family without runs)")


def to_x(p: ServingParams) -> np.ndarray:
    return np.array([*(np.log(getattr(p, k)) for k in EFFS), p.layer_overhead_s * 1e6, p.prefill_overhead_s * 1e3])


def from_x(x: np.ndarray) -> ServingParams:
    effs = {k: float(np.exp(min(v, u))) for k, v, u in zip(EFFS, x[: len(EFFS)], UPPER, strict=False)}
    return ServingParams(
        **effs, layer_overhead_s=float(max(x[-2], 0.0)) * 1e-6, prefill_overhead_s=float(max(x[-1], 0.0)) * 1e-3
    )


def log_errors_many(cases: Sequence[FitCase], xs: list[np.ndarray]) -> np.ndarray:
    """ln(predicted / measured), one row per parameter vector, one column per case."""
    params = [from_x(x) for x in xs]
    return np.stack([np.log(c.predict_many(params) / c.case.measured) for c in cases], axis=1)


def map_cost(cases: Sequence[FitCase], prior: ServingParams, p: ServingParams, sigma: np.ndarray = SIGMA) -> float:
    """The minimised objective: sum of squared ln errors plus the prior's squared z-scores."""
    x = to_x(p)
    r = np.concatenate([log_errors_many(cases, [x])[0], (x - to_x(prior)) / sigma])
    return float(r @ r)


def fit(
    cases: Sequence[FitCase], prior: ServingParams, sigma: np.ndarray = SIGMA, start: ServingParams | None = None
) -> ServingParams:
    """The MAP parameters of ``cases`` around ``prior`` (the prior itself when there are no cases); the iterations
    start at ``start`` (default: the prior)."""
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

    x, lam = (x0.copy() if start is None else to_x(start)), 1e-2
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
                done = cost - cost_new < TOLERANCE * max(cost, 1e-12)
                cost = cost_new
                break
            lam *= 4.0
        if not improved or done:
            break
    return from_x(x)


def family_key(family: str) -> str:
    """Catalog key of a GPU family's pooled fit (gpu column)."""
    return f"family:{family}"


@dataclass
class Fit:
    """The fits of ``cases`` at every level, made lazily (a held-out refit fits only what its held cases resolve
    to): per framework (pooled over GPUs), per GPU and per GPU family (pooled over frameworks) around the prior,
    each pair around the composition of its GPU's (else its family's) and its framework's pooled fits. ``warm``:
    a fit whose values start the iterations (the full fit, for held-out refits; the optimum is unchanged)."""

    cases: tuple[FitCase, ...]
    prior: ServingParams
    families: dict[str, str]  # gpu -> family
    warm: Fit | None = None
    fallback: frozenset[tuple[str, str]] = frozenset()  # pairs priced by their fallback level (PairDecision)
    gpus: dict[str, GPU] = field(default_factory=dict)  # the GPU catalog the hardware order ranges over (none: off)
    flagged: frozenset[tuple[str, str]] = frozenset()  # pairs whose own fit errs above 30 % (less trust in the order)
    _done: dict[tuple[str, str], ServingParams | None] = field(default_factory=dict, repr=False)

    def _fit(self, key: tuple[str, str], member: Callable[[CaseInfo], bool],
             around: ServingParams) -> ServingParams | None:
        """The fit of the cases ``member`` selects around ``around``, made once per key (the cases are selected
        only then: resolve runs once per held-out case)."""
        if key not in self._done:
            subset = [c for c in self.cases if member(c.case)]
            start = self.warm._done.get(key) if self.warm is not None else None
            self._done[key] = fit(subset, around, start=start) if subset else None
        return self._done[key]

    def pooled(self, gpu: str, framework: str) -> dict[tuple[str, str], ServingParams]:
        """The pooled fits (GPU's, its family's, framework's) that exist for a pair."""
        family = self.families.get(gpu)
        out = {
            (gpu, ANY): self._fit((gpu, ANY), lambda k: k.gpu == gpu, self.prior),
            (ANY, framework): self._fit((ANY, framework), lambda k: k.framework == framework, self.prior),
        }
        if family is not None and out[(gpu, ANY)] is None:
            out[(family_key(family), ANY)] = self._family_fit(family)
        return {k: v for k, v in out.items() if v is not None}

    def _family_fit(self, family: str) -> ServingParams | None:
        """The fit of the family's GPUs' cases under every framework, around the prior."""
        return self._fit((family_key(family), ANY), lambda k: self.families.get(k.gpu) == family, self.prior)

    def fallback_level(self, gpu: str, framework: str) -> tuple[ServingParams, str]:
        """(parameters, level) of the pair as if it had no runs: its GPU's (else family's) and its framework's
        pooled fits composed (``resolve_params`` without the pair)."""
        return resolve_params(gpu, framework, self.pooled(gpu, framework), self.prior, self.families.get(gpu))

    def pair_fit(self, gpu: str, framework: str) -> ServingParams | None:
        """The pair's own fit (around its fallback), None without runs."""
        return self._fit((gpu, framework), lambda k: k.pair == (gpu, framework), self.fallback_level(gpu, framework)[0])

    def own_level(self, gpu: str, framework: str) -> tuple[ServingParams, str]:
        """(parameters, level) before the hardware order (``ServingCatalog.resolve_own``): a pair in ``fallback``
        is priced by its fallback level."""
        base = self.fallback_level(gpu, framework)
        pair = self.pair_fit(gpu, framework)
        return (pair, "calibrated") if pair is not None and (gpu, framework) not in self.fallback else base

    def resolve_level(self, gpu: str, framework: str) -> tuple[ServingParams, str]:
        """(parameters, level) as the catalog resolves them (``ServingCatalog.resolve``): ``own_level`` in the
        hardware order against the other GPUs' fits of this refit (``ordered``)."""
        params, level = self.own_level(gpu, framework)
        if gpu not in self.gpus:
            return params, level

        def own(name: str) -> tuple[ServingParams, int]:
            p, lv = (params, level) if name == gpu else self.own_level(name, framework)
            return p, trust(lv, flagged=(name, framework) in self.flagged)

        return ordered(self.gpus[gpu], framework, own, self.gpus)[0], level

    def resolve(self, gpu: str, framework: str) -> ServingParams:
        return self.resolve_level(gpu, framework)[0]

    @property
    def fitted(self) -> dict[tuple[str, str], ServingParams]:
        """Every fitted set by catalog key: (gpu, fw), ("*", fw), (gpu, "*") and ("family:NAME", "*")."""
        for pair in sorted({c.case.pair for c in self.cases}):
            self.pair_fit(*pair)
        for name in sorted({self.families[c.case.gpu] for c in self.cases if c.case.gpu in self.families}):
            self._family_fit(name)
        done = {k: v for k, v in self._done.items() if v is not None}
        order = sorted(done, key=lambda k: (k[0] == ANY or k[1] == ANY, k[0].startswith("family:"), k))
        return {k: done[k] for k in order}


def fit_all(cases: Sequence[FitCase], prior: ServingParams | None = None, warm: Fit | None = None) -> Fit:
    """Every level fitted on ``cases`` (see ``Fit``)."""
    cat = serving_catalog()
    full = Fit(tuple(cases), prior or cat.prior, cat.gpu_family_of(), warm, gpus=cat.gpu_specs)
    full.fitted  # noqa: B018 (fits every level)
    return full


def held_out_errors(
    cases: Sequence[FitCase], full: Fit, group: Callable[[FitCase], str], levels: dict[str, str] | None = None,
    fallback: dict[str, tuple[float, str]] | None = None, ordered: bool = True,
) -> dict[str, float]:
    """Each case predicted by the fits of the cases outside its group (refitted, warm-started from ``full``, with
    its ``fallback`` pairs and, unless not ``ordered``, its hardware order); ``levels`` (when given) receives the calibration level that priced each case
    (``Fit.resolve_level``); ``fallback`` (when given) the error and level of the same refit's fallback level
    (``Fit.fallback_level``: the pair as if it had no runs)."""
    out: dict[str, float] = {}
    for value in sorted({group(c) for c in cases}):
        rest = Fit(tuple(c for c in cases if group(c) != value), full.prior, full.families, full, full.fallback,
                   full.gpus if ordered else {}, full.flagged)
        for c in cases:
            if group(c) == value:
                params, level = rest.resolve_level(*c.case.pair)
                out[c.case.id] = c.error(params)
                if levels is not None:
                    levels[c.case.id] = level
                if fallback is not None:
                    base, base_level = rest.fallback_level(*c.case.pair)
                    fallback[c.case.id] = (c.error(base), base_level)
    return out


@dataclass(frozen=True)
class Evaluation:
    """Every case's in-sample, leave-one-source-out and leave-one-GPU-out error (predicted / measured - 1)."""

    fit: Fit
    in_sample: dict[str, float]  # by case id
    loso: dict[str, float]
    logo: dict[str, float]
    cases: tuple[FitCase, ...]
    kfold: dict[str, float] = field(default_factory=dict)  # held-out points: 5 folds (FOLDS)
    kfold_level: dict[str, str] = field(default_factory=dict)  # the level that priced each held-out point
    logo_level: dict[str, str] = field(default_factory=dict)  # the level that priced each left-out GPU's case
    decisions: dict[tuple[str, str], PairDecision] = field(default_factory=dict)  # status of every fitted pair

    def median(self, errors: dict[str, float], ids: Sequence[str] | None = None) -> float:
        keys = list(errors) if ids is None else list(ids)
        return statistics.median(abs(errors[k]) for k in keys) if keys else float("nan")


def all_cases() -> tuple[FitCase, ...]:
    """The serving runs of inference.yaml and both metrics of every expressible InferenceX point."""
    return (*prepared_cases(), *prepared_metrics())


@cache
def evaluate_all() -> Evaluation:
    """The full fit, the status of every pair (``decide``), its in-sample errors, held-out-point (5-fold),
    leave-one-source-out and leave-one-GPU-out errors (tens of minutes on two cores). The 5-fold refits come first:
    they decide which pairs are priced by their fallback, and every error after that prices them so."""
    cases = all_cases()
    full = fit_all(cases)
    # the pairs whose own fit (before the hardware order) errs above 30 % rank below the others in the order: decided
    # on unordered errors, so that the order never feeds back into its own trust
    own_kfold = held_out_errors(cases, full, fold, ordered=False)
    own_in = {c.case.id: c.error(full.own_level(*c.case.pair)[0]) for c in cases}
    own = decide(cases, own_in, own_kfold, {i: (e, "") for i, e in own_kfold.items()})
    full.flagged = frozenset(p for p, d in own.items() if d.status == "uncalibrated")
    kfold_level: dict[str, str] = {}
    kfold_fallback: dict[str, tuple[float, str]] = {}
    kfold = held_out_errors(cases, full, fold, kfold_level, kfold_fallback)
    own_in_sample = {c.case.id: c.error(full.resolve(*c.case.pair)) for c in cases}
    decisions = decide(cases, own_in_sample, kfold, kfold_fallback)
    full.fallback = frozenset(p for p, d in decisions.items() if d.priced_by == "fallback")
    for c in cases:
        if c.case.pair in full.fallback:
            kfold[c.case.id], kfold_level[c.case.id] = kfold_fallback[c.case.id]
    in_sample = {c.case.id: c.error(full.resolve(*c.case.pair)) for c in cases}
    loso = held_out_errors(cases, full, lambda c: c.case.source)
    decisions = with_unseen_sources(cases, decisions, loso)
    logo_level: dict[str, str] = {}
    logo = held_out_errors(cases, full, lambda c: c.case.gpu, logo_level)
    return Evaluation(full, in_sample, loso, logo, cases, kfold, kfold_level, logo_level, decisions)


FOLDS = 5


def fold(c: FitCase) -> str:
    """Held-out points: the case's fold, by the number in its run id (both metrics of a point in one fold)."""
    digits = "".join(ch for ch in c.case.id.split(":")[0] if ch.isdigit()) or "0"
    return f"fold {int(digits) % FOLDS}"


UNCALIBRATED_ABOVE = 0.30  # issue 23: a pair whose median |error| held out exceeds 30 % is uncalibrated


def dataset(case_id: str) -> str:
    """The data set of a case: InferenceX points (ix-NNNN:metric) or the runs of inference.yaml."""
    return "inferencex.yaml" if case_id.startswith("ix-") else "inference.yaml"


@dataclass(frozen=True)
class PairDecision:
    """A fitted pair's status (issue 23): ``uncalibrated`` when the median |error| of its runs, in sample or held
    out (5-fold, its own fit refitted without the fold), exceeds UNCALIBRATED_ABOVE over all its runs or over the
    runs of any one of its sources or data sets (``by_group``), or when its runs predicted leave one source out
    (each source by the fit that never saw it: ``with_unseen_sources``) do; ``on`` names which. An uncalibrated
    pair is priced by its fallback (the level a pair without runs takes) when that level's 5-fold median over the
    same runs is lower (``priced_by``; decided on the 5-fold errors, before leave-one-source-out)."""

    priced_by: str
    in_sample: float  # the pair's own fit
    kfold: float
    by_group: dict[str, float]
    fallback_kfold: float
    fallback_level: str
    on: tuple[str, ...] = ()  # FitRecord.uncalibrated_on
    loso: float = float("nan")  # median |error| of its runs leave one source out (with_unseen_sources)
    loso_by_group: dict[str, float] = field(default_factory=dict)  # the same per source and data set

    @property
    def status(self) -> str:
        return "uncalibrated" if self.on else "calibrated"


def above(checks: Sequence[tuple[str, float]]) -> tuple[str, ...]:
    """The names of the (name, median |error|) checks above UNCALIBRATED_ABOVE: a record's ``uncalibrated_on``."""
    return tuple(name for name, err in checks if err > UNCALIBRATED_ABOVE)


def _median(errors: dict[str, float], ids: Sequence[str]) -> float:
    return statistics.median(abs(errors[i]) for i in ids)


def _by_group(cases: Sequence[FitCase], pair: tuple[str, str], errors: dict[str, float]) -> dict[str, float]:
    """The pair's median |error| over the runs of each of its sources and data sets."""
    groups: dict[str, list[str]] = {}
    for c in cases:
        if c.case.pair == pair:
            groups.setdefault(f"source {c.case.source}", []).append(c.case.id)
            groups.setdefault(dataset(c.case.id), []).append(c.case.id)
    return {g: round(_median(errors, v), 4) for g, v in sorted(groups.items())}


def decide(cases: Sequence[FitCase], in_sample: dict[str, float], kfold: dict[str, float],
           fallback: dict[str, tuple[float, str]]) -> dict[tuple[str, str], PairDecision]:
    """Every fitted pair's decision (``PairDecision``) from its own fit's in-sample and 5-fold errors and its
    fallback's 5-fold errors (by case id)."""

    out: dict[tuple[str, str], PairDecision] = {}
    for pair in sorted({c.case.pair for c in cases}):
        ids = [c.case.id for c in cases if c.case.pair == pair]
        by_group = _by_group(cases, pair, kfold)
        own_in, own_k = _median(in_sample, ids), _median(kfold, ids)
        fb = _median({i: fallback[i][0] for i in ids}, ids)
        on = above((("in-sample", own_in), ("held-out points", max(own_k, *by_group.values()))))
        out[pair] = PairDecision("fallback" if on and fb < own_k else "pair", own_in, own_k, by_group, fb,
                                 fallback[ids[0]][1], on)
    return out


def with_unseen_sources(cases: Sequence[FitCase], decisions: dict[tuple[str, str], PairDecision],
                        loso: dict[str, float]) -> dict[tuple[str, str], PairDecision]:
    """The decisions with each pair's leave-one-source-out median |error| (``loso``, by case id) over all its runs
    and over the runs of each of its sources and data sets: above UNCALIBRATED_ABOVE in any, the pair is uncalibrated
    on unseen sources too (its pricing is left as decided)."""
    out = {}
    for pair, d in decisions.items():
        err = _median(loso, [c.case.id for c in cases if c.case.pair == pair])
        by_group = _by_group(cases, pair, loso)
        on = d.on + above(((UNSEEN_SOURCES, max(err, *by_group.values())),))
        out[pair] = replace(d, on=on, loso=err, loso_by_group=by_group)
    return out


def _members(ev: Evaluation, gpu: str, fw: str) -> list[CaseInfo]:
    fam = gpu.removeprefix("family:") if gpu.startswith("family:") else None
    return [
        c.case for c in ev.cases
        if fw in (ANY, c.case.framework)
        and (gpu in (ANY, c.case.gpu) or (fam is not None and ev.fit.families.get(c.case.gpu) == fam))
    ]


def catalog_entries(ev: Evaluation) -> list[ServingCalibrationEntry]:
    """The fitted parameter sets with the record of each fit: runs, sources, the ln residuals of its runs in
    sample, in-sample / held-out-point (5-fold) / leave-one-source-out / leave-one-GPU-out medians, and its status
    (a pair's: ``PairDecision``, its in-sample residuals and in-sample and 5-fold medians those of its own fit, its
    leave-one-source-out and leave-one-GPU-out medians those of what prices it; a pooled fit's: uncalibrated when
    the in-sample or the held-out-point median exceeds 30 %)."""
    out = []
    by_id = {c.case.id: c for c in ev.cases}
    for (gpu, fw), params in ev.fit.fitted.items():
        mine = _members(ev, gpu, fw)
        ids = [c.id for c in mine]
        method = (METHOD_POOLED if gpu == ANY else METHOD_FAMILY if gpu.startswith("family:")
                  else METHOD_GPU if fw == ANY else METHOD_PAIR)
        decision = ev.decisions.get((gpu, fw))
        own = ({i: by_id[i].error(params) for i in ids} if decision is not None and decision.priced_by == "fallback"
               else ev.in_sample)
        ins = ev.median(own, ids)
        loso = ev.median(ev.loso, ids)
        if decision is None:
            kfold = ev.median(ev.kfold, ids)
            on = above((("in-sample", ins), ("held-out points", kfold), (UNSEEN_SOURCES, loso)))
            status = "uncalibrated" if on else "calibrated"
            extra: dict[str, object] = {"uncalibrated_on": list(on)}
        else:  # the pair's own fit, as decided (ev.kfold holds its fallback's errors where that prices it)
            kfold, status = decision.kfold, decision.status
            extra = {"uncalibrated_on": list(decision.on), "loso_by_group": decision.loso_by_group,
                     "own_fit_uncalibrated": (gpu, fw) in ev.fit.flagged, "kfold_by_group": decision.by_group,
                     "priced_by": decision.priced_by,
                     "fallback_kfold_median_err": round(decision.fallback_kfold, 4)}
        record = FitRecord(**{
            "runs": len(mine),
            "sources": sorted({c.source for c in mine}),
            "method": method,
            "in_sample_median_err": round(ins, 4),
            "loso_median_err": round(loso, 4),
            "logo_median_err": round(ev.median(ev.logo, ids), 4),
            "kfold_median_err": round(kfold, 4),
            "status": status,
            "residuals": [round(float(np.log1p(own[i])), 4) for i in ids],
            **extra,
        })
        rounded = ServingParams(**{k: float(f"{v:.4g}") for k, v in params.model_dump().items()})
        out.append(ServingCalibrationEntry(gpu=gpu, framework=fw, params=rounded, fit=record))
    return out


def write_catalog(path: Path, ev: Evaluation | None = None,
                  intervals: dict[str, dict[str, IntervalFactors]] | None = None) -> Path:
    """Rewrite the serving calibration file with the fitted entries (prior and framework defaults kept) and the
    interval factors ``intervals`` (``serving_intervals.interval_table`` of the same evaluation; None keeps the
    catalog's)."""
    ev = ev or evaluate_all()
    cat = serving_catalog()
    update = {"entries": catalog_entries(ev), "intervals": cat.intervals if intervals is None else intervals}
    data = cat.model_copy(update=update).model_dump(mode="json")
    header = (
        "# Serving calibration (class madmax_opt.model.serving_calibration.ServingCatalog): parameters per (GPU,\n"
        "# serving framework), fitted ONLY on the measured serving runs of data/validation/modern/inference.yaml and\n"
        "# the expressible InferenceX points of data/validation/modern/inferencex.yaml (throughput/GPU and TPOT).\n"
        "# Regenerated by `madmax-opt fit-serving` (studies/serving_fit.py); do not edit the entries by hand.\n"
        "# gpu '*' = the framework's fit pooled over GPUs (used, flagged uncalibrated, for GPUs without runs);\n"
        "# framework '*' = a GPU's (or 'family:NAME' a GPU family's) fit pooled over frameworks.\n"
        "# intervals: the 80 % interval factors per calibration level and metric (studies/serving_intervals.py).\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=115))
    return path


def default_catalog_path() -> Path:
    return Path(str(resources.files("madmax_opt").joinpath("data").joinpath(CATALOG_FILE)))
