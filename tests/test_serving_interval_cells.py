"""Serving intervals weigh every (source, GPU) cell the same (studies/serving_intervals.LevelErrors, core/intervals
.from_clusters): an example by hand where cells and sources differ, and the interval and its held-out coverage
against a brute-force mean of the cells' empirical CDFs in exact fractions on random residual sets."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from madmax_opt.core.intervals import cluster_weights
from madmax_opt.studies.serving_intervals import LevelErrors, Residuals


def _tpot(rows: list[tuple[float, str, str, str]]) -> dict[tuple[str, str], Residuals]:
    """[(time error, group, source, gpu)] as the calibrated level's TPOT residuals."""
    return {("calibrated", "tpot"): Residuals("calibrated", "tpot", [r[0] for r in rows], [r[1] for r in rows],
                                              [r[2] for r in rows], [r[3] for r in rows])}


def test_cluster_weights_by_hand() -> None:
    # cells a|g1 (3 runs), a|g2 (1), b|g1 (2): K = 3, each cell 1/3 shared by its runs
    w = cluster_weights(["a|g1", "a|g2", "a|g1", "b|g1", "a|g1", "b|g1"])
    assert list(w) == pytest.approx([1 / 9, 1 / 3, 1 / 9, 1 / 6, 1 / 9, 1 / 6])


def test_a_sources_odd_gpu_weighs_as_a_cell() -> None:
    """Source a: GPU g1 at 0.0, 0.1, 0.2, 0.3 and GPU g2 at 0.8; source b: g1 at -0.1 and 0.2 (groups = GPUs).
    Cells a|g1 (1/12 each), a|g2 (1/3), b|g1 (1/6 each): CDF 1/6 at -0.1 (reaches 0.1), 2/3 at 0.3, 1 at 0.8:
    [e^-0.1, e^0.8]. Weighing sources instead (a 1/10 each, b 1/4 each) the CDF reaches 0.9 at 0.3.
    Leave one source out: without a, b's 2 runs are too few; without b, a|g1 1/8 each, a|g2 1/2 give [0 (the
    lower tail 0.0, clamped), 0.8]: b's -0.1 out, 0.2 in: 1 of 2. By group: without g1 one run (too few); without
    g2, a 1/8 and b 1/4 each give [-0.1, 0.3]: g2's 0.8 out: 0 of 1."""
    rows = [(0.0, "g1", "a", "g1"), (0.1, "g1", "a", "g1"), (0.2, "g1", "a", "g1"), (0.3, "g1", "a", "g1"),
            (0.8, "g2", "a", "g2"), (-0.1, "g1", "b", "g1"), (0.2, "g1", "b", "g1")]
    e = LevelErrors.of(_tpot(rows), "calibrated")
    iv = e.interval()
    assert iv is not None and (iv.lo, iv.hi) == (pytest.approx(math.exp(-0.1)), pytest.approx(math.exp(0.8)))
    assert e.coverage("tpot", "source") == (0.5, 2)
    assert e.coverage("tpot", "group") == (0.0, 1)


def _brute_interval(t: list[float], cells: list[str]) -> tuple[float, float] | None:
    """[exp lo, exp hi]: the smallest residuals where (1/K) sum_k F_k, in exact fractions, reaches 0.1 and 0.9,
    clamped to hold 0; None below 4 residuals."""
    if len(t) < 4:
        return None
    names = sorted(set(cells))

    def cdf(v: float) -> Fraction:
        return sum((Fraction(sum(1 for x, c in zip(t, cells, strict=True) if c == k and x <= v),
                             sum(1 for c in cells if c == k)) for k in names), Fraction(0)) / len(names)

    lo = min(v for v in t if cdf(v) >= Fraction(1, 10))
    hi = min(v for v in t if cdf(v) >= Fraction(9, 10))
    return math.exp(min(lo, 0.0)), math.exp(max(hi, 0.0))


def test_interval_and_coverage_match_brute_force() -> None:
    rng = random.Random(24)
    for _ in range(40):
        n_tpot, n_tput = rng.randint(2, 14), rng.randint(2, 14)
        res = {("family", m): Residuals("family", m, [], [], [], []) for m in ("tpot", "throughput")}
        for m, n in (("tpot", n_tpot), ("throughput", n_tput)):
            for _ in range(n):
                gpu = rng.choice(["g1", "g2", "g3"])
                r = res[("family", m)]
                r.values.append(rng.choice([-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.4]))
                r.groups.append(gpu)
                r.sources.append(rng.choice(["s1", "s2", "s3", "s4"]))
                r.gpus.append(gpu)
        e = LevelErrors.of(res, "family")
        # time errors: TPOT's residual, throughput's with its sign flipped
        t = [-v for v in res[("family", "throughput")].values] + res[("family", "tpot")].values
        rows = [(x, m, g, s) for x, m, g, s in zip(
            t, ["throughput"] * n_tput + ["tpot"] * n_tpot,
            res[("family", "throughput")].groups + res[("family", "tpot")].groups,
            res[("family", "throughput")].sources + res[("family", "tpot")].sources, strict=True)]
        want = _brute_interval(t, [f"{s}|{g}" for _, _, g, s in rows])
        got = e.interval()
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert (got.lo, got.hi) == (pytest.approx(want[0]), pytest.approx(want[1]))
        for metric in ("tpot", "throughput"):
            for by, col in (("source", 3), ("group", 2)):
                inside, counted = 0, 0
                for key in {r[col] for r in rows if r[1] == metric}:
                    kept = [r for r in rows if r[col] != key]
                    iv = _brute_interval([r[0] for r in kept], [f"{r[3]}|{r[2]}" for r in kept])
                    if iv is None:
                        continue
                    held = [r for r in rows if r[col] == key and r[1] == metric]
                    inside += sum(1 for r in held if iv[0] <= math.exp(r[0]) <= iv[1])
                    counted += len(held)
                cov, n = e.coverage(metric, by)
                assert n == counted
                assert (np.isnan(cov) and counted == 0) or cov == pytest.approx(inside / counted)
