"""Serving prediction intervals (studies/serving_intervals.py, model/serving_calibration.py): the residuals of each
calibration level, the interval of a level (both metrics as time errors, every (source, GPU) cell weighing the same)
and its coverage by hand, the factors a record carries and the interval of an evaluated serving record."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.serving_calibration import interval_level, record_interval
from madmax_opt.studies.inferencex import prepared_metrics
from madmax_opt.studies.serving_fit import Evaluation, Fit, fold
from madmax_opt.studies.serving_intervals import LevelErrors, Residuals, residuals


def test_levels_of_resolved_calibrations() -> None:
    assert interval_level("calibrated") == "calibrated"
    assert interval_level("prior") == "prior"
    for pooled in ("family:hopper", "composed", "gpu-pooled", "framework-pooled"):
        assert interval_level(pooled) == "family"


def test_record_interval_by_hand() -> None:
    label = {"interval": {"coverage": 0.8, "level": "calibrated", "tpot": [0.9, 1.25], "throughput": [0.8, 1.1]}}
    got = record_interval(label, 0.010, 1000.0, 125.0)
    assert got is not None
    assert got["tpot_s"] == pytest.approx([0.009, 0.0125])
    assert got["output_tokens_per_s"] == pytest.approx([800.0, 1100.0])
    assert got["output_tokens_per_s_per_gpu"] == pytest.approx([100.0, 137.5])
    assert record_interval({"level": "prior"}, 0.01, 1.0, 1.0) is None


def test_residuals_take_each_level_from_its_held_out_errors() -> None:
    """Ten InferenceX metrics with chosen held-out errors: calibrated residuals are the 5-fold errors of the points
    the refit priced at the calibrated level, family the leave-one-GPU-out errors priced by pooled fits, prior
    every point under the prior; each r = ln(measured / predicted) = -ln(1 + error)."""
    cases = prepared_metrics()[:10]
    cat = serving_catalog()
    err = {c.case.id: 0.05 * (i + 1) * (-1) ** i for i, c in enumerate(cases)}
    kfold_level = {c.case.id: ("calibrated" if i % 2 == 0 else "composed") for i, c in enumerate(cases)}
    logo_level = {c.case.id: ("family:blackwell" if i < 4 else "calibrated") for i, c in enumerate(cases)}
    ev = Evaluation(Fit(tuple(cases), cat.prior, cat.gpu_family_of()), err, err, err, tuple(cases), err,
                    kfold_level, logo_level)
    got = residuals(ev)
    for metric in ("throughput", "tpot"):
        mine = [(i, c) for i, c in enumerate(cases) if (c.case.kind == "tpot") == (metric == "tpot")]
        cal = got[("calibrated", metric)]
        assert cal.values == pytest.approx([-math.log1p(err[c.case.id]) for i, c in mine if i % 2 == 0])
        assert cal.groups == [fold(c) for i, c in mine if i % 2 == 0]
        assert cal.sources == [c.case.source for i, c in mine if i % 2 == 0]
        assert cal.gpus == [c.case.gpu for i, c in mine if i % 2 == 0]
        fam = got[("family", metric)]
        assert fam.values == pytest.approx([-math.log1p(err[c.case.id]) for i, c in mine if i < 4])
        assert fam.groups == [c.case.gpu for i, c in mine if i < 4]
        prior = got[("prior", metric)]
        want = [math.log(c.case.measured / c.predict(cat.prior)) for _, c in mine]
        assert prior.values == pytest.approx(want)


def _level(values: dict[str, list[tuple[float, str, str]]], gpu: str = "x") -> dict[tuple[str, str], Residuals]:
    """metric -> [(residual, group, source)] as the residuals of the calibrated level, every run on ``gpu`` (so that
    a source is one (source, GPU) cell)."""
    return {("calibrated", m): Residuals("calibrated", m, [v for v, _, _ in rs], [g for _, g, _ in rs],
                                         [s for _, _, s in rs], [gpu] * len(rs)) for m, rs in values.items()}


# TPOT residuals of sources a (4 runs) and b (2 runs), throughput residuals of source c (2 runs), all of one GPU
_SMALL = {
    "tpot": [(0.0, "g1", "a"), (0.1, "g1", "a"), (0.2, "g2", "a"), (0.3, "g2", "a"), (-0.1, "g1", "b"),
             (0.5, "g2", "b")],
    "throughput": [(-0.2, "g1", "c"), (0.0, "g2", "c")],
}


def test_level_errors_take_both_metrics_as_time_errors() -> None:
    e = LevelErrors.of(_level(_SMALL), "calibrated")
    # throughput's residuals flip sign: ln(measured / predicted rate) = -ln(measured / predicted time)
    assert list(e.values) == [0.2, 0.0, 0.0, 0.1, 0.2, 0.3, -0.1, 0.5]
    assert list(e.metrics) == ["throughput"] * 2 + ["tpot"] * 6 and list(e.sources) == list("ccaaaabb")
    assert list(e.cells) == [f"{s}|x" for s in "ccaaaabb"]


def test_interval_factors_weigh_every_cell_the_same() -> None:
    """One GPU: each source is one cell. Time errors (weight): b -0.1 (1/6); a 0.0 (1/12), c 0.0 (1/6); a 0.1; a 0.2, c 0.2; a 0.3; b 0.5 (1/6).
    Their weighted CDF reaches 0.1 at -0.1 and 0.9 only at 0.5: the time interval is [e^-0.1, e^0.5], TPOT's
    factors, and throughput's [e^-0.5, e^0.1].
    Leave one source out, TPOT: without a, b and c at 1/4 each give [-0.1, 0.5]: a's 4 runs inside; without b,
    a (1/8 each) and c (1/4 each): CDF 0.375 at 0.0 (lo = 0), 0.875 at 0.2, 1 at 0.3: [0, 0.3], b's -0.1 and 0.5
    outside: 4 of 6. Throughput: without c, a (1/8) and b (1/4): [-0.1, 0.5] holds c's 0.2 and 0.0: 2 of 2.
    By group, TPOT: without g1, a 0.2 / 0.3 (1/6 each), b 0.5 (1/3), c 0.0 (1/3) give [0, 0.5]: g1's 0.0 and 0.1
    inside, -0.1 out; without g2, a 0.0 / 0.1 (1/6), b -0.1 (1/3), c 0.2 (1/3) give [-0.1, 0.2]: g2's 0.2
    inside, 0.3 and 0.5 out: 3 of 6."""
    e = LevelErrors.of(_level(_SMALL), "calibrated")
    tpot, tput = e.factors("tpot"), e.factors("throughput")
    assert tpot is not None and tput is not None
    assert (tpot.lo, tpot.hi, tpot.runs) == (round(math.exp(-0.1), 4), round(math.exp(0.5), 4), 8)
    assert (tput.lo, tput.hi) == (round(math.exp(-0.5), 4), round(math.exp(0.1), 4))
    assert (tpot.coverage, tpot.coverage_runs, tpot.group_coverage) == (round(4 / 6, 4), 6, 0.5)
    assert (tput.coverage, tput.coverage_runs) == (1.0, 2)
    assert tpot.held_out_by == "fold"


def test_interval_needs_enough_residuals_of_the_level() -> None:
    e = LevelErrors.of(_level({"tpot": _SMALL["tpot"][:3], "throughput": []}), "calibrated")
    assert e.factors("tpot") is None and e.factors("throughput") is None


def test_serving_record_carries_its_levels_interval() -> None:
    """An evaluated serving record on a pair with a fit carries the catalog's calibrated factors on TPOT and
    throughput, and its prediction lies inside."""
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.search.serving import ServingPlan, evaluate_serving

    cat = serving_catalog()
    if "calibrated" not in cat.intervals:
        pytest.skip("the serving catalog has no intervals (madmax-opt fit-serving writes them)")
    problem = problem_from_dict({
        "model": "deepseek-r1", "hardware": {"gpu": "h200-sxm", "gpus": 8},
        "task": {"kind": "inference", "prompt_len": 1000, "output_len": 1000, "precision": "fp8"},
        "stack": {"framework": "sglang"},
    })
    rec = evaluate_serving(problem, [ServingPlan(dp=1, tp=8, ep=1, batch=16, precision="fp8")])[0].to_json()
    assert rec["calibration"]["level"] == "calibrated"
    iv = rec["interval"]
    f = cat.intervals["calibrated"]
    assert iv["level"] == "calibrated" and iv["coverage"] == cat.interval_coverage
    assert iv["tpot_s"] == pytest.approx([rec["tpot_s"] * f["tpot"].lo, rec["tpot_s"] * f["tpot"].hi])
    per_gpu = rec["output_tokens_per_s_per_gpu"]
    assert iv["output_tokens_per_s_per_gpu"] == pytest.approx(
        [per_gpu * f["throughput"].lo, per_gpu * f["throughput"].hi])
    assert iv["tpot_s"][0] <= rec["tpot_s"] <= iv["tpot_s"][1]
    assert np.isfinite(iv["output_tokens_per_s"]).all()


def test_uncalibrated_pair_carries_the_family_interval() -> None:
    """A pair with a fit whose held-out error keeps it ``uncalibrated`` is priced by its fit but carries the family
    level's (pooled fits') interval: the calibrated level's held-out residuals do not cover it. (A pair uncalibrated
    only on unseen sources keeps the calibrated interval: test_serving_uncalibrated.)"""
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.search.serving import ServingPlan, evaluate_serving

    cat = serving_catalog()
    bad = [e for e in cat.entries if "held-out points" in e.fit.uncalibrated_on
           and e.gpu in ("gb200", "h100-sxm", "b200") and e.framework == "sglang"]
    if not bad or "family" not in cat.intervals:
        pytest.skip("no uncalibrated NVIDIA SGLang pair in the serving catalog")
    problem = problem_from_dict({
        "model": "deepseek-r1", "hardware": {"gpu": bad[0].gpu, "gpus": 8},
        "task": {"kind": "inference", "prompt_len": 1000, "output_len": 1000, "precision": "fp8"},
        "stack": {"framework": "sglang"},
    })
    rec = evaluate_serving(problem, [ServingPlan(dp=1, tp=8, ep=1, batch=16, precision="fp8")])[0].to_json()
    assert rec["calibration"]["level"] == "calibrated" and rec["calibration"]["status"] == "uncalibrated"
    f = cat.intervals["family"]
    assert rec["interval"]["level"] == "family"
    assert rec["interval"]["tpot_s"] == pytest.approx([rec["tpot_s"] * f["tpot"].lo, rec["tpot_s"] * f["tpot"].hi])
