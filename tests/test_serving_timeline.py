"""Serving timelines: valid Chrome trace JSON, simulated decode round / prefill / TPOT against the closed form, the
pipeline schedule by hand, and the CLI (timeline on a serving problem; solve and pareto on an arrival-rate one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli_helpers import run_main
from madmax_opt.analysis.serving_trace import ServingTimeline, chrome_trace, simulate_serving
from madmax_opt.analysis.trace_setup import TRACE_TOLERANCE
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.serving_space import ServingModel, ServingPlan

ROOT = Path(__file__).resolve().parents[1]


def timeline(plan: ServingPlan, gpus: int = 8, model: str = "llama3-70b", **task: Any) -> ServingTimeline:
    shape = {} if "mix" in task else {"prompt_len": 1024, "output_len": 256}
    model_ = ServingModel(problem_from_dict({
        "model": model, "hardware": {"system": "dgx-h100", "gpus": gpus},
        "task": {"kind": "inference", **shape, **task}}))
    return simulate_serving(model_.workload, model_.task, model_.problem.stack, model_.table, model_.cal,
                            model_.arrays([plan]), plan.model_dump(exclude_none=True))


PLANS = [
    (ServingPlan(tp=8, batch=64), {}),
    (ServingPlan(tp=2, pp=4, batch=64), {}),
    (ServingPlan(tp=4, pp=2, batch=7), {}),  # odd batch: micro-batches of ceil(7 / 2)
    (ServingPlan(tp=4, dp=2, batch=32, prefill_replicas=1), {"disaggregated": True}),
    (ServingPlan(tp=2, pp=2, dp=2, ep=4, batch=64), {"model": "mixtral-8x7b"}),  # MoE: EP all-to-alls
]


@pytest.mark.parametrize(("plan", "task"), PLANS)
def test_simulated_serving_step_matches_the_closed_form(plan: ServingPlan, task: dict[str, Any]) -> None:
    tl = timeline(plan, **task)
    if plan.ep > 1:
        assert any(e.cat == "ep_comm" and e.stream == "ep" for e in tl.events)
    assert set(tl.differences) == {"decode_round_s", "prefill_s", "tpot_s"}
    for name, diff in tl.differences.items():
        assert abs(diff) <= TRACE_TOLERANCE, (name, diff)


MIX = [{"prompt_len": 4096, "output_len": 256, "weight": 3}, {"prompt_len": 512, "output_len": 512, "weight": 1}]


def _pass_s(tl: ServingTimeline, prompt_tokens: float, pid: int = 0) -> float:
    """Busy time of the drawn prefill pass of ``prompt_tokens``-token prompts on one stage (pp = 1: compute)."""
    return sum(e.dur_s for e in tl.events if e.pid == pid and e.args.get("prompt_tokens") == prompt_tokens
               and e.stream != "kv")


def test_request_mix_amortises_every_shapes_prefill_by_its_share() -> None:
    """serve-llama2-70b-mix's shapes, tp 4, B 24 (all running): E[o] = (3 x 256 + 512) / 4 = 320 output tokens,
    passes of k = 8192 // 4096 = 2 and 8192 // 512 = 16 prompts, so by hand
    TPOT = round + 24 / 320 x (3/4 x pass(4096) / 2 + 1/4 x pass(512) / 16),
    not the longest prompt's pass for every request (round + 24 / 320 x pass(4096) / 2: +14 % on the example)."""
    tl = timeline(ServingPlan(tp=4, batch=24, precision="fp8"), gpus=4, model="llama2-70b", mix=MIX)
    long_, short = _pass_s(tl, 4096.0), _pass_s(tl, 512.0)
    assert 0 < short < long_
    round_s = tl.simulated["decode_round_s"]
    by_hand = round_s + 24 / 320 * (0.75 * long_ / 2 + 0.25 * short / 16)
    assert tl.simulated["tpot_s"] == pytest.approx(by_hand, rel=1e-12)
    assert round_s + 24 / 320 * long_ / 2 > 1.1 * by_hand  # the old pricing, far off
    for name, diff in tl.differences.items():
        assert abs(diff) <= 1e-6, (name, diff)


def test_disaggregated_mix_ships_every_shapes_kv_cache_by_its_share() -> None:
    """TPOT = round + (3/4 KV(4096) + 1/4 KV(512)) / 320 on the decode replica; the 4096-token prompt's KV shard
    is 8x the 512-token one's, its transfer no shorter; prefill_s is the longer prompt's lone latency."""
    tl = timeline(ServingPlan(tp=4, dp=2, batch=24, precision="fp8", prefill_replicas=1), gpus=8,
                  model="llama2-70b", mix=MIX, disaggregated=True)
    kv = {e.args["bytes"]: e.dur_s for e in tl.events if e.cat == "kv_transfer"}
    (small, kv_short), (big, kv_long) = sorted(kv.items())
    assert big == pytest.approx(8 * small) and kv_long >= kv_short > 0
    by_hand = tl.simulated["decode_round_s"] + (0.75 * kv_long + 0.25 * kv_short) / 320
    assert tl.simulated["tpot_s"] == pytest.approx(by_hand, rel=1e-12)
    assert tl.simulated["prefill_s"] == pytest.approx(_pass_s(tl, 4096.0, pid=100), rel=1e-12)
    for name, diff in tl.differences.items():
        assert abs(diff) <= 1e-6, (name, diff)


def test_chrome_trace_is_valid_json_with_complete_events() -> None:
    tl = timeline(ServingPlan(tp=4, pp=2, batch=16))
    data = json.loads(json.dumps(chrome_trace(tl)))
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(tl.events) > 0
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert isinstance(e["ts"], float | int) and e["dur"] >= 0 and isinstance(e["pid"], int)
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in complete} <= named
    cats = {e["cat"] for e in complete}
    assert {"tp_comm", "pp_comm", "head", "attention"} <= cats


def test_pipeline_schedule_by_hand() -> None:
    """pp = 2, 2 micro-batches: every round, stage 0 and stage 1 each run both micro-batches once; the round is the
    longer of 2 x (last stage + send) and one micro-batch around the pipeline (closed form, Orca-style)."""
    tl = timeline(ServingPlan(tp=4, pp=2, batch=16))
    stage_time = {s: sum(e.dur_s for e in tl.events if e.pid == s and e.stream != "pp"  # layers: compute + TP
                         and e.name.startswith("L") and e.args.get("round") == 1 and e.args.get("micro_batch") == 0)
                  for s in (0, 1)}
    head = sum(e.dur_s for e in tl.events if e.cat == "head" and e.args.get("round") == 1
               and e.args.get("micro_batch") == 0)
    send = next(e.dur_s for e in tl.events if e.cat == "pp_comm" and e.args.get("round") == 1)
    last = stage_time[1] + head + send
    around = stage_time[0] + stage_time[1] + head + 2 * send
    assert tl.simulated["decode_round_s"] == pytest.approx(max(2 * last, around), rel=1e-9)


def test_closed_form_prefill_stage_holds_the_head_or_the_send_not_both() -> None:
    """tp 4, pp 2, B 16, 1024-token prompts, 256 output tokens: a batched pass of k = 8192 // 1024 = 8 prompts holds
    stage 0 for L + S + F (layers, send on, fixed cost) and stage 1 for L + H + F (layers, LM head, fixed cost), so by
    hand TPOT = round + 16 / 256 x (L + max(H, S) + F) / 8; on dgx-h100 (vLLM's H100 fit of the serving calibration)
    L = 330.0 ms, H = 0.202 ms, S = 0.798 ms, F = 1.27 us, TPOT = 20.902 + 2.584 = 23.486 ms. The old pricing
    L + H + S + F was 16 / 256 x H / 8 = 1.6 us higher."""
    tl = timeline(ServingPlan(tp=4, pp=2, batch=16))
    busy = {s: {c: sum(e.dur_s for e in tl.events if e.pid == s and e.args.get("prompts") == 8.0 and pick(e))
                for c, pick in (("L", lambda e: e.name.startswith("L")), ("H", lambda e: e.cat == "head"),
                                ("S", lambda e: e.cat == "pp_comm"),
                                ("F", lambda e: e.cat == "overhead" and not e.name.startswith("L")))}
            for s in (0, 1)}
    lay, head, send, fixed = busy[1]["L"], busy[1]["H"], busy[0]["S"], busy[1]["F"]
    assert busy[0]["L"] == pytest.approx(lay) and busy[0]["H"] == busy[1]["S"] == 0.0 and 0 < head < send
    by_hand = tl.closed_form["decode_round_s"] + 16 / 256 * (lay + max(head, send) + fixed) / 8
    assert tl.closed_form["tpot_s"] == pytest.approx(by_hand, rel=1e-12)
    assert tl.closed_form["tpot_s"] == pytest.approx(0.023486, rel=1e-4)
    assert tl.simulated["tpot_s"] == pytest.approx(tl.closed_form["tpot_s"], rel=1e-9)


def test_disaggregated_plan_shows_the_kv_transfer_on_the_prefill_replica() -> None:
    tl = timeline(ServingPlan(tp=4, dp=2, batch=32, prefill_replicas=1), disaggregated=True)
    kv = [e for e in tl.events if e.cat == "kv_transfer"]
    assert kv and all(e.pid >= 100 for e in kv)
    assert np.isclose(min(e.start_s for e in kv), max(e.start_s + e.dur_s for e in tl.events
                                                      if e.pid >= 100 and e.cat != "kv_transfer"))


def test_timeline_cli_on_a_serving_plan(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 4\npp: 2\nbatch: 32\n")
    problem = tmp_path / "serve.yaml"
    problem.write_text("model: llama3-70b\nhardware: {system: dgx-h100, gpus: 8}\n"
                       "task: {kind: inference, prompt_len: 1024, output_len: 256}\n")
    r = run_main("timeline", problem, "--plan", plan, "--out", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    trace = json.loads(Path(out["files"]["trace"]).read_text())
    assert trace["traceEvents"] and Path(out["files"]["gantt"]).stat().st_size > 0
    assert all(abs(d) <= out["tolerance"] for d in out["difference"].values())


def test_arrival_rate_example_solves_and_draws_curves(tmp_path: Path) -> None:
    problem = ROOT / "problems/serve-llama3-70b-arrival.yaml"
    r = run_main("solve", problem, "--json")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["max_rate"] >= best["arrival_rate"] == 20
    assert best["at_arrival_rate"]["ttft_p99_s"] <= 0.3 and best["at_arrival_rate"]["tpot_p90_s"] <= 0.04
    r = run_main("pareto", problem, "--out", tmp_path / "curves")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0 and "| plan |" in (tmp_path / "curves.md").read_text()
