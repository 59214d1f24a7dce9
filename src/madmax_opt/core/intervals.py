"""Prediction intervals from calibration residuals, for any model family (training step time, serving TPOT, ...).

A residual is r = ln(measured / predicted) of a run the calibration did not see, or, for a datasheet prior, of any
measured run. The interval of a new prediction p at coverage c is [p exp(q_lo), p exp(q_hi)] with q_lo, q_hi the
(1 - c)/2 and (1 + c)/2 quantiles of the residuals of the level that priced it, widened to hold p itself
(q_lo <= 0 <= q_hi). Two quantiles:

- ``from_residuals``: every run weighs the same (split-conformal order statistics: the k-th smallest of n with
  k = ceil((n + 1) x level), so that a new run exchangeable with the n covers at least c on average; Vovk et al.
  2005, Lei et al. 2018). Right when the residuals are themselves errors on unseen sources (training's
  leave-one-source-out residuals, studies/intervals.py).
- ``from_clusters``: every cluster weighs the same, its runs sharing its weight (CDF pooling: the quantile of
  (1/K) sum_k F_k, the mean of the K clusters' empirical CDFs; Dunn, Wasserman & Ramdas 2023, JASA 118:2491). A
  cluster is a unit whose runs share an error (serving: a source's runs of one GPU); a run of a new cluster is
  exchangeable with the clusters, not with the runs, so the runs of one large cluster do not set the interval
  (serving, whose residuals are held out within known sources and GPUs: studies/serving_intervals.py). Its
  coverage guarantee is asymptotic in the number of clusters, not finite-sample.

Coverage is measured leave one source out: each source's runs against the interval of the other sources."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr

COVERAGE = 0.80  # the interval every record carries
MIN_RUNS = 4  # fewer residuals than this give no interval of their own (the caller pools)
TARGET = (0.75, 0.85)  # issue 24: the 80 % interval should cover 75-85 % of the runs left out


def within_target(coverage: float) -> bool:
    """Whether a measured coverage lies in TARGET."""
    return TARGET[0] <= coverage <= TARGET[1]


@dataclass(frozen=True)
class Interval:
    """Factors on a prediction: the measured value lies in [lo x predicted, hi x predicted] with ``coverage``."""

    lo: float
    hi: float
    coverage: float
    runs: int

    def of(self, predicted: float) -> tuple[float, float]:
        return predicted * self.lo, predicted * self.hi

    def of_rate(self, predicted_rate: float) -> tuple[float, float]:
        """The interval of a rate (throughput) whose time has this interval: [rate / hi, rate / lo]."""
        return predicted_rate / self.hi, predicted_rate / self.lo


def _order_statistic(sorted_r: Arr, level: float) -> float:
    """The k-th smallest residual, k = ceil((n + 1) level), clamped to the sample (split-conformal quantile)."""
    n = len(sorted_r)
    k = min(max(math.ceil((n + 1) * level), 1), n)
    return float(sorted_r[k - 1])


def from_residuals(log_ratios: Sequence[float] | Arr, coverage: float = COVERAGE) -> Interval | None:
    """The interval of ``coverage`` from residuals ln(measured / predicted); None below MIN_RUNS residuals."""
    r = np.sort(np.asarray(log_ratios, dtype=np.float64))
    if len(r) < MIN_RUNS:
        return None
    tail = (1.0 - coverage) / 2.0
    lo = min(_order_statistic(r, tail) if tail * (len(r) + 1) >= 1 else float(r[0]), 0.0)
    hi = max(_order_statistic(r, 1.0 - tail), 0.0)
    return Interval(math.exp(lo), math.exp(hi), coverage, len(r))


def cluster_weights(clusters: Sequence[str] | Arr) -> Arr:
    """Each run's weight 1 / (K n_c): K clusters of equal weight, the n_c runs of cluster c sharing 1 / K."""
    _, inverse, counts = np.unique(np.asarray(clusters), return_inverse=True, return_counts=True)
    return np.asarray(1.0 / (counts[inverse] * len(counts)), dtype=np.float64)


def weighted_quantile(values: Sequence[float] | Arr, weights: Sequence[float] | Arr, level: float) -> float:
    """The smallest value v whose weight share at or below v reaches ``level`` (the inverse of the weighted CDF)."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    w = np.asarray(weights, dtype=np.float64)[order]
    share = np.cumsum(w) / w.sum()
    k = int(np.searchsorted(share, level - 1e-12))  # 1e-12: a share summed to 0.8999999999 reaches 0.9
    return float(x[order][min(k, len(x) - 1)])


def from_clusters(log_ratios: Sequence[float] | Arr, clusters: Sequence[str] | Arr,
                  coverage: float = COVERAGE) -> Interval | None:
    """The interval of ``coverage`` from residuals with every cluster weighing the same (CDF pooling, see the module
    docstring); None below MIN_RUNS residuals."""
    r = np.asarray(log_ratios, dtype=np.float64)
    if len(r) < MIN_RUNS:
        return None
    w = cluster_weights(clusters)
    tail = (1.0 - coverage) / 2.0
    lo = min(weighted_quantile(r, w, tail), 0.0)
    hi = max(weighted_quantile(r, w, 1.0 - tail), 0.0)
    return Interval(math.exp(lo), math.exp(hi), coverage, len(r))


def held_out_coverage(log_ratios: Sequence[float] | Arr, keys: Sequence[str] | Arr,
                      interval_without: Callable[[NDArray[np.bool_]], Interval | None],
                      scored: NDArray[np.bool_] | None = None) -> tuple[float, int]:
    """(share of the ``scored`` runs (all by default) inside the interval built from the runs kept when their key's
    are left out (``interval_without(kept mask)``), runs that had one)."""
    r = np.asarray(log_ratios, dtype=np.float64)
    k = np.asarray(keys)
    mine = np.ones(len(r), dtype=bool) if scored is None else scored
    inside, counted = 0, 0
    for key in sorted(set(k[mine].tolist())):
        iv = interval_without(k != key)
        if iv is None:
            continue
        held = mine & (k == key)
        x = np.exp(r[held])
        inside += int(np.sum((x >= iv.lo) & (x <= iv.hi)))
        counted += int(held.sum())
    return (inside / counted if counted else float("nan")), counted


def loso_coverage(log_ratios: Sequence[float] | Arr, sources: Sequence[str],
                  coverage: float = COVERAGE) -> tuple[float, int]:
    """(share of runs inside the interval built without their source, runs that had one)."""
    r = np.asarray(log_ratios, dtype=np.float64)
    return held_out_coverage(r, sources, lambda kept: from_residuals(r[kept], coverage))
