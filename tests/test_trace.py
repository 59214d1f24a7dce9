"""The step-timeline simulator (madmax_opt.analysis.trace): schedules written out by hand, exact agreement where the closed
form is exact, the pipeline against an independent longest-path computation, link sharing by hand, the Chrome
trace-event format, agreement with the closed form on the shared validation cases, speed, re-ranking, and the
``timeline`` / ``--plot`` / ``--rerank`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from conftest import ProblemFactory, toy_model, toy_system
from madmax_opt.analysis.evaluator import Model, evaluate
from madmax_opt.analysis.trace import schedule, simulate, simulate_setup
from madmax_opt.analysis.trace_export import chrome_trace, rerank
from madmax_opt.analysis.trace_link import SharedLink
from madmax_opt.analysis.trace_result import Simulation
from madmax_opt.analysis.trace_setup import TRACE_TOLERANCE
from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import MoE, Plan, Tier
from madmax_opt.report.timeline import BENCH_BAR_S, BENCH_PROBLEM, bench_cases

DATA = Path(__file__).resolve().parent / "data"
SMALL = DATA / "small.yaml"  # llama2-7b on one DGX H100 node, global batch 16

F, B = 0, 1


# ----------------------------------------------------------------------------------------------- schedules


def test_1f1b_order_written_out() -> None:
    # p = 4, m = 6: stage s warms up with p - s - 1 forwards, alternates, then drains (Narayanan et al. 2021)
    assert schedule(4, 1, 6, 1) == [
        (F, 0, 0), (F, 1, 0),
        (F, 2, 0), (B, 0, 0), (F, 3, 0), (B, 1, 0), (F, 4, 0), (B, 2, 0), (F, 5, 0), (B, 3, 0),
        (B, 4, 0), (B, 5, 0),
    ]
    assert schedule(4, 1, 6, 3) == [x for i in range(6) for x in ((F, i, 0), (B, i, 0))]
    assert schedule(4, 1, 2, 0) == [(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0)]  # m < p: all warm-up


def test_interleaved_order_written_out() -> None:
    # Megatron-Core, p = 2, v = 2, m = 4, stage 0: (p - 1) * 2 + (v - 1) * p = 4 warm-up forwards; virtual op k
    # runs chunk (k mod 4) // 2 (reversed for backward) of micro-batch (k // 4) * 2 + k mod 2
    assert schedule(2, 2, 4, 0) == [
        (F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
        (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1), (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
        (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0),
    ]
    assert schedule(2, 2, 2, 1) == [(F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
                                    (B, 0, 1), (B, 1, 1), (B, 0, 0), (B, 1, 0)]  # m = p: all warm-up


@pytest.mark.parametrize(("p", "v", "m"), [(2, 1, 1), (3, 1, 7), (4, 1, 16), (2, 2, 6), (4, 3, 8), (3, 2, 3)])
def test_every_chunk_runs_once_forward_then_backward(p: int, v: int, m: int) -> None:
    for s in range(p):
        order = schedule(p, v, m, s)
        assert sorted(order) == sorted((d, mb, c) for d in (F, B) for mb in range(m) for c in range(v))
        assert all(order.index((F, mb, c)) < order.index((B, mb, c)) for mb in range(m) for c in range(v))


# --------------------------------------------------------------------------------- exact where it should be


def _toy(make_problem: ProblemFactory, **kw: Any) -> Problem:
    return make_problem(gpus=kw.pop("gpus", 8), **({"seq_len": 1024, "global_batch": 16} | kw))


@pytest.mark.parametrize(
    ("plan", "stack"),
    [
        (Plan(tp=8, mbs=1, recompute="none"), {}),
        (Plan(tp=8, mbs=2, recompute="selective", sp=True), {}),
        (Plan(tp=8, mbs=1, recompute="full"), {}),
        (Plan(tp=4, cp=2, mbs=1, recompute="full"), {"dp_overlap": False}),
        (Plan(tp=4, dp=2, mbs=1, zero=3, recompute="full"), {"dp_overlap": False}),
        (Plan(tp=2, dp=4, mbs=1, zero=1, recompute="none", sp=True), {"dp_overlap": False}),
        (Plan(tp=8, mbs=1, recompute="selective"), {"kind": "finetune", "frozen_layers": 3}),
    ],
)
def test_without_pipeline_or_overlap_equals_closed_form(make_problem: ProblemFactory, plan: Plan,
                                                       stack: dict[str, Any]) -> None:
    """One stage and nothing overlapped across layers: the step is the sum of the same terms in both models."""
    sim = simulate(Model(_toy(make_problem, **stack)), plan)
    assert sim.step_time_s == pytest.approx(sim.closed_form_step_s, rel=1e-9)


def _longest_path_1f1b(sim: Simulation) -> float:
    """Independent replay of synchronous 1F1B: each stage runs its order; a block starts when the stage is free
    and its input has arrived; a send occupies the sender until the data is there; optimizer after the last."""
    su = sim.setup
    p, m = len(su.stages), su.n_micro
    fwd = [w.emb_fwd_s + w.layers * sum(u.duration_s for u in w.fwd) + w.head_fwd_s for w in su.stages]
    bwd = [w.emb_bwd_s + w.layers * sum(u.duration_s for u in w.bwd) + w.head_bwd_s for w in su.stages]
    arrive: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pending = {s: [("F", i) for i in range(min(p - s - 1, m))] for s in range(p)}
    for s in range(p):
        warm = len(pending[s])
        for i in range(m - warm):
            pending[s] += [("F", warm + i), ("B", i)]
        pending[s] += [("B", i) for i in range(m - warm, m)]
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while pending[s]:
                kind, mb = pending[s][0]
                needs = (kind, s, mb) if (kind == "F" and s > 0) or (kind == "B" and s < p - 1) else None
                if needs is not None and needs not in arrive:
                    break
                start = max(free[s], arrive.get(needs, 0.0)) if needs else free[s]
                end = start + (fwd[s] if kind == "F" else bwd[s])
                if kind == "F" and s < p - 1:
                    end += su.stages[s].send_s
                    arrive[("F", s + 1, mb)] = end
                if kind == "B" and s > 0:
                    end += su.stages[s].send_s
                    arrive[("B", s - 1, mb)] = end
                free[s] = end
                pending[s].pop(0)
                progress = True
    assert not any(pending.values())
    return max(free) + max(w.optimizer_s for w in su.stages)


@pytest.mark.parametrize("plan", [
    Plan(tp=2, pp=4, mbs=1, recompute="none"),
    Plan(tp=1, pp=8, mbs=2, recompute="full"),
    Plan(tp=4, pp=2, mbs=1, recompute="selective", sp=True),
])
def test_pipeline_matches_independent_longest_path(make_problem: ProblemFactory, plan: Plan) -> None:
    sim = simulate(Model(_toy(make_problem)), plan)
    assert len(sim.setup.stages) == plan.pp and sim.setup.n_micro >= plan.pp
    assert sim.step_time_s == pytest.approx(_longest_path_1f1b(sim), rel=1e-12)


@pytest.mark.parametrize(("pp", "vpp", "mbs"), [(4, 1, 1), (8, 1, 2), (2, 1, 1), (2, 2, 1), (4, 2, 1)])
def test_identical_stages_give_the_textbook_bubble(make_problem: ProblemFactory, pp: int, vpp: int, mbs: int) -> None:
    """Identical stages, no sends, no embedding / head, no optimizer: T = m (f + b) + (p - 1)/v (f + b)
    (Narayanan et al. 2021: 1F1B bubble (p - 1)/m, interleaved (p - 1)/(v m))."""
    sim = simulate(Model(_toy(make_problem, global_batch=32)), Plan(tp=8 // pp, pp=pp, vpp=vpp, mbs=mbs))
    bare = [replace(w, emb_fwd_s=0.0, emb_bwd_s=0.0, head_fwd_s=0.0, head_bwd_s=0.0, send_s=0.0, optimizer_s=0.0)
            for w in sim.setup.stages]
    su = replace(sim.setup, stages=(bare[1],) * pp)  # a middle stage everywhere
    w = su.stages[0]
    f_plus_b = w.layers * (sum(u.duration_s for u in w.fwd) + sum(u.duration_s for u in w.bwd))
    m = su.n_micro
    assert m % pp == 0
    assert simulate_setup(su).step_time_s == pytest.approx(m * f_plus_b + (pp - 1) / vpp * f_plus_b, rel=1e-12)


# --------------------------------------------------------------------------------------------- link sharing


def test_shared_link_splits_bandwidth_by_hand() -> None:
    link = SharedLink()
    a = link.issue(0, 0.0, 1.0)  # stream 0: 1 s of work at full bandwidth
    b = link.issue(0, 0.0, 1.0)  # queued behind a on the same stream
    c = link.issue(1, 0.0, 2.0)  # stream 1: 2 s of work
    # 0-2: a and c at half speed -> a ends at 2, c has 1 left; 2-4: b and c at half speed -> both end at 4
    assert link.finish(a) == pytest.approx(2.0)
    assert (a.start_s, b.end_s) == (0.0, -1.0)  # b not yet computed: lazy
    link.finish()
    assert (b.start_s, b.end_s, c.end_s) == pytest.approx((2.0, 4.0, 4.0))
    late = SharedLink()
    x = late.issue(0, 0.0, 2.0)
    y = late.issue(1, 1.0, 0.5)  # joins at 1: x has 1 left; both at half until y ends at 2; x ends at 2.5
    late.finish()
    assert (y.start_s, y.end_s, x.end_s) == pytest.approx((1.0, 2.0, 2.5))
    assert late.busy_s == pytest.approx({0: 2.5, 1: 1.0})


def test_zero3_link_bound_step_carries_all_traffic(make_problem: ProblemFactory) -> None:
    """Weights gathered over a slow network: the link, not compute, sets the pace; gathers and reduce-scatters
    share it, so the step cannot be shorter than the total ZeRO-3 traffic."""
    slow = toy_system([Tier(name="nvl", size=8, bw=200e9, latency_s=1e-5, efficiency=0.5),
                       Tier(name="net", size=None, bw=1e9, latency_s=2e-5, efficiency=0.8)])
    problem = make_problem(system=slow, gpus=16, global_batch=16)
    sim = simulate(Model(problem), Plan(tp=8, dp=2, mbs=1, zero=3, recompute="none"))
    w = sim.setup.stages[0]
    traffic = sim.setup.n_micro * w.layers * (2 * w.gather_s + w.reduce_s)
    compute = sum(sim.stages[0].breakdown_s[k] for k in ("compute", "recompute", "overhead"))
    assert traffic > compute  # link-bound by construction
    assert traffic <= sim.step_time_s <= traffic + compute
    assert sim.closed_form_step_s == pytest.approx(sim.step_time_s, rel=0.05)


# ------------------------------------------------------------------------------------ trace-event format


def _plans_for_trace(make_problem: ProblemFactory) -> list[tuple[Problem, Plan]]:
    moe = toy_model(moe=MoE(num_experts=4, top_k=2, expert_ffn=1024))
    return [
        (_toy(make_problem, global_batch=16), Plan(tp=2, pp=2, vpp=2, dp=2, mbs=1, zero=1, recompute="none", sp=True)),
        (_toy(make_problem, gpus=32, global_batch=32), Plan(tp=4, dp=4, cp=2, mbs=1, zero=3, recompute="full")),
        (_toy(make_problem, global_batch=16),
         Plan(tp=2, pp=4, mbs=1, recompute="none", stage_layers=[1, 3, 3, 1],
              stage_recompute=["none", "full", "selective", "none"])),
        (make_problem(moe, gpus=16, global_batch=16), Plan(tp=2, dp=8, ep=4, mbs=1, zero=2, recompute="selective",
                                                           sp=True)),
    ]


def _check_trace(trace: dict[str, Any], sim: Simulation) -> None:
    json.dumps(trace)  # serialisable
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert complete and meta
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0 and e["dur"] >= 0
    names = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    procs = {e["pid"] for e in meta if e["name"] == "process_name"}
    assert {(e["pid"], e["tid"]) for e in complete} <= names
    assert {e["pid"] for e in complete} <= procs
    eps = 2e-3  # microseconds: timestamps are rounded to nanoseconds
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in complete:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in tracks.values():  # in emission order: monotonic, and no two events of a track overlap
        ts = [e["ts"] for e in track]
        assert ts == sorted(ts)
        for prev, cur in pairwise(track):
            assert cur["ts"] >= prev["ts"] + prev["dur"] - eps, (prev, cur)
    by_id = {e["args"]["id"]: e for e in complete}
    n_deps = 0
    for e in complete:
        for d in e["args"].get("deps", []):
            dep = by_id[d]
            assert dep["ts"] + dep["dur"] <= e["ts"] + eps, (dep, e)
            n_deps += 1
    assert n_deps > 0
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(finishes)  # every pipeline send arrives, on another stage, not earlier than sent
    assert all(finishes[i]["pid"] != starts[i]["pid"] and finishes[i]["ts"] >= starts[i]["ts"] for i in starts)
    end = max(e["ts"] + e["dur"] for e in complete)
    assert end == pytest.approx(sim.step_time_s * 1e6, abs=1e-2)


@pytest.mark.parametrize("detail", ["ops", "layers"])
def test_chrome_trace_format_and_dependencies(make_problem: ProblemFactory, detail: str) -> None:
    for problem, plan in _plans_for_trace(make_problem):
        sim = simulate(Model(problem), plan)
        _check_trace(chrome_trace(sim, detail), sim)


def test_breakdown_accounts_for_every_second(make_problem: ProblemFactory) -> None:
    for problem, plan in _plans_for_trace(make_problem):
        sim = simulate(Model(problem), plan)
        for stage in sim.stages:
            assert sum(stage.breakdown_s.values()) == pytest.approx(sim.step_time_s, rel=1e-9)
            assert all(0.0 <= b <= sim.step_time_s * (1 + 1e-9) for b in stage.busy_s)
        summary = sim.summary()
        assert summary["step_time_s"] == sim.step_time_s
        assert set(summary["stages"][0]["busy_s"]) == set(sim.streams)


def test_invalid_plan_is_an_input_error(make_problem: ProblemFactory) -> None:
    with pytest.raises(ProblemError, match="dp\\*mbs must divide global_batch"):
        simulate(Model(_toy(make_problem)), Plan(tp=8, mbs=3))


# --------------------------------------------------------------------------------- vs the closed form, speed


def test_validation_cases_within_stated_tolerance() -> None:
    from madmax_opt.studies.validation import korthikanti_cases, vtrain_cases

    cases = [*korthikanti_cases(), *vtrain_cases()]
    worst = max(abs(simulate(Model(c.problem), c.plan, record=False).difference) for c in cases)
    assert worst <= TRACE_TOLERANCE


def test_405b_plan_with_16_stages_and_64_micro_batches_within_a_second() -> None:
    model = Model(problem_from_dict(BENCH_PROBLEM))
    for _, plan in bench_cases():
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            sim = simulate(model, plan, record=False)
            best = min(best, time.perf_counter() - t0)
        assert (plan.pp, sim.setup.n_micro) == (16, 64)
        assert best <= BENCH_BAR_S


def test_rerank_keeps_the_closed_form_best_within_tolerance(make_problem: ProblemFactory) -> None:
    problem = _toy(make_problem, global_batch=32)
    plans = [Plan(tp=2, pp=4, mbs=1, recompute="none"), Plan(tp=8, mbs=1, recompute="none"),
             Plan(tp=4, pp=2, vpp=2, mbs=1, recompute="none")]
    records = evaluate(problem, plans)
    sims = [simulate(Model(problem), p, record=False).step_time_s for p in plans]
    slowest = max(range(3), key=lambda i: sims[i])
    fastest = min(range(3), key=lambda i: sims[i])
    ordered = [records[slowest], *(r for i, r in enumerate(records) if i != slowest)]
    gap = sims[slowest] / sims[fastest] - 1.0
    assert gap > 0
    kept, info = rerank(problem, ordered, tolerance=gap * 1.01)
    assert info["kept_closed_form_best"] and kept[0]["plan"] == records[slowest]["plan"]
    moved, info = rerank(problem, ordered, tolerance=gap * 0.99)
    assert not info["kept_closed_form_best"] and moved[0]["plan"] == records[fastest]["plan"]
    assert [r["simulated_step_time_s"] for r in moved] == sorted(sims)


# -------------------------------------------------------------------------------------------- command line


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "madmax-opt"
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def test_timeline_command_writes_trace_and_gantt(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("{dp: 2, tp: 2, pp: 2, mbs: 1, zero: 1, recompute: selective, sp: true}\n")
    res = run_cli("timeline", SMALL, "--plan", plan, "--out", tmp_path / "out", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["micro_batches"] == 16 // (2 * 1)
    assert summary["difference"] == pytest.approx(summary["step_time_s"] / summary["closed_form_step_time_s"] - 1)
    trace = json.loads(Path(summary["files"]["trace"]).read_text())
    assert trace["otherData"]["step_time_s"] == pytest.approx(summary["step_time_s"])
    assert Path(summary["files"]["gantt"]).stat().st_size > 20_000
    bad = run_cli("timeline", SMALL, "--plan", plan, "--index", "3", "--out", tmp_path / "out")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--index" in bad.stderr


def test_solve_rerank_and_plots(tmp_path: Path) -> None:
    res = run_cli("solve", SMALL, "--top-k", "3", "--rerank", "--plot", tmp_path / "plots", "--json")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert len(result["top"]) == 3 and result["best"] == result["top"][0]
    assert all("simulated_step_time_s" in r for r in result["top"])
    assert result["rerank"]["tolerance"] == TRACE_TOLERANCE
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"step_time.png", "memory.png", "top_k.png"}
    ev = run_cli("evaluate", SMALL, "--plan", DATA.parent.parent / "problems" / "plans" / "llama2-70b-3d.yaml")
    assert ev.returncode == 2  # a plan for another problem is still an input error
