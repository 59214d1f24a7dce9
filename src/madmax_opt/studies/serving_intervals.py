"""Serving prediction intervals: the 80 % interval every serving record carries on its throughput and TPOT, from
the held-out residuals of the calibration level that priced it, and the coverage of that interval on left-out runs.

Residual r = ln(measured / predicted) of a metric priced at a level that was not fitted on it:

- ``calibrated`` (the pair's own fit): the point predicted by the 5-fold refit without its fold, where that refit
  still prices it at the calibrated level (held-out points of a fitted pair);
- ``family`` (a pair without runs: its GPU's, family's or framework's pooled fits; levels family:NAME, composed,
  gpu-pooled, framework-pooled): the point predicted by the leave-one-GPU-out refit;
- ``prior`` (nothing fitted): the point predicted with the universal prior.

Metrics: ``throughput`` (output tokens/s, per GPU or total: the same factor) from the throughput cases
(InferenceX tput_per_gpu, inference.yaml static / max_load), ``tpot`` from the InferenceX median TPOT.

The interval of a level is built for a run of a source or GPU not seen (issue 24), in two steps:

1. Both metrics are errors of the same predicted time (throughput = tokens / time), so a level's residuals of
   both metrics are one sample of step-time errors t = ln(measured / predicted time): t = r for TPOT, -r for
   throughput (``SIGN``). TPOT alone has two sources (the InferenceX dashboard and CI artifacts), too few to see
   how a source unlike the others errs; with throughput's the level has six.
2. Every cluster weighs the same (core/intervals.from_clusters: CDF pooling, the quantiles of the mean of the
   clusters' empirical CDFs), a cluster being a source's runs of one GPU (a cell source x GPU): the residuals are
   held out within known sources (and, at the family level, GPUs), and the runs of one cell share its error (the
   GPU's fit, the source's setup), so a run of a new source or a new GPU, which arrives as new cells, is
   exchangeable with the cells, not with the runs; weighing runs let the dashboard's 190 points set the interval,
   weighing sources let a source's largest GPU set its share.

The time interval [lo, hi] is TPOT's factors; throughput's are [1 / hi, 1 / lo]. Coverage is measured leave one
source out, as issue 24 asks: each source's runs of a metric against the interval built from the other sources'
residuals (both metrics); also shown: the same by the grouping the residuals were held out by (fold, GPU).

Measured on the same residuals, coverage leave one source out / by held-out group (calibrated throughput, TPOT;
family throughput, TPOT; prior throughput, TPOT), both metrics unless said:
- this rule, (source, GPU) cells: 76.6/84.1, 82.0/87.4; 79.6/77.3, 75.6/74.4; 82.5/82.5, 83.7/83.7 % (every
  leave-one-source-out verdict within 75-85 %; outside, by held-out group: calibrated TPOT 87.4, family TPOT 74.4,
  whose 66 MI355X runs are covered 39 % by the other GPUs' interval, the other six GPUs 67-100 %);
- sources weighing the same (the rule before): 76.6/80.8, 82.5/85.7; 75.7/73.1, 73.2/73.2; 79.0/79.0, 81.7/81.7;
- every run: 67.5/76.3, 73.5/82.4; 84.1/78.0, 82.9/75.2; 83.5/83.5, 83.7/83.7;
- held-out groups (fold, GPU, source): 66.6/75.3, 72.7/82.0; 89.6/76.1, 88.6/73.6; 79.0/79.0, 81.7/81.7;
- GPUs: 67.9/80.2, 72.7/84.1; 89.6/76.1, 88.6/73.6; 84.8/84.8, 84.6/84.6;
- (source, held-out group) cells: 77.9/80.8, 84.5/86.9; 79.6/77.3, 75.6/74.4; 79.0/79.0, 81.7/81.7;
- (source, pair) cells: 75.3/81.5, 81.2/86.5; 80.6/79.3, 75.6/74.4; 83.2/83.2, 84.6/84.6 (this and the line
  above miss the same two checks as this rule, calibrated TPOT by less; the cell is the GPU's because a new GPU or
  source is what arrives, a fold is no unit of arrival, and a pair's cells split a GPU's shared error);
- nested, sources the same and a source's GPUs the same: 78.6/83.8, 85.3/86.9; 75.4/73.1, 72.8/72.4; 81.6/81.6,
  83.3/83.3; GPUs the same and a GPU's sources the same: 72.1/79.9, 78.4/85.3; 90.9/81.6, 88.6/78.9; 84.8/84.8,
  84.6/84.6;
- (source, GPU) cells per metric: 76.3/85.1, 62.0/81.2; 79.6/79.0, 86.2/80.5; 84.8/84.8, 86.6/86.6;
- symmetric score |t - weighted median| of the cells: 76.0/79.2, 82.4/86.5; 84.1/80.9, 86.2/79.7; 72.8/72.8,
  77.6/77.6;
- finite-sample corrections, each above 85 % somewhere: hierarchical conformal (Lee, Barber & Willett 2023,
  arXiv:2306.06342: an atom 1/(K+1) at +inf beside K clusters) per tail is infinite with K = 6 sources (a tail of
  10 % needs K >= 9), with K = the (source, GPU) cells 92.9/91.6, 97.1/93.9; 93.9/89.0, 93.9/84.6; 92.6/92.6,
  92.3/92.3, on |t - median| 79.9/85.7, 86.9/89.8; 86.7/85.4, 87.0/84.6; 81.6/81.6, 85.8/85.8; the weighted
  split-conformal atom (Tibshirani et al. 2019, NeurIPS) of weight 1 / (n_eff + 1), n_eff Kish's effective sample
  size of the cell weights: 76.9/84.7, 83.7/88.2; 85.1/77.7, 81.3/74.8; 84.8/84.8, 83.7/83.7.
Measured before (leave one source out only): every run, per metric 74.0 / 63.7, 78.6 / 89.8, 84.5 / 83.7 %; sources
the same, per metric 76.6 / 62.4, 75.1 / 86.2, 80.9 / 83.7 % (a held-out TPOT source is judged against the one
other); two-level (each source's median offset convolved with the source-centred residuals): per metric
76.3 / 62.4, 72.8 / 86.2, 80.3 / 83.7 %, both metrics 76.0 / 83.3, 73.5 / 72.0, 79.9 / 81.3 %, each metric's own
offsets with both metrics' centred residuals 75.3 / 80.8, 77.0 / 65.9, 80.6 / 79.7 %; leave-one-source-out
residuals (each source priced by the refit without it): calibrated TPOT 21.5 %, throughput 70.4 %.
No construction measured holds all twelve within 75-85 %: the by-held-out-group checks ask for a new run of a known
source (calibrated folds: the run-weighted interval, too narrow for a new source) or a new GPU (family: MI355X errs
beyond the others' residuals). Training keeps the run-weighted quantile (studies/intervals.py): its residuals are
already errors on unseen sources, and the source- and cell-weighted ones covered less there. Written into
data/serving_calibration.yaml by ``madmax-opt fit-serving``; the tables of ``validate``
(results/validation/inferencex.md) show them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.intervals import COVERAGE, Interval, from_clusters, held_out_coverage, within_target
from madmax_opt.core.numeric import Arr
from madmax_opt.model.serving_calibration import (
    INTERVAL_LEVELS,
    INTERVAL_METRICS,
    IntervalFactors,
    interval_level,
)
from madmax_opt.studies.serving_cases import FitCase
from madmax_opt.studies.serving_fit import Evaluation, fold

KINDS: dict[str, tuple[str, ...]] = {"throughput": ("tput_per_gpu", "static", "max_load"), "tpot": ("tpot",)}
HELD_OUT_BY: dict[str, str] = {"calibrated": "fold", "family": "gpu", "prior": "source"}
SIGN: dict[str, float] = {"throughput": -1.0, "tpot": 1.0}  # ln(time ratio) = -ln(rate ratio): rate = tokens / time


@dataclass(frozen=True)
class Residuals:
    """The held-out residuals of one (level, metric), the group each was held out in, its source and GPU."""

    level: str
    metric: str
    values: list[float]
    groups: list[str]
    sources: list[str]
    gpus: list[str]


@dataclass(frozen=True)
class LevelErrors:
    """A level's residuals of both metrics as step-time errors ln(measured / predicted time), with the metric,
    group, source and GPU of each."""

    level: str
    values: Arr
    metrics: Arr
    groups: Arr
    sources: Arr
    gpus: Arr

    @classmethod
    def of(cls, res: dict[tuple[str, str], Residuals], level: str) -> LevelErrors:
        rs = [res[(level, m)] for m in INTERVAL_METRICS if (level, m) in res]
        return cls(level, np.array([SIGN[r.metric] * v for r in rs for v in r.values], dtype=np.float64),
                   np.array([r.metric for r in rs for _ in r.values], dtype=object),
                   np.array([g for r in rs for g in r.groups], dtype=object),
                   np.array([s for r in rs for s in r.sources], dtype=object),
                   np.array([g for r in rs for g in r.gpus], dtype=object))

    @property
    def cells(self) -> Arr:
        """Each residual's cluster: its (source, GPU) cell, as "source|gpu"."""
        return np.array([f"{s}|{g}" for s, g in zip(self.sources, self.gpus, strict=True)], dtype=object)

    def interval(self, keep: NDArray[np.bool_] | None = None) -> Interval | None:
        """The step-time interval from the kept residuals (all by default), every (source, GPU) cell weighing the
        same."""
        k = np.ones(len(self.values), dtype=bool) if keep is None else keep
        return from_clusters(self.values[k], self.cells[k])

    def coverage(self, metric: str, by: str) -> tuple[float, int]:
        """(share of the metric's runs inside the interval built without their source (``by`` = "source") or group
        (``by`` = "group"), runs that had one)."""
        keys = self.sources if by == "source" else self.groups
        return held_out_coverage(self.values, keys, self.interval, self.metrics == metric)

    def factors(self, metric: str) -> IntervalFactors | None:
        """The metric's factors with their leave-one-source-out coverage (issue 24's check) and their coverage by the
        groups the residuals were held out in; None without residuals of the metric or enough of the level."""
        iv = self.interval()
        if iv is None or not np.any(self.metrics == metric):
            return None
        lo, hi = (iv.lo, iv.hi) if SIGN[metric] > 0 else (1.0 / iv.hi, 1.0 / iv.lo)
        cov, n = self.coverage(metric, "source")
        by_group, _ = self.coverage(metric, "group")
        return IntervalFactors(lo=round(lo, 4), hi=round(hi, 4), runs=iv.runs, held_out_by=HELD_OUT_BY[self.level],
                               coverage=None if np.isnan(cov) else round(cov, 4), coverage_runs=n,
                               group_coverage=None if np.isnan(by_group) else round(by_group, 4))


Row = tuple[IntervalFactors | None, int, int, int]  # factors or None, the metric's residuals, sources, cells


def level_factors(ev: Evaluation) -> dict[tuple[str, str], Row]:
    """(level, metric) -> (factors or None, the metric's residuals, the level's sources, its (source, GPU) cells)."""
    res = residuals(ev)
    out: dict[tuple[str, str], Row] = {}
    for level in INTERVAL_LEVELS:
        errors = LevelErrors.of(res, level)
        for metric in INTERVAL_METRICS:
            out[(level, metric)] = (errors.factors(metric), len(res[(level, metric)].values),
                                    len(set(errors.sources)), len(set(errors.cells)))
    return out


def _kind(case_id: str, kinds: dict[str, str]) -> str | None:
    k = kinds[case_id]
    return next((m for m, ks in KINDS.items() if k in ks), None)


def residuals(ev: Evaluation) -> dict[tuple[str, str], Residuals]:
    """(level, metric) -> the held-out residuals of that level (see the module docstring)."""
    kinds = {c.case.id: str(getattr(c.case, "kind", "")) for c in ev.cases}
    out = {(lv, m): Residuals(lv, m, [], [], [], []) for lv in INTERVAL_LEVELS for m in INTERVAL_METRICS}

    def add(level: str, c: FitCase, error: float, group: str) -> None:
        metric = _kind(c.case.id, kinds)
        if metric is not None and np.isfinite(error) and error > -1.0:
            r = out[(level, metric)]
            r.values.append(float(-np.log1p(error)))  # ln(measured / predicted)
            r.groups.append(group)
            r.sources.append(c.case.source)
            r.gpus.append(c.case.gpu)

    for c in ev.cases:
        i = c.case.id
        if ev.kfold_level.get(i) == "calibrated":
            add("calibrated", c, ev.kfold[i], fold(c))
        if i in ev.logo_level and interval_level(ev.logo_level[i]) == "family":
            add("family", c, ev.logo[i], c.case.gpu)
        add("prior", c, c.error(ev.fit.prior), c.case.source)
    return out


def interval_table(ev: Evaluation) -> dict[str, dict[str, IntervalFactors]]:
    """The catalog's ``intervals`` block: level -> metric -> factors (levels or metrics without enough residuals
    left out)."""
    out: dict[str, dict[str, IntervalFactors]] = {}
    for (level, metric), (f, _, _, _) in level_factors(ev).items():
        if f is not None:
            out.setdefault(level, {})[metric] = f
    return out


def coverage_lines(ev: Evaluation) -> list[str]:
    """The report section: per level and metric, the interval and its coverage on left-out runs."""
    lines = [
        f"## Prediction intervals ({COVERAGE:.0%}) and their coverage",
        "",
        "Every serving record carries an interval on its throughput and TPOT from the held-out residuals "
        "ln(measured / predicted) of the calibration level that priced it (`studies/serving_intervals.py`, "
        "`core/intervals.py`): calibrated = held-out points of a fitted pair (5-fold refits), family = points of a "
        "GPU left out (its family's / pooled fits), prior = every point under the universal prior. A level's "
        "residuals of both metrics are taken as errors of the predicted time (throughput's sign flipped) and every "
        "(source, GPU) cell weighs the same (the mean of the cells' empirical distributions): the interval is for a "
        "run of a source or GPU not seen. The time interval [lo, hi] is TPOT's; throughput's is [1 / hi, 1 / lo]. Coverage (issue "
        "24's check, the verdict): leave one source out, each source's runs against the interval built from the "
        "other sources' residuals. By held-out group: the same with the groups the residuals were held out in "
        "(fold, GPU). Target 75-85 %.",
        "",
        "| level | metric | residuals (metric / level) | sources / (source, GPU) cells | interval (x predicted) | residuals held out by "
        "| coverage, leave one source out | by held-out group | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    misses: list[str] = []
    for (level, metric), (f, own, sources, cells) in level_factors(ev).items():
        if f is None:
            lines.append(f"| {level} | {metric} | {own} | {sources} / {cells} | - | - | - | - | too few residuals |")
            continue
        cov = "- (one source)" if f.coverage is None else f"{100 * f.coverage:.1f} % of {f.coverage_runs}"
        group = "-" if f.group_coverage is None else f"{100 * f.group_coverage:.1f} %"
        verdict = ("-" if f.coverage is None else "pass" if within_target(f.coverage) else "**outside 75-85 %**")
        lines.append(f"| {level} | {metric} | {own} / {f.runs} | {sources} / {cells} | {f.lo:.3f} - {f.hi:.3f} "
                     f"| {f.held_out_by} | {cov} | {group} | {verdict} |")
        misses += [f"{level} / {metric} {name} ({100 * c:.1f} %)" for name, c in
                   (("leave one source out", f.coverage), ("by held-out group", f.group_coverage))
                   if c is not None and not within_target(c)]
    lines += ["", f"Outside 75-85 %: {'; '.join(misses)}." if misses else "Every coverage within 75-85 %."]
    return lines


def coverage_summary(ev: Evaluation) -> list[str]:
    """One line per (level, metric): the serving interval's coverage on left-out runs."""
    out = []
    for (level, metric), (f, _, _, _) in level_factors(ev).items():
        if f is not None and f.coverage is not None:
            out.append(f"serving {COVERAGE:.0%} interval coverage, {level} / {metric}: {100 * f.coverage:.1f} % of "
                       f"{f.coverage_runs} runs, leave one source out (residuals held out by {f.held_out_by}; target "
                       "75-85 %)")
    return out
