"""Prediction intervals from calibration residuals, for any model family (training step time, serving TPOT, ...).

A residual is r = ln(measured / predicted) of a run the calibration did not see (leave-one-source-out) or, for a
datasheet prior, of any measured run. The interval of a new prediction p at coverage c is
[p exp(q_lo), p exp(q_hi)] with q_lo, q_hi the (1 - c)/2 and (1 + c)/2 quantiles of the residuals of the level
that priced it (split-conformal order statistics: the k-th smallest of n with k = ceil((n + 1) x level), so that
a new run exchangeable with the n covers at least c on average; Vovk et al. 2005, Lei et al. 2018).
Its coverage is measured leave-one-source-out: each source's runs against the interval of the other sources."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from madmax_opt.core.numeric import Arr

COVERAGE = 0.80  # the interval every record carries
MIN_RUNS = 4  # fewer residuals than this give no interval of their own (the caller pools)


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


def loso_coverage(log_ratios: Sequence[float] | Arr, sources: Sequence[str],
                  coverage: float = COVERAGE) -> tuple[float, int]:
    """(share of runs inside the interval built without their source, runs that had one)."""
    r = np.asarray(log_ratios, dtype=np.float64)
    src = np.asarray(sources)
    inside, counted = 0, 0
    for s in sorted(set(sources)):
        held = src == s
        iv = from_residuals(r[~held], coverage)
        if iv is None:
            continue
        x = np.exp(r[held])
        inside += int(np.sum((x >= iv.lo) & (x <= iv.hi)))
        counted += int(held.sum())
    return (inside / counted if counted else float("nan")), counted
