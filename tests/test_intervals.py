"""Prediction intervals (issue 24 step 3): the split-conformal order statistics by hand, leave-one-source-out
coverage by hand, and every training record carrying the interval of the level that priced it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.core.intervals import (
    Interval,
    from_clusters,
    from_residuals,
    loso_coverage,
    weighted_quantile,
)
from madmax_opt.io import calibration
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.spec import Plan


def test_order_statistics_by_hand() -> None:
    ratios = [0.80, 0.85, 0.90, 0.95, 1.00, 1.05, 1.10, 1.15, 1.20]  # measured / predicted, n = 9
    iv = from_residuals(np.log(ratios))
    # k = ceil((n + 1) x 0.1) = 1 and ceil(10 x 0.9) = 9: the extremes
    assert iv is not None and (iv.lo, iv.hi, iv.runs) == (pytest.approx(0.80), pytest.approx(1.20), 9)
    ratios19 = [0.80 + 0.02 * i for i in range(19)]  # n = 19: k = ceil(2.0) = 2 and ceil(18.0) = 18
    iv19 = from_residuals(np.log(ratios19))
    assert iv19 is not None and (iv19.lo, iv19.hi) == (pytest.approx(0.82), pytest.approx(1.14))


def test_an_interval_always_holds_the_prediction_and_needs_runs() -> None:
    iv = from_residuals(np.log([1.1, 1.2, 1.3, 1.4, 1.5]))  # every run slower than predicted
    assert iv is not None and iv.lo == 1.0 and iv.hi == pytest.approx(1.5)
    assert from_residuals([0.1, 0.2, 0.3]) is None


def test_cluster_weighted_interval_by_hand() -> None:
    # cluster a: 8 runs at ratios 0.90 ... 1.25 (1/16 each), cluster b: 0.70 and 1.50 (1/4 each). Weighted CDF:
    # 0.25 at 0.70 (reaches 0.1), 0.75 at 1.25, 1 at 1.50 (first to reach 0.9): [0.70, 1.50]
    a = [0.90, 0.95, 1.00, 1.05, 1.10, 1.15, 1.20, 1.25]
    r = np.log([*a, 0.70, 1.50])
    iv = from_clusters(r, ["a"] * 8 + ["b"] * 2)
    assert iv is not None and (iv.lo, iv.hi, iv.runs) == (pytest.approx(0.70), pytest.approx(1.50), 10)
    runs = from_residuals(r)  # every run the same: k = ceil(11 x 0.1) = 2 -> 0.90, ceil(9.9) = 10 -> 1.50
    assert runs is not None and (runs.lo, runs.hi) == (pytest.approx(0.90), pytest.approx(1.50))
    assert from_clusters([0.1, 0.2, 0.3], ["a", "b", "c"]) is None


def test_weighted_quantile_reaches_its_level_exactly() -> None:
    assert weighted_quantile([4.0, 1.0, 3.0, 2.0], [1, 1, 1, 1], 0.5) == 2.0  # share 0.5 at 2: the smallest
    ten = [float(i) for i in range(10)]
    assert weighted_quantile(ten, [0.1] * 10, 0.9) == 8.0  # 0.1 summed nine times is 0.8999999999999999


def test_rate_interval_inverts_the_time_interval() -> None:
    iv = Interval(0.8, 1.25, 0.8, 10)
    assert iv.of(2.0) == (1.6, 2.5)
    assert iv.of_rate(100.0) == (80.0, 125.0)


def test_loso_coverage_by_hand() -> None:
    # sources a, b: a's 5 runs at ratio 1.0..1.4 step 0.1, b's 5 runs at 1.0; held out, b's runs sit at 1.0, inside
    # a's interval [1.0 (clamped), 1.4]; a's runs against b's interval [1.0, 1.0]: only the 1.0 run is inside
    r = list(np.log([1.0, 1.1, 1.2, 1.3, 1.4])) + [0.0] * 5
    share, n = loso_coverage(r, ["a"] * 5 + ["b"] * 5)
    assert (share, n) == (pytest.approx(6 / 10), 10)


def test_records_carry_the_interval_of_their_level() -> None:
    base = {"model": "llama3-8b", "task": {"seq_len": 4096, "global_batch": 64}}
    for gpu, level in (("h100-sxm", "calibrated"), ("h200-sxm", "family")):
        p = problem_from_dict({**base, "hardware": {"gpu": gpu, "gpus": [8]}})
        (rec,) = evaluate(p, [Plan(dp=8)])
        expected = calibration.step_interval("megatron-core", level if level == "calibrated" else "family:x")
        assert expected is not None
        iv = rec["interval"]
        assert iv["step_time_s"] == [rec["step_time_s"] * expected.lo, rec["step_time_s"] * expected.hi]
        assert iv["tokens_per_s"] == [rec["tokens_per_s"] / expected.hi, rec["tokens_per_s"] / expected.lo]
        assert iv["coverage"] == 0.8 and iv["step_time_s"][0] <= rec["step_time_s"] <= iv["step_time_s"][1]
        assert math.isclose(rec["calibration"]["interval"]["lo"], expected.lo)


def _rec(tokens_per_s: float, lo: float, hi: float, system: str = "dgx-h100") -> dict[str, object]:
    step = 1000.0 / tokens_per_s  # 1000 tokens per step
    return {"plan": {"system": system}, "hardware": {"system": system, "gpus": 8}, "feasible": True,
            "step_time_s": step, "tokens_per_s": tokens_per_s, "cost_per_hour_usd": 40.0,
            "interval": {"coverage": 0.8, "level": "x", "step_time_s": [step * lo, step * hi]}}


def test_robust_choice_by_hand() -> None:
    from madmax_opt.search.robust import robust_summary, with_robust

    p = problem_from_dict({"model": "llama3-8b", "hardware": {"gpu": "h100-sxm", "gpus": [8]},
                           "task": {"seq_len": 4096, "global_batch": 64}})
    # throughput: the value is seconds per token = 1 / tokens_per_s
    recs = [_rec(1000.0, 0.8, 1.5), _rec(980.0, 0.95, 1.05), _rec(700.0, 0.9, 1.1)]
    s = robust_summary(p, recs)
    worst = [1.5 / 1000.0, 1.05 / 980.0, 1.1 / 700.0]
    assert s["worst_case"] == pytest.approx(worst, rel=1e-12)
    # plan 3's best case 0.9 / 700 = 1.286e-3 is below the best's worst case 1.5e-3: the intervals overlap
    assert s["indistinguishable_from_best"] == [0, 1, 2]
    assert s["robust_choice"] == 1  # 1.071e-3 is the least worst case
    out = with_robust(p, {"top": recs, "best": recs[0], "baseline": None}, robust=True)
    assert out["best"] is recs[1] and out["top"] == [recs[1], recs[0], recs[2]]
    assert out["robust"]["best_chosen_by"] == "robust worst case"
    assert with_robust(p, {"top": recs, "best": recs[0], "baseline": None}, robust=False)["best"] is recs[0]
    narrow = robust_summary(p, [_rec(1000.0, 0.95, 1.05), _rec(700.0, 0.95, 1.05)])
    assert narrow["indistinguishable_from_best"] == [0]  # 0.95 / 700 = 1.357e-3 > 1.05e-3


@pytest.mark.parametrize(("objective", "worst", "text"), [
    ("throughput", 1.0 / 2_000_000, "at worst 2,000,000 tokens/s"),  # s per token -> tokens/s
    ("cost", 0.5e-6, "at worst $0.5 per million tokens"),  # $ per token x 1e6
    ("time_to_train", 7200.0, "at worst 2.0 h to train"),  # s / 3600
    ("energy", 0.25, "at worst 0.25 J per token"),
])
def test_robust_line_reads_the_worst_case_in_the_objective_s_units(objective: str, worst: float, text: str) -> None:
    from madmax_opt.report.report import robust_text

    line = robust_text({"objective": objective, "value": [worst / 2, worst], "worst_case": [worst * 3, worst],
                        "indistinguishable_from_best": [0, 1], "robust_choice": 1,
                        "best_chosen_by": "predicted value"})
    assert f"candidate 2 ({text})" in line and "candidate(s) 1, 2 of 2" in line, line
