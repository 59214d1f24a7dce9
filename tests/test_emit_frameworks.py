"""The frameworks' own parsers and start-up checks on emitted configurations (studies/framework_checks.py).

Runs only where the framework imports (Megatron-LM core_v0.19.0 / torchtitan v0.2.2 with torch; see README "From
plan to launch"); skipped otherwise. Each case also checks that the real check fails on the defect issue 21 found,
so a pass is not a check that cannot fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from madmax_opt.launch.common import Emitted
from madmax_opt.model.spec import Plan
from madmax_opt.studies.framework_checks import (
    deepspeed,
    importable,
    megatron,
    sglang,
    torchtitan,
    vllm,
    vllm_engine,
)
from test_emit_training import emit, problem_of


def emitted(fmt: str, model: str, plan: Plan, **task: Any) -> dict[str, Any]:
    e: Emitted = emit(problem_of(model, **task), plan, fmt)
    return e.model_dump(mode="json")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama2-70b", "mixtral-8x7b"])
def test_megatron_parse_and_validate_args_accept_the_emitted_command(model: str) -> None:
    if not importable("megatron"):
        pytest.skip("Megatron-LM (with torch) is not importable here")
    plan = Plan(dp=4, tp=4, pp=2, mbs=1, zero=1, ep=4 if model.startswith("mixtral") else 1)
    e = emitted("megatron", model, plan, global_batch=64)
    assert megatron(e) is None
    e["commands"][0]["env"].pop("CUDA_DEVICE_MAX_CONNECTIONS")  # the defect: TP without the variable
    failure = megatron(e)
    assert failure is not None and "CUDA_DEVICE_MAX_CONNECTIONS" in failure


@pytest.mark.slow
def test_torchtitan_trainer_start_up_accepts_the_emitted_pipeline() -> None:
    if not importable("torchtitan"):
        pytest.skip("torchtitan (with torch) is not importable here")
    e = emitted("torchtitan", "llama2-70b", Plan(dp=2, tp=2, pp=4, mbs=1, vpp=2, zero=3, sp=True), global_batch=64)
    assert torchtitan(e) is None
    # the defect: without the stage weights torchtitan counts embedding and output as a layer each
    text = e["files"]["job.toml"]
    e["files"]["job.toml"] = "\n".join(line for line in text.splitlines() if "stage_less_layers" not in line)
    failure = torchtitan(e)
    assert failure is not None and "divisible by pipeline parallel size" in failure


@pytest.mark.slow
def test_vllm_serve_parser_accepts_the_emitted_replicas() -> None:
    if not importable("vllm"):
        pytest.skip("vLLM is not importable here")
    from madmax_opt.launch.emit import emit_plan
    from madmax_opt.search.serving_space import ServingPlan
    from test_emit_serving import serving

    e = emit_plan(serving("llama3-70b"), ServingPlan(dp=4, tp=2, batch=64), "vllm").model_dump(mode="json")
    assert vllm(e) is None
    args = e["commands"][0]["args"]
    args[args.index("--kv-cache-dtype") + 1] = "fp8_e9"  # not a KV dtype vLLM knows: its parser refuses
    failure = vllm(e)
    assert failure is not None and "--kv-cache-dtype" in failure


@pytest.mark.slow
def test_megatron_deepspeed_validate_args_accepts_the_emitted_command() -> None:
    if not importable("deepspeed"):
        pytest.skip("Megatron-DeepSpeed (with DeepSpeed and torch) is not importable here")
    e = emitted("deepspeed", "llama2-70b", Plan(dp=4, tp=2, sp=True, zero=1), global_batch=64)
    assert deepspeed(e) is None
    e["commands"][0]["env"] = {}  # what the emitter wrote before its own validate_args was run on it
    failure = deepspeed(e)
    assert failure is not None and "CUDA_DEVICE_MAX_CONNECTIONS" in failure


@pytest.mark.slow
def test_vllm_engine_config_built_from_the_catalog_config_is_the_priced_model() -> None:
    """create_engine_config on a directory holding the catalog's config.json: vLLM's model and parallel config
    equal what was priced (Llama-3-70B by hand: 80 layers, 64 heads, 8 KV heads, hidden 8192, vocab 128256);
    a config.json with another layer count, or a --max-model-len above the context (8192), is caught."""
    if not importable("vllm"):
        pytest.skip("vLLM is not importable here")
    from madmax_opt.io.catalog import models
    from madmax_opt.launch.emit import emit_plan
    from madmax_opt.launch.hf_config import hf_config
    from madmax_opt.search.serving_space import ServingPlan
    from test_emit_serving import serving

    e = emit_plan(serving("llama3-70b"), ServingPlan(dp=2, tp=4, batch=32), "vllm").model_dump(mode="json")
    max_len = int(e["commands"][0]["args"][e["commands"][0]["args"].index("--max-model-len") + 1])
    priced = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "vocab": 128256, "max_model_len": max_len,
              "precision": "bf16", "tp": 4, "pp": 1, "dp": 2}
    row = {"emitted": e, "priced": priced, "hf_config": hf_config(models()["llama3-70b"])}
    assert vllm_engine(row) is None
    failure = vllm_engine({**row, "hf_config": {**row["hf_config"], "num_hidden_layers": 81}})
    assert failure is not None and "layers = 81, priced 80" in failure
    args = e["commands"][0]["args"]
    args[args.index("--max-model-len") + 1] = "8193"
    failure = vllm_engine({**row, "priced": {**priced, "max_model_len": 8193}})
    assert failure is not None and "max_model_len" in failure


@pytest.mark.slow
def test_sglang_server_args_resolve_and_check_the_emitted_server() -> None:
    """prepare_server_args, resolve_once and check_server_args on an emitted SGLang server of Llama-3-70B
    (its config.json from the catalog); the issue's defect, data-parallel replicas over two nodes, is refused."""
    if not importable("sglang"):
        pytest.skip("SGLang (with torch 2.14.1 and torchvision) is not importable here")
    from madmax_opt.io.catalog import models
    from madmax_opt.launch.emit import emit_plan
    from madmax_opt.launch.hf_config import hf_config
    from madmax_opt.search.serving_space import ServingPlan
    from test_emit_serving import serving

    e = emit_plan(serving("llama3-70b"), ServingPlan(dp=1, tp=4, batch=32), "sglang").model_dump(mode="json")
    row = {"emitted": e, "hf_config": hf_config(models()["llama3-70b"])}
    assert sglang(row) is None
    server = next(c for c in e["commands"] if "--tp-size" in c["args"])
    server["args"] += ["--dp-size", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:5000"]
    failure = sglang(row)
    assert failure is not None and "multi-node data-parallel" in failure


def _deepseek_row(fmt: str, plan: Any) -> dict[str, Any]:
    """An emitted DeepSeek-V3 server (FP8 weights as shipped) with the catalog's config.json and, priced by hand,
    the shape vLLM must build: 61 layers, 128 heads and KV heads, hidden 7168, vocab 129280, the MLA latent of
    512 + 64 values per token and layer."""
    from madmax_opt.io.catalog import models
    from madmax_opt.launch.emit import emit_plan
    from madmax_opt.launch.hf_config import hf_config
    from test_emit_serving import serving

    e = emit_plan(serving("deepseek-v3", gpu="h200-sxm", prompt_len=512, output_len=128), plan, fmt)
    priced = {"layers": 61, "hidden": 7168, "heads": 128, "kv_heads": 128, "vocab": 129280, "mla_kv_dim": 576,
              "max_model_len": 640, "precision": "fp8", "tp": plan.tp, "pp": plan.pp, "dp": plan.dp}
    return {"emitted": e.model_dump(mode="json"), "priced": priced, "hf_config": hf_config(models()["deepseek-v3"])}


@pytest.mark.slow
def test_vllm_engine_builds_the_priced_deepseek_v3_from_the_catalog_config() -> None:
    """create_engine_config on DeepSeek-V3's config.json (DeepseekV3ForCausalLM, FP8 block-scaled): two
    expert-parallel servers of tp 8 build the priced model, MLA latent included; a kv_lora_rank other than the
    catalog's latent is caught."""
    if not importable("vllm"):
        pytest.skip("vLLM is not importable here")
    from madmax_opt.search.serving_space import ServingPlan

    row = _deepseek_row("vllm", ServingPlan(dp=2, tp=8, ep=8, batch=64, precision="fp8"))
    assert vllm_engine(row) is None
    failure = vllm_engine({**row, "hf_config": {**row["hf_config"], "kv_lora_rank": 256}})
    assert failure is not None and "mla_kv_dim = 320, priced 576" in failure


@pytest.mark.slow
def test_sglang_resolves_and_checks_the_emitted_deepseek_v3_server() -> None:
    """SGLang's resolution and check_server_args on an emitted DeepSeek-V3 server of tp 8 (its config.json from
    the catalog); a --context-length above the config's 163840 positions is refused by SGLang."""
    if not importable("sglang"):
        pytest.skip("SGLang (with torch 2.14.1 and torchvision) is not importable here")
    from madmax_opt.search.serving_space import ServingPlan

    row = _deepseek_row("sglang", ServingPlan(dp=1, tp=8, batch=32, precision="fp8"))
    assert sglang(row) is None
    server = next(c for c in row["emitted"]["commands"] if "--tp-size" in c["args"])
    server["args"][server["args"].index("--context-length") + 1] = "163841"
    failure = sglang(row)
    assert failure is not None and "163840" in failure
