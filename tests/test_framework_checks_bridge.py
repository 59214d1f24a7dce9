"""Megatron-Bridge's own start-up path on emitted NeMo / Bridge configurations (studies/framework_checks_bridge.py).

The slow tests run only where Megatron-Bridge 067f987 imports (README "From plan to launch", docs/launch.md) and are
skipped otherwise; each also checks that the Bridge's real code fails on the defect issue 21 found, so a pass is
not a check that cannot fail. The rule test runs everywhere.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from madmax_opt.launch.common import Emitted
from madmax_opt.launch.startup import violations
from madmax_opt.model.spec import Plan
from madmax_opt.studies.framework_checks import importable
from madmax_opt.studies.launch_conformance import emitted_configurations, priced_training
from test_emit_training import emit, problem_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["gpt3-175b-mixed-pipeline", "llama2-70b-h100", "mixtral-8x7b-h100"]


def row(model: str, plan: Plan, **task: Any) -> dict[str, Any]:
    problem = problem_of(model, **task)
    e: Emitted = emit(problem, plan, "nemo")
    return {"emitted": e.model_dump(mode="json"), **priced_training(problem, plan.model_dump())}


def with_args(r: dict[str, Any], args: list[str]) -> dict[str, Any]:
    r = copy.deepcopy(r)
    r["emitted"]["commands"][0]["args"] = args
    return r


def without(e: Emitted, prefix: str) -> Emitted:
    """The one-command configuration as the emitter wrote it before a rule: the overrides starting with prefix
    dropped."""
    (cmd,) = e.commands
    return e.model_copy(update={"commands": [cmd.model_copy(update={"args": [
        a for a in cmd.args if not a.startswith(prefix)]})]})


def bridge_check(r: dict[str, Any]) -> str | None:
    from madmax_opt.studies.framework_checks_bridge import bridge

    return bridge(r)


def test_priced_training_record_holds_the_catalog_shape_and_the_plan() -> None:
    # Llama-2-70B (Touvron et al. 2023, Table 1 / its config.json): 80 layers, 8192 hidden, 64 heads, 8 KV heads,
    # FFN 28672, vocabulary 32000, RoPE base 10000
    p = row("llama2-70b", Plan(dp=2, tp=4, pp=4, vpp=5, mbs=1, zero=1, sp=True))["priced"]
    assert (p["layers"], p["hidden"], p["heads"], p["kv_heads"], p["ffn"], p["vocab"], p["rope_base"]) == (
        80, 8192, 64, 8, 28672, 32000, 10000)
    assert (p["tp"], p["pp"], p["vpp"], p["sp"], p["precision"]) == (4, 4, 5, True, "bf16")


def test_bias_free_gelu_model_turns_off_the_recipes_bias_gelu_fusion() -> None:
    # Falcon-180B: GELU MLP without linear biases; the GPT-3 recipe fuses bias + GELU, which Megatron-Core refuses
    e = emit(problem_of("falcon-180b"), Plan(dp=2, tp=8, pp=2, mbs=1, zero=1, sp=True), "nemo")
    assert "model.bias_activation_fusion=false" in e.commands[0].args
    assert violations(e) == []
    assert violations(without(e, "model.bias_activation_fusion")) == ["nemo.bias-gelu-fusion"]


def test_gpt3_recipe_without_pipelining_does_not_defer_the_embedding_wgrad() -> None:
    # the GPT-3 recipe's comm overlap defers the embedding weight gradient, which Megatron-Core refuses at pp 1
    e = emit(problem_of("gpt3-175b", seq_len=2048), Plan(dp=4, tp=8, mbs=1, zero=1, sp=True), "nemo")
    assert "comm_overlap.defer_embedding_wgrad_compute=false" in e.commands[0].args
    assert violations(e) == []
    assert violations(without(e, "comm_overlap.defer_embedding_wgrad_compute")) == ["nemo.defer-wgrad-pp"]
    piped = emit(problem_of("gpt3-175b", seq_len=2048), Plan(dp=2, tp=8, pp=2, mbs=1, zero=1, sp=True), "nemo")
    assert not any(a.startswith("comm_overlap.defer_embedding_wgrad_compute") for a in piped.commands[0].args)


def test_moe_experts_are_sharded_by_tp_as_priced() -> None:
    # Bridge sets expert tp 1 when ep > 1 and it is unset; the cost model shards the experts by tp (Megatron-Core's
    # default), so the override names it; a dense model gets none
    e = emit(problem_of("mixtral-8x7b"), Plan(dp=8, tp=2, pp=2, mbs=1, zero=1, ep=4, sp=True), "nemo")
    assert "model.transformer.expert_tensor_parallel_size=2" in e.commands[0].args
    dense = emit(problem_of("llama2-70b"), Plan(dp=8, tp=2, pp=2, mbs=1, zero=1, sp=True), "nemo")
    assert not any("expert_tensor_parallel_size" in a for a in dense.commands[0].args)


@pytest.mark.slow
def test_bridge_builds_the_examples_top_plans_as_priced() -> None:
    if not importable("bridge"):
        pytest.skip("Megatron-Bridge 067f987 (with torch) is not importable here")
    rows = [r for r in emitted_configurations([ROOT / "problems" / f"{p}.yaml" for p in EXAMPLES])
            if r["format"] == "nemo" and "emitted" in r]
    assert len(rows) >= 10
    assert [(r["problem"], r["rank"], bridge_check(r)) for r in rows] == [
        (r["problem"], r["rank"], None) for r in rows]


@pytest.mark.slow
def test_bridge_refuses_issue_21_defects() -> None:
    if not importable("bridge"):
        pytest.skip("Megatron-Bridge 067f987 (with torch) is not importable here")
    llama2 = row("llama2-70b", Plan(dp=2, tp=4, pp=4, vpp=5, mbs=1, zero=1, sp=True))
    mixtral = row("mixtral-8x7b", Plan(dp=8, tp=2, pp=2, mbs=1, zero=1, ep=4, sp=True))
    assert bridge_check(llama2) is None and bridge_check(mixtral) is None
    args = llama2["emitted"]["commands"][0]["args"]
    flat = bridge_check(with_args(llama2, [a.replace("model.transformer.", "model.") for a in args]))
    assert flat is not None and "Could not override" in flat
    rope = bridge_check(with_args(llama2, [a for a in args if "rotary_base" not in a]))
    assert rope is not None and "rope_base = 500000" in rope  # Llama-3's base kept for Llama-2
    vpp = bridge_check(with_args(mixtral, [a for a in mixtral["emitted"]["commands"][0]["args"]
                                           if "virtual_pipeline" not in a]))  # the recipe's vpp 5 kept
    assert vpp is not None
    etp = bridge_check(with_args(mixtral, [a for a in mixtral["emitted"]["commands"][0]["args"]
                                           if "expert_tensor_parallel_size" not in a]))
    assert etp == "AssertionError: Megatron-Bridge built etp = 1, priced 2"  # Bridge's own default at ep > 1
    gpt3 = row("gpt3-175b", Plan(dp=4, tp=8, mbs=1, zero=1, sp=True), seq_len=2048)
    defer = bridge_check(with_args(gpt3, [a for a in gpt3["emitted"]["commands"][0]["args"]
                                          if "defer_embedding_wgrad" not in a]))
    assert defer is not None and "Cannot defer embedding wgrad compute" in defer


@pytest.mark.slow
@pytest.mark.parametrize(("model", "plan", "task"), [
    ("llama2-70b", Plan(dp=4, tp=4, pp=2, mbs=1, zero=3), {}),  # Megatron-FSDP
    ("llama2-70b", Plan(dp=2, tp=4, pp=2, cp=2, mbs=1, zero=1, recompute="selective", sp=True), {}),
    ("llama3-70b", Plan(dp=4, tp=8, mbs=1, zero=1, sp=True), {"precision": "fp8", "stack": {"fp8_params": True}}),
    ("llama3-70b", Plan(dp=4, tp=8, mbs=1, zero=1, sp=True), {"stack": {"optimizer_dtype": "bf16-moments"}}),
    ("falcon-180b", Plan(dp=2, tp=8, pp=2, mbs=1, zero=1, sp=True), {}),
    ("gpt3-175b", Plan(dp=4, tp=8, mbs=1, zero=1, sp=True), {"seq_len": 2048}),  # pp 1: no wgrad deferral
    ("gpt4-moe-1.8t", Plan(dp=4, tp=1, pp=8, mbs=1, zero=1, ep=4), {}),  # MoE with biases at expert tp 1
    ("llama2-70b", Plan(dp=4, tp=4, pp=2, mbs=1, zero=1, stage_layers=[41, 39], stage_recompute=["none", "none"]),
     {}),
])
def test_bridge_builds_other_plans_as_priced(model: str, plan: Plan, task: dict[str, Any]) -> None:
    if not importable("bridge"):
        pytest.skip("Megatron-Bridge 067f987 (with torch) is not importable here")
    assert bridge_check(row(model, plan, **task)) is None
