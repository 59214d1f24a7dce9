"""Typed serving records (analysis/serving_records.py): built from a plan, they round-trip through JSON, their JSON
object keeps the keys and order of the plain dicts they replaced, and a field a report reads that the record lacks
is a type-check error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from madmax_opt.analysis.serving_records import ServingPlanRecord, ServingRecord
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.serving import ServingModel, ServingPlan, candidates, evaluate_serving, pareto_records
from madmax_opt.search.serving_space import serving_knobs

# the keys of a steady serving record's JSON object, in order, as `evaluate --json` wrote them before the records
# were typed (search/serving.py to_records at commit cf7761e); "interval" follows when the level has factors
JSON_KEYS = [
    "plan", "hardware", "feasible", "infeasible_reason", "ttft_s", "tpot_s", "output_tokens_per_s",
    "output_tokens_per_s_per_gpu", "kv_precision", "max_batch", "running_batch", "queue_wait_s", "framework",
    "calibration", "kv_cache_bytes_per_gpu", "decode_step_s", "prefill_s", "cost_per_hour_usd",
    "usd_per_million_tokens", "memory_bytes_per_gpu", "tpot_breakdown_s",
]
PLAN_KEYS = ["dp", "tp", "pp", "ep", "batch", "max_num_seqs", "precision", "prefill_replicas", "system"]


def _problem(**task: Any) -> Any:
    return problem_from_dict({
        "model": "llama2-70b", "hardware": {"gpu": "h100-sxm", "gpus": 8},
        "task": {"kind": "inference", "prompt_len": 1024, "output_len": 256, "precision": "bf16", **task},
    })


def test_record_from_a_plan_round_trips_through_json() -> None:
    problem = _problem(tpot_s=0.05)
    recs = evaluate_serving(problem, [ServingPlan(dp=2, tp=4, pp=1, batch=16, precision="bf16"),
                                      ServingPlan(dp=1, tp=8, pp=1, precision="bf16")])  # best batch
    for rec in recs:
        text = json.dumps(rec.to_json())
        back = ServingRecord.model_validate_json(text)
        assert back == rec
        assert json.dumps(back.to_json()) == text  # same bytes again
        obj = json.loads(text)
        assert list(obj)[:len(JSON_KEYS)] == JSON_KEYS
        assert set(obj) - set(JSON_KEYS) <= {"interval"}
        assert list(obj["plan"]) == PLAN_KEYS
        assert list(obj["hardware"]) == ["system", "gpu", "gpus"]
    # the plan as given: 2 replicas x tp 4 = the 8 GPUs, batch as offered
    assert (recs[0].plan.dp, recs[0].plan.tp, recs[0].plan.batch, recs[0].hardware.gpus) == (2, 4, 16, 8)
    assert recs[0].output_tokens_per_s_per_gpu == pytest.approx(recs[0].output_tokens_per_s / 8)


def test_plan_record_fields_are_the_serving_plan_settings() -> None:
    """The record's plan declares ServingPlan's settings again (analysis cannot import search): the same names, in
    the order serving_knobs() derives from ServingPlan's own fields, and the order of the JSON objects before."""
    assert list(ServingPlanRecord.model_fields) == list(serving_knobs())
    assert list(serving_knobs()) == PLAN_KEYS


def test_interval_keeps_only_the_bounds_its_level_has() -> None:
    rec = evaluate_serving(_problem(), [ServingPlan(dp=1, tp=8, pp=1, batch=8, precision="bf16")])[0]
    obj = rec.to_json()
    if rec.interval is None:
        assert "interval" not in obj
        return
    assert list(obj)[-1] == "interval"
    assert obj["interval"] == {k: v for k, v in rec.interval.model_dump().items() if v is not None}
    assert ServingRecord.model_validate(obj) == rec


def test_pareto_rows_carry_meets_targets_last() -> None:
    problem = _problem(tpot_s=0.03)
    model = ServingModel(problem)
    rows = pareto_records(model, candidates(model))
    assert rows and all(r.meets_targets is not None for r in rows)
    for r in rows:
        obj = r.to_json()
        assert list(obj)[-1] == "meets_targets" and obj["meets_targets"] == r.meets_targets
        # a row meets the TPOT target exactly when its TPOT is within it (no TTFT or throughput target here)
        assert r.meets_targets == (r.tpot_s <= 0.03 + 1e-9)
    # no record is both slower per token and lower in rate per GPU than another (the front, by brute force)
    for a in rows:
        assert not any(b.tpot_s < a.tpot_s and b.output_tokens_per_s_per_gpu > a.output_tokens_per_s_per_gpu
                       for b in rows)


@pytest.mark.slow
def test_a_field_the_record_lacks_fails_type_checking(tmp_path: Path) -> None:
    """Reports read attributes, so mypy rejects a field the record does not have (a string key would pass)."""
    src = tmp_path / "reader.py"
    src.write_text(
        "from madmax_opt.analysis.serving_records import ServingRecord\n\n\n"
        "def ttft_ms(rec: ServingRecord) -> float:\n    return rec.ttft_s * 1e3\n\n\n"
        "def missing(rec: ServingRecord) -> float:\n    return rec.time_to_first_token_s\n"
    )
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(src)],
                         capture_output=True, text=True, check=False, cwd=repo,
                         env={**os.environ, "MYPYPATH": str(repo / "src")})  # the package's source, typed
    assert out.returncode == 1, out.stdout
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "time_to_first_token_s" in errors[0] and "reader.py:9" in errors[0], out.stdout
