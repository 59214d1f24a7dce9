"""Exact evaluator: derived metrics, invalid plans, scalar = vectorised, JSON shape, one step by hand, fine-tuning."""

from __future__ import annotations

import json
from fractions import Fraction as F
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import TOY_PEAK_FLOPS, ProblemFactory, toy_gpu, toy_model
from madmax_opt.analysis.evaluator import CHUNK_PLANS, Model, evaluate, metrics, to_records
from madmax_opt.cli.main import app
from madmax_opt.io.problem import load_problem
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import INVALID_REASONS, MEMORY_REASON, STEP_TERMS, training_terms
from madmax_opt.search.space import enumerate_plans
from madmax_opt.studies.bench import BenchResult, VectorTiming, render

ROOT = Path(__file__).resolve().parents[1]
LLAMA_PROBLEM = ROOT / "problems" / "llama2-70b-h100.yaml"


# -------------------------------------------------------------------------------------- derived metrics


@pytest.fixture(scope="module")
def llama_records() -> list[dict[str, Any]]:
    problem = load_problem(LLAMA_PROBLEM)
    plans = [
        Plan(dp=32, tp=8, pp=4, mbs=1, recompute="selective", sp=True, system="dgx-h100"),
        Plan(dp=16, tp=8, pp=4, vpp=4, mbs=1, zero=1, recompute="full", sp=True, system="dgx-h100"),
        Plan(dp=256, tp=4, mbs=1, zero=3, recompute="full", system="dgx-h100"),
        Plan(dp=1024, zero=3, recompute="full", system="dgx-h100"),
    ]
    return evaluate(problem, plans)


def test_step_time_is_the_sum_of_the_breakdown(llama_records: list[dict[str, Any]]) -> None:
    for rec in llama_records:
        br = rec["time_breakdown_s"]
        assert list(br) == list(STEP_TERMS)
        assert all(v >= 0.0 for v in br.values())
        assert rec["step_time_s"] == sum(br[k] for k in STEP_TERMS)


def test_throughput_and_mfu_definitions(llama_records: list[dict[str, Any]]) -> None:
    gbs, seq, h100_bf16 = 1024, 4096, 989e12
    # Llama-2-70B: 444,491,366,400 model FLOPs per token at s = 4096 (test_workload.py, by hand)
    flops_per_step = 444_491_366_400 * gbs * seq
    for rec in llama_records:
        step, gpus = rec["step_time_s"], rec["hardware"]["gpus"]
        assert rec["model_flops_per_step"] == flops_per_step
        assert rec["tokens_per_s"] == pytest.approx(gbs * seq / step, rel=1e-15)
        assert rec["samples_per_s"] == pytest.approx(gbs / step, rel=1e-15)
        assert rec["mfu"] == pytest.approx(flops_per_step / (step * gpus * h100_bf16), rel=1e-15)
        assert 0.0 < rec["mfu"] < 1.0


def test_korthikanti_model_flops_in_the_evaluator(make_problem: ProblemFactory) -> None:
    # toy GPT is MHA, GELU, f = 4h: model FLOPs per step = 72 B s L h^2 (1 + s/(6h) + V/(12 L h))
    B, s, L, h, V = 16, 1024, 8, 1024, 1000
    (rec,) = evaluate(make_problem(toy_model(), gpus=8, global_batch=B, seq_len=s), [Plan(dp=8)])
    assert rec["model_flops_per_step"] == 72 * B * s * L * h**2 * (1 + F(s, 6 * h) + F(V, 12 * L * h))
    assert rec["mfu"] == pytest.approx(rec["model_flops_per_step"] / (rec["step_time_s"] * 8 * TOY_PEAK_FLOPS))


# ------------------------------------------------------------------------------------ a step by hand

GEMM_S, ATTN_S, HBM_S = F(1, 5 * 10**14), F(1, 25 * 10**13), F(1, 10**12)  # toy GPU, see test_pipeline.py
H, FFN, V, S = 1024, 4096, 1000, 1024
LAYER_PARAMS = 12 * H * H + 4 * H  # QKV, projection, MLP weights + two LayerNorms


def gemm_fwd_s(tokens: int) -> F:
    return tokens * 2 * (H * 3 * H + H * H + H * FFN + FFN * H) * GEMM_S


def layer_s(tokens: int, weight_grad_fraction: F = F(1)) -> F:
    """One layer, one micro-batch on one GPU: forward + backward (activation grads, weight grads if trained)."""
    gemm = gemm_fwd_s(tokens)
    attn = tokens * 4 * S * H * F(1, 2) * ATTN_S  # flash, causal half skipped
    elem = tokens * 2 * (2 * 2 * H + 2 * 3 * H + 2 * FFN) * HBM_S
    return gemm + attn + elem + gemm * (1 + weight_grad_fraction) + F(5, 2) * attn + 2 * elem


def extras_s(tokens: int) -> F:
    emb = tokens * H * 2 * 3 * HBM_S
    head = 3 * tokens * 2 * H * V * GEMM_S + tokens * V * 4 * 3 * HBM_S
    return emb + head


def test_single_gpu_step_by_hand(make_problem: ProblemFactory) -> None:
    problem = make_problem(toy_model(), gpus=1, global_batch=16, seq_len=S)
    (rec,) = evaluate(problem, [Plan(mbs=1)])
    m = 16
    compute = m * (8 * layer_s(1024) + extras_s(1024))
    params = 8 * LAYER_PARAMS + 2 * V * H
    optimizer = params * 34 * HBM_S
    assert float(compute) == pytest.approx(0.038633612509184, rel=1e-12)
    br = rec["time_breakdown_s"]
    assert br["compute"] == pytest.approx(float(compute), rel=1e-12)
    assert br["optimizer"] == pytest.approx(float(optimizer), rel=1e-12)
    assert rec["step_time_s"] == pytest.approx(float(compute + optimizer), rel=1e-12)
    assert rec["step_time_s"] == pytest.approx(0.042126910685184, rel=1e-12)
    mem = rec["memory_bytes_per_gpu"]
    assert (mem["weights"], mem["gradients"], mem["optimizer"]) == (2 * params, 4 * params, 12 * params)
    # stored activations: 8 layers x 1024 tokens x (8h + 8h + 4f) bytes + fp32 logits 1024 x 1000 x 4
    assert mem["activations"] == 8 * 1024 * (16 * H + 4 * FFN) + 1024 * V * 4


# --------------------------------------------------------------------------------------- invalid plans

# 12 heads of 128, 12 layers, seq 1024, global batch 16 on 24 toy GPUs (8 per node) with 1 MB of HBM
INVALID_CASES = [
    (1, Plan(dp=2)),  # 2 GPUs != 24
    (2, Plan(dp=1, tp=8, pp=3)),  # 12 heads % 8
    (3, Plan(dp=3, pp=8)),  # 12 layers % 8
    (4, Plan(dp=24)),  # 16 sequences % 24
    (5, Plan(dp=8, pp=3, vpp=2)),  # 2 micro-batches % 3 stages
    (5, Plan(dp=8, tp=3, vpp=2)),  # vpp without pp (also tp=3 breaks rule 9: the first rule wins)
    (6, Plan(dp=8, cp=3)),  # 1024 % (2 * 3)
    (7, Plan(dp=8, pp=3, sp=True)),  # sp without tp
    (8, Plan(tp=2, pp=12, zero=1)),  # ZeRO without data parallelism
    (9, Plan(dp=8, tp=3)),  # tp = 3 neither divides nor is a multiple of the 8-GPU node
    (MEMORY_REASON, Plan(dp=8, pp=3)),  # otherwise valid, but 1 MB of HBM
]


def test_every_invalid_reason_is_reported(make_problem: ProblemFactory) -> None:
    model = toy_model(hidden=1536, heads=12, ffn=6144, layers=12)
    tiny = toy_gpu().model_copy(update={"hbm_bytes": 1.0e6})
    problem = make_problem(model, gpus=24, gpu=tiny, global_batch=16, seq_len=1024)
    recs = evaluate(problem, [p for _, p in INVALID_CASES])
    for (code, plan), rec in zip(INVALID_CASES, recs, strict=True):
        assert rec["feasible"] is False, plan
        if code == MEMORY_REASON:
            total_gb = rec["memory_bytes_per_gpu"]["total"] / 1e9
            usable_gb = 1.0e6 * 0.95 / 1e9
            assert rec["infeasible_reason"] == (
                f"memory per GPU {total_gb:.1f} GB exceeds usable capacity {usable_gb:.1f} GB"
            )
        else:
            assert rec["infeasible_reason"] == INVALID_REASONS[code], plan
    assert {c for c, _ in INVALID_CASES} == set(range(1, MEMORY_REASON + 1))
    # the same plans on a GPU with enough memory: only the memory case becomes feasible
    problem = make_problem(model, gpus=24, global_batch=16, seq_len=1024)
    recs = evaluate(problem, [p for _, p in INVALID_CASES])
    assert [r["feasible"] for r in recs] == [c == MEMORY_REASON for c, _ in INVALID_CASES]


# ------------------------------------------------------------------------ scalar call = vectorised call


def test_scalar_call_equals_the_same_plan_in_a_batch_bitwise() -> None:
    problem = load_problem(LLAMA_PROBLEM)
    model = Model(problem)
    space = enumerate_plans(problem)
    rng = np.random.default_rng(2024)
    batch = space.take(rng.integers(0, len(space), 1000))
    batch_records = to_records(model, batch)
    for i in range(len(batch)):
        assert to_records(model, batch.take([i])) == [batch_records[i]], i  # == on floats: bitwise
    # and through the public API with Plan objects
    for i in rng.integers(0, len(batch), 20):
        rec = batch_records[int(i)]
        assert evaluate(problem, [Plan(**rec["plan"])]) == [rec]


def test_vectorised_metrics_match_records() -> None:
    problem = load_problem(LLAMA_PROBLEM)
    model = Model(problem)
    batch = enumerate_plans(problem).take(np.arange(0, 33984, 97))
    met = metrics(model, batch)
    recs = to_records(model, batch, met)
    assert [r["step_time_s"] for r in recs] == met.step_time_s.tolist()
    assert [r["feasible"] for r in recs] == met.feasible.tolist()
    assert np.all(met.step_time_s > 0)


# -------------------------------------------------------------------------------------------- JSON shape

ISSUE_2_KEYS = {
    "plan", "feasible", "infeasible_reason", "step_time_s", "tokens_per_s", "samples_per_s", "mfu",
    "model_flops_per_step", "memory_bytes_per_gpu", "time_breakdown_s",
}


def check_record_shape(rec: dict[str, Any]) -> None:
    assert set(rec) >= ISSUE_2_KEYS
    assert {"total", "weights", "gradients", "optimizer", "activations"} <= set(rec["memory_bytes_per_gpu"])
    assert set(Plan.model_fields) <= set(rec["plan"])
    assert isinstance(rec["feasible"], bool)
    assert rec["infeasible_reason"] is None or isinstance(rec["infeasible_reason"], str)
    for k in ("step_time_s", "tokens_per_s", "samples_per_s", "mfu", "model_flops_per_step"):
        assert isinstance(rec[k], float), k
    assert all(isinstance(v, float) for v in rec["memory_bytes_per_gpu"].values())
    assert all(isinstance(v, float) for v in rec["time_breakdown_s"].values())
    mem = rec["memory_bytes_per_gpu"]
    parts = sum(v for k, v in mem.items() if k not in ("total", "capacity"))
    assert mem["total"] == pytest.approx(parts, rel=1e-15)


def test_json_keys(llama_records: list[dict[str, Any]]) -> None:
    for rec in llama_records:
        check_record_shape(rec)
        assert json.loads(json.dumps(rec)) == rec


def test_cli_evaluate_json(tmp_path: Path) -> None:
    plan_file = tmp_path / "plans.yaml"
    plan_file.write_text("- {dp: 32, tp: 8, pp: 4, recompute: selective, sp: true, system: dgx-h100}\n"
                         "- {dp: 64, tp: 4, pp: 4, zero: 1, system: dgx-h100}\n")
    result = CliRunner().invoke(app, ["evaluate", str(LLAMA_PROBLEM), "--plan", str(plan_file), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert isinstance(out, list) and len(out) == 2
    for rec in out:
        check_record_shape(rec)
    assert out[0]["plan"]["dp"] == 32 and out[1]["plan"]["zero"] == 1


# ---------------------------------------------------------------------------------------------- finetune


def finetune(make_problem: ProblemFactory, **task: Any) -> dict[str, Any]:
    problem = make_problem(toy_model(), gpus=2, global_batch=16, seq_len=S, kind="finetune", **task)
    (rec,) = evaluate(problem, [Plan(dp=2, mbs=1)])
    return rec


def dp_sync_s(grad_bytes: float) -> float:
    """Ring all-reduce over 2 GPUs of one node: 2 * 1/2 * S / 100e9 + 10 us."""
    return grad_bytes / 100e9 + 10e-6


def test_frozen_layers_by_hand(make_problem: ProblemFactory) -> None:
    full = finetune(make_problem)
    half = finetune(make_problem, frozen_layers=4)
    params = 8 * LAYER_PARAMS + 2 * V * H
    trainable = params - 4 * LAYER_PARAMS  # the embedding and head stay trainable
    for rec, n in ((full, params), (half, trainable)):
        mem = rec["memory_bytes_per_gpu"]
        assert mem["weights"] == 2 * params  # frozen weights are still held
        assert mem["gradients"] == 4 * n
        assert mem["optimizer"] == 12 * n
        dp = rec["time_breakdown_s"]["dp_comm"] + rec["overlapped_comm_s"]["dp_comm"]
        assert dp == pytest.approx(dp_sync_s(4 * n), rel=1e-12)
        assert rec["time_breakdown_s"]["optimizer"] == pytest.approx(float(n * 34 * HBM_S), rel=1e-12)
    assert half["memory_bytes_per_gpu"]["activations"] == full["memory_bytes_per_gpu"]["activations"]
    # compute: the frozen half skips its weight-gradient GEMMs, nothing else; 8 micro-batches of 1024 tokens
    m = 8
    assert full["time_breakdown_s"]["compute"] == pytest.approx(float(m * (8 * layer_s(1024) + extras_s(1024))))
    saved = m * 4 * gemm_fwd_s(1024)
    drop = full["time_breakdown_s"]["compute"] - half["time_breakdown_s"]["compute"]
    assert drop == pytest.approx(float(saved), rel=1e-9)


def test_all_layers_frozen_still_pay_activation_gradients(make_problem: ProblemFactory) -> None:
    rec = finetune(make_problem, frozen_layers=8)
    # forward + activation-gradient GEMMs (1x forward) + attention and elementwise backward
    expected = 8 * (8 * layer_s(1024, F(0)) + extras_s(1024))
    assert rec["time_breakdown_s"]["compute"] == pytest.approx(float(expected), rel=1e-12)
    forward_only = 8 * 8 * gemm_fwd_s(1024)
    assert rec["time_breakdown_s"]["compute"] > 2 * float(forward_only)


def test_lora_by_hand(make_problem: ProblemFactory) -> None:
    rec = finetune(make_problem, lora_rank=16)
    r = 16
    lora = 8 * r * ((H + 3 * H) + (H + H) + (H + FFN) + (FFN + H))  # A and B of the four GEMMs, 8 layers
    params = 8 * LAYER_PARAMS + 2 * V * H
    mem = rec["memory_bytes_per_gpu"]
    assert mem["weights"] == 2 * (params + lora)  # the adapters are held as bf16 weights too
    assert mem["gradients"] == pytest.approx(4 * lora, rel=1e-15)
    assert mem["optimizer"] == pytest.approx(12 * lora, rel=1e-15)
    dp = rec["time_breakdown_s"]["dp_comm"] + rec["overlapped_comm_s"]["dp_comm"]
    assert dp == pytest.approx(dp_sync_s(4 * lora), rel=1e-12)
    assert rec["time_breakdown_s"]["compute"] == pytest.approx(
        float(8 * (8 * layer_s(1024, F(0)) + extras_s(1024))), rel=1e-12
    )


def test_plan_arrays_round_trip() -> None:
    plans = [Plan(dp=2, tp=4, pp=2, cp=2, vpp=2, mbs=4, zero=2, recompute="selective", sp=True)]
    arrays = PlanArrays.from_plans(plans, [0])
    assert arrays.plan(0) == plans[0]


# ------------------------------------------------------------- LoRA adapters and frozen layers per stage


def test_lora_adapter_weights_are_held(make_problem: ProblemFactory) -> None:
    rec = finetune(make_problem, lora_rank=16)
    lora = 8 * 16 * ((H + 3 * H) + (H + H) + (H + FFN) + (FFN + H))
    params = 8 * LAYER_PARAMS + 2 * V * H
    assert rec["memory_bytes_per_gpu"]["weights"] == 2 * (params + lora)


def test_frozen_leading_layers_sit_on_the_first_stages(make_problem: ProblemFactory) -> None:
    problem = make_problem(toy_model(), gpus=2, global_batch=16, seq_len=S, kind="finetune", frozen_layers=4)
    (rec,) = evaluate(problem, [Plan(pp=2, mbs=1)])
    # stage 0: layers 0-3, all frozen, + embedding; stage 1: layers 4-7, all trained, + head: the worst stage
    # holds gradients for 4 layers and the head
    assert rec["memory_bytes_per_gpu"]["gradients"] == 4 * (4 * LAYER_PARAMS + V * H)


# ------------------------------------------------------------------ chunked evaluation and the benchmark


def test_chunked_and_threaded_evaluation_change_no_bit() -> None:
    problem = load_problem(LLAMA_PROBLEM)
    space = enumerate_plans(problem)
    plans = space.take(np.random.default_rng(7).integers(0, len(space), 2 * CHUNK_PLANS + 123))
    serial, threaded = Model(problem), Model(problem, workers=2)
    whole = training_terms(serial.workload, problem.training_task, problem.stack, serial.table, plans)
    for model in (serial, threaded):
        got = model.terms(plans)
        assert all(np.array_equal(got.time[k], whole.time[k]) for k in STEP_TERMS)
        assert all(np.array_equal(got.hidden_comm[k], whole.hidden_comm[k]) for k in whole.hidden_comm)
        assert np.array_equal(got.memory.total, whole.memory.total)
        assert np.array_equal(got.invalid, whole.invalid)
        assert np.array_equal(got.capacity_bytes, whole.capacity_bytes)
        assert got.model_flops_per_step == whole.model_flops_per_step


def test_bench_evaluator_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "evaluator.md"
    args = ["bench-evaluator", str(LLAMA_PROBLEM), "--plans", "3000", "--repeats", "1", "--calls", "20",
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for needle in ("plans per second", "ns per plan", "scalar call", "3,000 plans", "cpu:", "numpy:", "UTC"):
        assert needle in text, needle


def test_bench_result_arithmetic() -> None:
    one = VectorTiming(1, wall_s=[1.5, 1.25], cpu_s=[1.2, 1.2])
    two = VectorTiming(2, wall_s=[2.5, 3.0], cpu_s=[2.0, 2.0])
    r = BenchResult(problem="p", plans=1_000_000, space=10, feasible=5, vector=[one, two],
                    scalar_s=[3e-4, 5e-4, 4e-4], record_s=[1e-3])
    assert r.fastest is one
    assert r.plans_per_s == 800_000.0
    assert r.ns_per_plan == 1250.0
    assert r.scalar_median_s == 4e-4
    text = render(r, {"cpu": "x"}, "today")
    assert "| 1.250 s / 1.375 s | meets <= 2 s per 10^6 plans |" in text
    assert "| 2.500 s / 2.750 s | MISSES <= 2 s per 10^6 plans |" in text
    assert "| 400 us | meets < 1,000 us |" in text


# ------------------------------------------------------------------------------- linear time in the plans


def _cpu_s_per_plan(problem: Any, plans: list[Plan], runs: int) -> float:
    import time

    best = float("inf")
    for _ in range(runs):
        c0 = time.process_time()  # CPU time of this process: robust to other jobs on a shared machine
        evaluate(problem, plans)
        best = min(best, time.process_time() - c0)
    return best / len(plans)


def test_records_are_linear_in_the_number_of_plans() -> None:
    """Fast variant: to_records (arrays in, records out) at 3 x 10^4 plans within 2x per plan of 10^3 (the
    quadratic memory total made it ~4x here). Timed with the cyclic collector paused after a collection: a full
    collection of the test worker's heap (the objects of every earlier test) falling inside the one large run made
    it 3-5x per plan in CI, whatever to_records does."""
    import gc
    import time

    problem = load_problem(LLAMA_PROBLEM)
    model = Model(problem)
    space = enumerate_plans(problem)
    arr = space.take(np.random.default_rng(16).integers(0, len(space), 30_000))

    def per_plan(n: int, runs: int) -> float:
        best = float("inf")
        for _ in range(runs):
            gc.collect()
            gc.disable()
            try:
                c0 = time.process_time()
                to_records(model, arr.slice(0, n))
                best = min(best, time.process_time() - c0)
            finally:
                gc.enable()
        return best / n

    small, big = per_plan(1_000, 5), per_plan(30_000, 3)  # best of several runs each: CPU time on a shared worker
    assert big <= 2.0 * small, f"{big * 1e6:.1f} us/plan at 3e4 vs {small * 1e6:.1f} at 1e3"


@pytest.mark.slow
def test_evaluate_is_linear_in_the_number_of_plans() -> None:
    """Issue 16: per-plan time of evaluate() at 10^5 plans within 2x of that at 10^3 (it was 11.6x: the memory total
    re-summed the columns at every access). Plans differ (sampled from the space); CPU time, best of the runs."""
    problem = load_problem(LLAMA_PROBLEM)
    space = enumerate_plans(problem)
    rng = np.random.default_rng(16)
    arr = space.take(rng.integers(0, len(space), 100_000))
    names = [o.system.name for o in problem.hardware]
    plans = [arr.plan(i, system=names[int(arr.hw[i])]) for i in range(len(arr))]
    small = _cpu_s_per_plan(problem, plans[:1_000], runs=5)
    big = _cpu_s_per_plan(problem, plans, runs=1)
    assert big <= 2.0 * small, f"{big * 1e6:.1f} us/plan at 10^5 vs {small * 1e6:.1f} at 10^3"


def test_memory_total_is_summed_once() -> None:
    problem = load_problem(LLAMA_PROBLEM)
    met = metrics(Model(problem), enumerate_plans(problem).slice(0, 100))
    mem = met.terms.memory
    assert mem.total is mem.total  # cached: the same array, not a new sum per access
    assert np.array_equal(mem.total, mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.temporary)
