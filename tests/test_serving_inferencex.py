"""InferenceX points posed as serving problems (studies/inferencex.py), MTP in the decode round, expressibility."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.inference import accepted_tokens
from madmax_opt.studies.inferencex import (
    STALL_REASON,
    load_points,
    prepare,
    prepared_points,
    raw_rows,
    to_point,
)


def _row(key: str) -> dict[str, Any]:
    rows = raw_rows()
    return next(r for r in rows if r["key"] == key)


def test_attention_dp_row_is_one_gpu_replicas_sharing_the_experts() -> None:
    rows = raw_rows()
    row = next(r for r in rows if r["dp_attention"] and not r["disagg"] and r["tp"] == 8)
    p = to_point(row)
    assert p.decode is not None and p.prefill is None and p.reason is None
    plan = p.decode.plan
    # SGLang / TensorRT-LLM --enable-dp-attention with tp 8: 8 attention replicas of 1 GPU, experts over all 8
    assert (plan.dp, plan.tp, plan.ep) == (8, 1, 8)
    assert plan.batch == math.ceil(row["concurrency"] / 8)
    task = p.decode.data["task"]
    # lengths uniform in [0.8 L, L]: the mean request
    assert task["prompt_len"] == round(0.9 * row["isl"]) and task["output_len"] == round(0.9 * row["osl"])


def test_disaggregated_row_has_a_prefill_and_a_decode_engine() -> None:
    p = to_point(_row("dsr1-b200-dynamo-sglang-fp4-disagg-1024x1024-c64-p1x4-d6x8"))
    assert p.decode is not None and p.prefill is not None
    # decode: 6 workers of 8 GPUs, tp 8 ep 8, no attention DP; 64 clients over 6 workers
    assert (p.decode.workers, p.decode.plan.dp, p.decode.plan.tp, p.decode.plan.ep) == (6, 1, 8, 8)
    assert p.decode.plan.batch == math.ceil(64 / 6) and p.decode.data["hardware"]["gpus"] == 8
    # prefill: 1 worker of 4 GPUs with attention DP
    assert (p.prefill.workers, p.prefill.plan.dp, p.prefill.plan.tp, p.prefill.plan.ep) == (1, 4, 1, 4)


def test_mtp_rows_verify_the_framework_draft_count() -> None:
    rows = raw_rows()
    sgl = next(r for r in rows if r["mtp"] and r["framework_key"] == "sglang")
    point = to_point(sgl)
    assert point.decode is not None and point.decode.data["task"]["speculative_tokens"] == 2


def test_accepted_tokens_by_hand() -> None:
    assert accepted_tokens(np.array([0.5]), 2)[0] == pytest.approx(1.0 + 0.5 + 0.25)
    assert accepted_tokens(np.array([0.8]), 0)[0] == 1.0


def test_mtp_round_time_does_not_depend_on_acceptance() -> None:
    """decode_step_s is per emitted token: x E(a, d) it is the round (verify 1 + d tokens + d draft passes)."""
    rows = raw_rows()
    row = next(r for r in rows if r["mtp"] and r["framework_key"] == "trt" and not r["disagg"])
    prepared = prepare(to_point(row))
    assert not isinstance(prepared, str)
    prior = serving_catalog().prior
    params = [prior.model_copy(update={"spec_acceptance": a}) for a in (0.3, 0.9)]
    t = prepared.decode.terms(params)
    d = prepared.decode.model.task.speculative_tokens
    rounds = t.decode_step_s * accepted_tokens(np.array([0.3, 0.9]), d)
    assert d == 3 and rounds[0] == pytest.approx(rounds[1], rel=1e-12)
    assert np.all(t.step["draft"] > 0.0) and t.decode_step_s[1] < t.decode_step_s[0]


def test_points_name_why_they_cannot_be_posed() -> None:
    points = load_points()
    assert len(points) == 260
    missing = [p for p in points if p.reason is not None and p.reason != STALL_REASON]
    # only the experimental Qwen3.5 / MiniMax rows name models outside the catalog
    assert all("not in the catalog" in (p.reason or "") and p.source == "experimental" for p in missing)


def test_data_quality_rule_flags_stalled_streams_only() -> None:
    """The broken-run rule: p99 inter-token gap > 20 x the row's median gap, applied to every row (ratios taken from
    the raw metrics here). ix-0077 (B300 SGLang, 19.1 s p99 gap over a 0.92 s median) is one of them."""
    flagged = {r["id"] for r in raw_rows()
               if r["metrics"].get("p99_itl_ms") and r["metrics"].get("median_itl_ms")
               and r["metrics"]["p99_itl_ms"] / r["metrics"]["median_itl_ms"] > 20.0}
    assert "ix-0077" in flagged
    by_rule = {p.id for p in load_points() if p.reason == STALL_REASON}
    assert by_rule == flagged
    row = dict(_row("dsr1-b200-sglang-fp4-1024x1024-c8-tp4ep1"))
    m = row["metrics"]
    assert to_point({**row, "metrics": {**m, "p99_itl_ms": 20.5 * m["median_itl_ms"]}}).reason == STALL_REASON
    assert to_point({**row, "metrics": {**m, "p99_itl_ms": 19.5 * m["median_itl_ms"]}}).reason is None


@pytest.mark.slow
def test_at_least_90_percent_of_the_points_are_expressible() -> None:
    ok, refused = prepared_points()
    assert len(ok) + len(refused) == 260
    assert len(ok) >= 0.9 * 260
    assert all(why for _, why in refused)


def test_prefill_bound_disaggregation_runs_the_decode_pool_part_full() -> None:
    """Little's law: the decode batch b* that emits what the prefill pool feeds; TPOT = that batch's round time."""
    row = next(r for r in raw_rows() if r["key"] == "dsr1-b200-dynamo-sglang-fp8-mtp-disagg-8192x1024-c256-p1x8-d6x8")
    prepared = prepare(to_point(row))
    assert not isinstance(prepared, str) and prepared.prefill is not None and prepared.point.decode is not None
    prior = serving_catalog().prior
    rate, tpot = prepared.predict_many([prior])[0] * np.array([prepared.point.num_gpus, 1.0])
    p = prepared.prefill.terms([prior])
    out = prepared.prefill.model.workload.mean_output
    feed = 1 * prepared.prefill.plans.dp[0] * out / (p.step["prefill"][0] * out / p.running_batch[0])
    workers, b_max = prepared.point.decode.workers, int(prepared.decode.plans.batch[0])
    d = prepared.decode.terms([prior], list(range(1, b_max + 1)))
    emitted = workers * d.running_batch / d.decode_step_s
    assert feed < emitted[-1] and rate == pytest.approx(feed, rel=1e-9)  # prefill-bound: throughput = feed
    b = int(np.searchsorted(emitted, feed))  # emitted[b - 1] < feed <= emitted[b]
    lo, hi = sorted((d.decode_step_s[b - 1], d.decode_step_s[b]))
    assert lo * 0.98 <= tpot <= hi * 1.02  # interpolated on a coarser grid of batches


@pytest.mark.slow
def test_inferencex_report_covers_every_point_with_held_out_errors(tmp_path: Path) -> None:
    """The validate report: every expressible point has a row with its in-sample, 5-fold, LOSO and LOGO errors;
    held-out refits do not beat the full fit on the median."""
    from madmax_opt.studies.inferencex_report import write_inferencex_report
    from madmax_opt.studies.serving_fit import evaluate_all

    ev = evaluate_all()
    ok, _ = prepared_points()
    ix = [k for k in ev.in_sample if k.startswith("ix-")]
    assert len(ix) == 2 * len(ok)
    for held in (ev.kfold, ev.loso, ev.logo):
        assert set(ix) <= set(held) and ev.median(ev.in_sample, ix) <= ev.median(held, ix)
    text = write_inferencex_report(tmp_path, ev).read_text()
    assert sum(1 for line in text.splitlines() if line.startswith("| ix-")) == len(ix)


def test_closed_loop_throughput_by_hand() -> None:
    """C clients, o tokens each, TTFT then (o - 1) x TPOT: 4 clients, 10 tokens, 1 s + 9 x 0.1 s -> 40 / 1.9 tok/s."""
    from madmax_opt.studies.inferencex import closed_loop_rate

    got = closed_loop_rate(4.0, 10.0, np.array([1.0]), np.array([0.1]))
    assert got[0] == pytest.approx(40.0 / 1.9, rel=1e-12)
