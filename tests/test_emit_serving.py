"""Serving launches: every emitted vLLM / SGLang / TensorRT-LLM deployment meets the pinned frameworks' start-up
rules (data/flags/startup-serving.yaml), places its servers on disjoint GPUs, starts them in the background behind
a readiness wait and a router, names the real checkpoint, and parses back to the plan and model that were priced.

The expected values are stated here independently: the per-rank split of SGLang's --max-running-requests
(pool_configurator.py: value // attn_dp_size), the placement of replicas on 8-GPU nodes by hand, and the KV-cache
precision the evaluator prices (task.kv_precision, else the weight precision's default).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import run_main
from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.launch.common import Command, Emitted, parse_flags
from madmax_opt.launch.emit import emit_plan, parse_emitted
from madmax_opt.launch.rules import cite, rule_book
from madmax_opt.launch.serving_rules import SERVING_CHECKS, serving_violations
from madmax_opt.model.inference import DEFAULT_KV_PRECISION
from madmax_opt.model.problem import Problem
from madmax_opt.search.serving_space import ServingPlan

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ["vllm", "sglang", "trtllm"]
LLAMA = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn": 2816, "ffn_kind": "swiglu",
         "norm": "rmsnorm", "vocab": 32000}
MOE = dict(LLAMA, moe={"num_experts": 16, "top_k": 2, "expert_ffn": 1408})
PROMPT, OUTPUT = 512, 128


def serving(model: Any, gpu: str = "h100-sxm", **task: Any) -> Problem:
    return problem_from_dict({
        "model": model, "hardware": {"gpu": gpu, "gpus": {"start": 1, "stop": 384}},
        "task": {"kind": "inference", "prompt_len": PROMPT, "output_len": OUTPUT, "precision": ["bf16", "fp8"],
                 "disaggregated": True, **task},
    })


DENSE, SPARSE = serving(LLAMA), serving(MOE)
KV_TOKENS = {  # how each format writes a KV-cache precision (None: the weights' dtype)
    "vllm": {"auto": None, "fp8": "fp8"}, "sglang": {"auto": None, "fp8_e4m3": "fp8"},
    "trtllm": {None: None, "FP8": "fp8", "INT8": "int8"},
}


def kv_of(e: Emitted) -> str | None:
    """The KV-cache precision a configuration asks for, read back (None: the same as the weights)."""
    engine = yaml.safe_load(e.files.get("trtllm.yaml", "{}"))
    if e.format == "trtllm" and "dtype" in engine:  # the engine backend: quant_config
        return KV_TOKENS["trtllm"][(engine.get("quant_config") or {}).get("kv_cache_quant_algo")]
    if e.format == "trtllm":  # the PyTorch backend: kv_cache_config.dtype of every server's options
        dtypes = {yaml.safe_load(text)["kv_cache_config"]["dtype"] for name, text in e.files.items()
                  if name != "disagg.yaml"}
        assert len(dtypes) == 1
        return {"auto": None, "fp8": "fp8"}[dtypes.pop()]
    flags = parse_flags(next(c for c in e.commands if "--kv-cache-dtype" in c.args).args)
    return KV_TOKENS[e.format][str(flags["--kv-cache-dtype"])]


def servers_of(e: Emitted) -> list[Command]:
    return [c for c in e.commands if not c.role.startswith("router")]


# precisions a catalog checkpoint loads at without --checkpoint, by the weights it ships (vLLM 0.11 / SGLang 0.5.23:
# its own quantization method, or fp8 quantized at load from unquantized weights; SGLang also requantizes the MoE
# experts of an FP8 checkpoint to modelopt_fp4)
LOADS = {"fp8": {"vllm": {"fp8"}, "sglang": {"fp8", "fp4"}}, "mxfp4": {"vllm": {"fp4"}, "sglang": {"fp4"}}}
UNQUANTIZED = {"bf16", "fp16", "fp8"}


def checkpoint_refuses(fmt: str, precision: str, problem: Problem, checkpoint: str | None) -> bool:
    m = problem.model
    if fmt == "trtllm" or checkpoint is not None or m.hf_id is None:
        return False
    native = m.native_precision or "bf16"
    return precision not in (LOADS[native][fmt] if native in LOADS else UNQUANTIZED)


def trtllm_pytorch_refuses(p: ServingPlan, problem: Problem, precision: str, checkpoint: str | None) -> bool:
    """TensorRT-LLM's PyTorch backend (MoE, disaggregation): no int8 KV cache, ep above tp only at tp 1 (attention
    DP), a batch that pp divides (--max_batch_size is a rank's cap over pp), a catalog checkpoint at its precision."""
    m = problem.model
    if not (p.prefill_replicas or p.ep > 1 or m.moe is not None):
        return False
    kv = problem.task.kv_precision or DEFAULT_KV_PRECISION[precision]  # type: ignore[union-attr]
    ships = {"fp8": {"fp8"}, "mxfp4": {"fp4"}, "nvfp4": {"fp4"}, "int4": {"int4"}}
    catalog_dtypes = {x.hf_id: x.native_precision for x in catalog.models().values() if x.hf_id}
    native = catalog_dtypes.get(checkpoint or m.hf_id or "")  # weights outside the catalog: unquantized
    wrong = precision not in ships.get(native or "", {"bf16", "fp16"})
    cap = p.max_num_seqs or p.batch or 0
    return kv == "int8" or p.ep > p.tp > 1 or cap % p.pp != 0 or wrong


def expected_limits(fmt: str, p: ServingPlan, problem: Problem, checkpoint: str | None = None) -> bool:
    """Whether ``fmt`` refuses ``p`` (the limits test_emit states: int8 KV, trtllm disaggregation / MoE, EP
    groups), plus a replica above a node that is not whole nodes."""
    precision = p.precision or problem.task.precisions()[0]  # type: ignore[union-attr]
    roles = [p.prefill_replicas, p.dp - p.prefill_replicas] if p.prefill_replicas else [p.dp]
    r = p.tp * p.pp
    return any([
        checkpoint_refuses(fmt, precision, problem, checkpoint),
        fmt in ("vllm", "sglang") and precision == "int8",
        fmt == "trtllm" and trtllm_pytorch_refuses(p, problem, precision, checkpoint),
        p.ep > 1 and (p.ep % p.tp != 0 or any(n % (p.ep // p.tp) for n in roles)),
        r > 8 and r % 8 != 0 and not (fmt == "sglang" and p.ep > 1),  # placed per replica: whole nodes above one
        fmt == "sglang" and p.ep > 1 and (p.ep // p.tp) * r > 8 and (p.ep // p.tp) * r % 8 != 0,  # per EP server
        fmt == "vllm" and p.prefill_replicas > 0 and r > 8,  # NIXL's side-channel host under Ray
    ])


def check_launch(fmt: str, problem: Problem, plan: ServingPlan, checkpoint: str | None = None) -> Emitted | None:
    """Emit, check every start-up rule, the layout and the round trip against what was priced."""
    if expected_limits(fmt, plan, problem, checkpoint):
        with pytest.raises(ProblemError, match=f"{fmt} cannot express"):
            emit_plan(problem, plan, fmt, checkpoint)
        return None
    e = emit_plan(problem, plan, fmt, checkpoint)
    assert serving_violations(e) == [], (fmt, plan, serving_violations(e))
    back = parse_emitted(e)
    cap = plan.max_num_seqs or plan.batch
    assert (back.dp, back.tp, back.pp, back.ep, back.batch, back.prefill_replicas) == (
        plan.dp, plan.tp, plan.pp, plan.ep, cap, plan.prefill_replicas)
    priced = plan.precision or problem.task.precisions()[0]  # type: ignore[union-attr]
    assert back.precision == priced
    kv = problem.task.kv_precision or DEFAULT_KV_PRECISION[priced]  # type: ignore[union-attr]
    assert kv_of(e) == (kv if kv in ("fp8", "int8") else None)  # bf16 / fp16: the weights' dtype (auto)
    model = problem.model
    name = checkpoint or model.hf_id or model.name
    for c in servers_of(e):
        assert name in c.argv and str(PROMPT + OUTPUT) in c.args  # the weights and the context length priced
    heads = [c for c in servers_of(e) if c.ready]
    assert heads and all(c.background for c in servers_of(e))  # every server in the background, polled
    assert all(c.ready and c.ready.endswith("/health") for c in heads)
    script = e.script()
    assert script.count("until curl -sf") == len(heads)
    return e


# ------------------------------------------------------------------------------------------------- rule data


def test_every_rule_has_a_source_and_a_checker() -> None:
    rules = rule_book("serving")
    assert set(rules) == set(SERVING_CHECKS) == set(FORMATS)
    for fmt, fw in rules.items():
        assert fw.pinned and fw.repository
        assert [r.id for r in fw.rules] == list(SERVING_CHECKS[fmt])
        for r in fw.rules:
            assert r.id.startswith(fmt + ".") and r.file and r.line > 0 and "line" in cite(r.id)


def _cmd(program: list[str], args: list[str], node: int = 0, **kw: Any) -> Command:
    return Command(program=program, args=args, node=node, **kw)


def _emitted(fmt: str, commands: list[Command], gpus: int = 16) -> Emitted:
    files = {"trtllm.yaml": "enable_attention_dp: true\n"} if fmt == "trtllm" else {}  # an attention-DP server
    return Emitted(format=fmt, framework=fmt, version="x", kind="serving", system="dgx-h100", gpus=gpus,
                   nodes=-(-gpus // 8), gpus_per_node=min(gpus, 8), commands=commands, files=files)


SG = ["python", "-m", "sglang.launch_server"]


@pytest.mark.parametrize(("rule", "fmt", "commands"), [
    # what SGLang 0.5.23's check_server_args rejected in the issue: --dp-size over two nodes, tp 12 over 8 nodes
    ("sglang.dp-single-node", "sglang", [_cmd(SG, ["--tp-size", "8", "--dp-size", "2", "--nnodes", "2",
                                                   "--node-rank", "0", "--dist-init-addr", "h:1"])]),
    ("sglang.tp-nodes", "sglang", [_cmd(SG, ["--tp-size", "12", "--nnodes", "8", "--node-rank", "0"])]),
    # ep 8 with 128 requests: 128 // 8 = 16 per attention-DP rank is fine arithmetic, 100 // 8 loses requests
    ("sglang.requests-per-attn-dp", "sglang", [_cmd(SG, ["--tp-size", "8", "--attn-dp-size", "8",
                                                         "--max-running-requests", "100"])]),
    ("sglang.base-gpu-id", "sglang", [_cmd(SG, ["--tp-size", "4", "--base-gpu-id", "0"]),
                                      _cmd(SG, ["--tp-size", "4", "--base-gpu-id", "2"])]),
    ("sglang.node-ranks", "sglang", [_cmd(SG, ["--tp-size", "16", "--nnodes", "2", "--node-rank", "0",
                                               "--dist-init-addr", "h:1"])]),
    ("vllm.secondary-headless", "vllm", [_cmd(["vllm", "serve", "m"], [
        "--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2"])]),
    ("vllm.dp-devices", "vllm", [_cmd(["vllm", "serve", "m"], ["--tensor-parallel-size", "4"],
                                      env={"CUDA_VISIBLE_DEVICES": "0,1"})]),
    ("vllm.ray-across-nodes", "vllm", [_cmd(["vllm", "serve", "m"], ["--tensor-parallel-size", "16"])]),
    ("trtllm.mpi-world", "trtllm", [_cmd(["trtllm-serve", "m"], ["--tp_size", "16"])]),
    # --ep_size 4 with --tp_size 2: moe_tp = 2 // 4 = 0, and 0 x 4 != 2
    ("trtllm.moe-world", "trtllm", [_cmd(["trtllm-serve", "m"], ["--tp_size", "2", "--ep_size", "4"])]),
    ("trtllm.attention-dp", "trtllm", [_cmd(["trtllm-serve", "m"], ["--tp_size", "8", "--ep_size", "4",
                                                                   "--extra_llm_api_options", "trtllm.yaml"])]),
    # a prefill and a decode server on one node, both at NIXL's default base port: ranks 0 collide
    ("vllm.nixl-side-channel", "vllm", [_cmd(["vllm", "serve", "m"], ["--kv-transfer-config", "{}"],
                                             env={"CUDA_VISIBLE_DEVICES": "0"}),
                                        _cmd(["vllm", "serve", "m"], ["--kv-transfer-config", "{}"],
                                             env={"CUDA_VISIBLE_DEVICES": "1"})]),
])
def test_each_checker_catches_its_violation(rule: str, fmt: str, commands: list[Command]) -> None:
    assert rule in serving_violations(_emitted(fmt, commands))


def test_trtllm_router_config_must_list_the_servers_started() -> None:
    """trtllm.disagg-instances: two urls for num_instances 1, or a url no server listens on, are caught."""
    servers = [_cmd(["trtllm-serve", "m"], ["--port", "8000"], role="prefill"),
               _cmd(["trtllm-serve", "m"], ["--port", "8001"], role="decode")]
    good = {"context_servers": {"num_instances": 1, "urls": ["127.0.0.1:8000"]},
            "generation_servers": {"num_instances": 1, "urls": ["127.0.0.1:8001"]}}
    e = _emitted("trtllm", servers, gpus=2)
    assert "trtllm.disagg-instances" not in serving_violations(e.model_copy(update={
        "files": {"disagg.yaml": yaml.safe_dump(good)}}))
    for bad in ({**good, "context_servers": {"num_instances": 1, "urls": ["127.0.0.1:8000", "127.0.0.1:8002"]}},
                {**good, "generation_servers": {"num_instances": 1, "urls": ["127.0.0.1:9000"]}}):
        assert "trtllm.disagg-instances" in serving_violations(e.model_copy(update={
            "files": {"disagg.yaml": yaml.safe_dump(bad)}}))


def test_trtllm_disaggregated_runs_on_the_pytorch_backend_behind_its_router() -> None:
    """dp 4 of tp 2, one prefill replica, 8-GPU node: the context server on GPUs 0-1 (port 8000), generation
    servers on 2-3, 4-5, 6-7 (ports 8001-8003), each with a cache transceiver; the router lists exactly them."""
    e = emit_plan(DENSE, ServingPlan(dp=4, tp=2, batch=16, prefill_replicas=1, precision="bf16"), "trtllm")
    servers = servers_of(e)
    assert [(c.role, c.env["CUDA_VISIBLE_DEVICES"], parse_flags(c.args)["--port"]) for c in servers] == [
        ("prefill", "0,1", "8000"), ("decode", "2,3", "8001"), ("decode", "4,5", "8002"), ("decode", "6,7", "8003")]
    assert all(parse_flags(c.args)["--backend"] == "pytorch" for c in servers)
    for name in ("trtllm-context.yaml", "trtllm-generation.yaml"):
        assert yaml.safe_load(e.files[name])["cache_transceiver_config"] == {"backend": "DEFAULT"}
    router = yaml.safe_load(e.files["disagg.yaml"])
    assert router["context_servers"] == {"num_instances": 1, "urls": ["127.0.0.1:8000"]}
    assert router["generation_servers"]["urls"] == ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]
    assert e.commands[-1].argv == ["trtllm-serve", "disaggregated", "-c", "disagg.yaml"]
    assert serving_violations(e) == []


def test_trtllm_moe_runs_expert_parallel_on_the_pytorch_backend() -> None:
    """MoE with ep = tp = 4, dp 2: two servers of 4 GPUs with --ep_size 4, each capped at the priced batch; ep 8
    over tp 1: attention DP; ep 8 over tp 2 refused (attention DP runs attention on one GPU per rank)."""
    e = emit_plan(SPARSE, ServingPlan(dp=2, tp=4, ep=4, batch=32, precision="bf16"), "trtllm")
    flags = [parse_flags(c.args) for c in servers_of(e)]
    assert [(f["--tp_size"], f["--ep_size"], f["--max_batch_size"]) for f in flags] == [("4", "4", "32")] * 2
    assert yaml.safe_load(e.files["trtllm.yaml"])["cuda_graph_config"]["max_batch_size"] == 32
    assert parse_emitted(e).ep == 4 and serving_violations(e) == []
    # dp 8 of tp 1 with ep 8: one server of 8 attention-DP ranks; each rank admits pp x --max_batch_size = 32
    adp = emit_plan(SPARSE, ServingPlan(dp=8, tp=1, ep=8, batch=32, precision="bf16"), "trtllm")
    (server,) = [parse_flags(c.args) for c in servers_of(adp)]
    assert (server["--tp_size"], server["--ep_size"], server["--max_batch_size"]) == ("8", "8", "32")
    assert yaml.safe_load(adp.files["trtllm.yaml"])["enable_attention_dp"] is True
    assert parse_emitted(adp) == ServingPlan(dp=8, tp=1, ep=8, batch=32, precision="bf16")
    # pp 2: a rank keeps pp x --max_batch_size active, so the flag is 32 / 2
    (pp2,) = [parse_flags(c.args) for c in servers_of(emit_plan(SPARSE, ServingPlan(dp=1, tp=2, pp=2, ep=2, batch=32,
                                                                                     precision="bf16"), "trtllm"))]
    assert pp2["--max_batch_size"] == "16"
    with pytest.raises(ProblemError, match=r"rule trtllm\.attention-dp"):
        emit_plan(SPARSE, ServingPlan(dp=4, tp=2, ep=8, batch=32, precision="bf16"), "trtllm")


# ------------------------------------------------------------------------------------------ hand-checked launches


def test_sglang_ep_server_caps_requests_per_attention_dp_rank() -> None:
    """dp 8, tp 1, ep 8, batch 128: one server of 8 GPUs, attention DP 8; SGLang gives each rank
    max_running_requests // 8, so the flag is 128 x 8 = 1024 (the issue saw 128, i.e. 16 per rank)."""
    e = emit_plan(SPARSE, ServingPlan(dp=8, tp=1, ep=8, batch=128), "sglang")
    (server,) = [parse_flags(c.args) for c in servers_of(e)]
    assert (server["--tp-size"], server["--attn-dp-size"], server["--max-running-requests"]) == ("8", "8", "1024")
    assert parse_emitted(e).batch == 128


def test_sglang_replicas_are_separate_servers_on_their_gpus_behind_the_router() -> None:
    """dp 3 of tp 4 on 8-GPU nodes: replicas 0 and 1 fill node 0 (GPUs 0-3, 4-7), replica 2 takes node 1."""
    e = emit_plan(DENSE, ServingPlan(dp=3, tp=4, batch=16), "sglang")
    placed = [(c.node, parse_flags(c.args)["--base-gpu-id"]) for c in servers_of(e)]
    assert placed == [(0, "0"), (0, "4"), (1, "0")]
    assert all("--dp-size" not in c.args and "--nnodes" not in c.args for c in servers_of(e))
    router = e.commands[-1]
    assert router.role == "router" and not router.background and router.node == 0
    urls = str(parse_flags(router.args)["--worker-urls"]).split()
    assert urls == ["http://${NODE_IP_0}:30001", "http://${NODE_IP_0}:30002", "http://${NODE_IP_1}:30003"]


def test_sglang_server_over_two_nodes_starts_on_each() -> None:
    """tp 16 on 8-GPU nodes: one server, --nnodes 2, node ranks 0 and 1, one --dist-init-addr on node 0."""
    e = emit_plan(DENSE, ServingPlan(dp=1, tp=16, batch=8), "sglang")
    parts = [(c.node, parse_flags(c.args)) for c in servers_of(e)]
    assert [(n, f["--nnodes"], f["--node-rank"]) for n, f in parts] == [(0, "2", "0"), (1, "2", "1")]
    assert {f["--dist-init-addr"] for _, f in parts} == {"${NODE_IP_0}:5000"}


def test_vllm_data_parallel_over_nodes_runs_headless_secondaries() -> None:
    """dp 6 of tp 2 on 8-GPU nodes: 4 ranks on node 0 (the API server), 2 on node 1 (--headless from rank 4)."""
    e = emit_plan(DENSE, ServingPlan(dp=6, tp=2, batch=32), "vllm")
    head, second = e.commands
    fh, fs = parse_flags(head.args), parse_flags(second.args)
    assert (fh["--data-parallel-size-local"], head.env["CUDA_VISIBLE_DEVICES"]) == ("4", "0,1,2,3,4,5,6,7")
    assert (fs["--data-parallel-start-rank"], fs["--data-parallel-size-local"], fs["--headless"]) == ("4", "2", True)
    assert second.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and second.node == 1 and second.ready is None


def test_trtllm_replica_over_nodes_starts_under_mpirun() -> None:
    e = emit_plan(DENSE, ServingPlan(dp=1, tp=16, batch=8), "trtllm")
    (c,) = e.commands
    assert c.launcher == ["mpirun", "-np", "16", "-H", "${NODE_IP_0}:8,${NODE_IP_1}:8"]
    assert c.program[:2] == ["trtllm-llmapi-launch", "trtllm-serve"]


def test_checkpoint_is_the_catalog_hf_id_or_the_override_or_a_named_fallback(tmp_path: Path) -> None:
    problem = serving("llama3-70b")
    hf = catalog.models()["llama3-70b"].hf_id
    assert hf and hf.count("/") == 1
    plan = ServingPlan(dp=1, tp=8, batch=8)
    assert emit_plan(problem, plan, "vllm").commands[0].program == ["vllm", "serve", hf]
    assert emit_plan(problem, plan, "sglang", "/ckpt/llama").commands[0].args[1] == "/ckpt/llama"
    inline = emit_plan(DENSE, plan, "trtllm")
    assert sum("no checkpoint" in n and "--checkpoint" in n for n in inline.notes) == 1
    path = tmp_path / "plan.yaml"
    path.write_text("{dp: 1, tp: 8, batch: 8}\n")
    r = run_main("emit", ROOT / "problems/serve-llama2-70b-dgx-h100.yaml", "vllm", "--plan", path)
    assert r.returncode == 2  # 8 of the problem's 128 GPUs: the evaluator's rule, before any checkpoint
    r = run_main("emit", ROOT / "problems/serve-llama3-70b.yaml", "vllm", "--plan", path, "--checkpoint", "/w/l3")
    assert r.returncode == 0 and "vllm serve /w/l3 " in r.stdout, r.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_scripts_are_valid_bash() -> None:
    for fmt, plan in [("vllm", ServingPlan(dp=6, tp=2, batch=32)), ("sglang", ServingPlan(dp=3, tp=4, batch=16)),
                      ("sglang", ServingPlan(dp=2, tp=2, batch=16, prefill_replicas=1)),
                      ("trtllm", ServingPlan(dp=2, tp=16, batch=8))]:
        script = emit_plan(DENSE, plan, fmt).script()
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0, script


# ---------------------------------------------------------------------------------------- random plans, models


@st.composite
def serving_plans(draw: Any, moe: bool) -> ServingPlan:
    tp, pp = draw(st.sampled_from([1, 2, 4, 8, 16])), draw(st.sampled_from([1, 2, 3]))
    dp = draw(st.integers(1, 8))
    cap = draw(st.integers(1, 512))
    caps = draw(st.sampled_from([{"batch": cap}, {"max_num_seqs": cap}]))
    ep = draw(st.sampled_from([1, tp, 2 * tp, 4 * tp])) if moe else 1
    return ServingPlan(dp=dp, tp=tp, pp=pp, ep=ep, **caps, precision=draw(st.sampled_from(["bf16", "fp8", "int4"])),
                       prefill_replicas=draw(st.integers(0, dp - 1)))


@settings(max_examples=40, deadline=None)
@given(serving_plans(moe=False))
def test_random_dense_plans_launch_and_round_trip(plan: ServingPlan) -> None:
    for fmt in FORMATS:
        check_launch(fmt, DENSE, plan)


@settings(max_examples=25, deadline=None)
@given(serving_plans(moe=True))
def test_random_moe_plans_launch_and_round_trip(plan: ServingPlan) -> None:
    for fmt in FORMATS:
        check_launch(fmt, SPARSE, plan)


LLMS = sorted(n for n, m in catalog.models().items() if m.family == "llm")


@pytest.mark.parametrize("name", LLMS)
def test_every_catalog_model_launches_as_priced(name: str) -> None:
    """Each catalog LLM, dense as tp 8 x 2 replicas, MoE as one expert-parallel group of 2 replicas (ep 16), at fp8
    (fp4 for a checkpoint shipping MXFP4, the precision it loads at)."""
    m = catalog.models()[name]
    problem = serving(name, gpu="b200", kv_precision="fp8")
    precision = "fp4" if m.native_precision == "mxfp4" else "fp8"
    plan = ServingPlan(dp=2, tp=8, batch=16, precision=precision, ep=16 if m.moe else 1)
    for fmt in FORMATS:
        check_launch(fmt, problem, plan)


def test_the_checkpoint_decides_the_quantization_it_loads_with() -> None:
    """DeepSeek-V3 ships FP8 weights: vLLM refuses fp4 (its modelopt_fp4 would not match the checkpoint's fp8 method:
    a start-up ValueError), SGLang requantizes the experts (modelopt_fp4 is listed compatible with fp8); gpt-oss
    ships MXFP4: fp4 loads with the checkpoint's own mxfp4; Llama-3 70B ships bf16: int4 (AWQ) needs --checkpoint."""
    deepseek = serving("deepseek-v3", gpu="b200")
    plan = ServingPlan(dp=8, tp=1, ep=8, batch=64, precision="fp4")
    with pytest.raises(ProblemError, match=r"vllm\.checkpoint-quantization"):
        emit_plan(deepseek, plan, "vllm")
    e = check_launch("sglang", deepseek, plan)
    assert e is not None and "--quantization modelopt_fp4" in " ".join(e.commands[0].args)
    assert check_launch("vllm", deepseek, plan, checkpoint="/ckpt/deepseek-v3-nvfp4") is not None
    oss = serving("gpt-oss-120b", gpu="b200")
    e = check_launch("vllm", oss, ServingPlan(dp=1, tp=4, ep=4, batch=32, precision="fp4"))
    assert e is not None and parse_flags(e.commands[0].args)["--quantization"] == "mxfp4"
    with pytest.raises(ProblemError, match=r"sglang\.checkpoint-quantization"):
        emit_plan(oss, ServingPlan(dp=1, tp=4, batch=32, precision="bf16"), "sglang")
    llama = serving("llama3-70b")
    with pytest.raises(ProblemError, match="its weights are not quantized"):
        emit_plan(llama, ServingPlan(dp=1, tp=4, batch=32, precision="int4"), "vllm")
    assert check_launch("trtllm", llama, ServingPlan(dp=1, tp=4, batch=32, precision="int4")) is not None  # build


def test_router_commands_parse_with_the_sglang_router_itself() -> None:
    """Optional (pip install sglang-router==0.3.2, no GPU or torch needed): the emitted router command goes through
    the router's own argparse and RouterArgs, and routes to exactly the servers started (PD mode: prefill with its
    bootstrap port, decode)."""
    import argparse

    router_args = pytest.importorskip("sglang_router.router_args")
    for plan in (ServingPlan(dp=3, tp=4, batch=16), ServingPlan(dp=4, tp=2, batch=16, prefill_replicas=1)):
        e = emit_plan(DENSE, plan, "sglang")
        parser = argparse.ArgumentParser()
        router_args.RouterArgs.add_cli_args(parser)
        args = router_args.RouterArgs.from_cli_args(parser.parse_args(e.commands[-1].args))
        urls = {role: [str(c.ready).removesuffix("/health") for c in servers_of(e) if c.ready and c.role == role]
                for role in ("run", "prefill", "decode")}  # each server's command on its first node
        if plan.prefill_replicas:
            bootstrap = [int(str(parse_flags(c.args)["--disaggregation-bootstrap-port"])) for c in servers_of(e)
                         if c.ready and c.role == "prefill"]
            assert args.pd_disaggregation and args.prefill_urls == list(zip(urls["prefill"], bootstrap, strict=True))
            assert args.decode_urls == urls["decode"]
        else:
            assert args.worker_urls == urls["run"]


def test_the_checkpoint_rule_reads_the_precision_the_emitter_recorded() -> None:
    """The checkpoint's dtype comes with the emitted configuration (the priced model's native_precision, None for
    weights given with --checkpoint); the rule applies it as vLLM / SGLang would read the checkpoint's config."""
    deepseek = serving("deepseek-v3", gpu="b200")  # catalog: ships fp8
    plan = ServingPlan(dp=8, tp=1, ep=8, batch=64, precision="fp4")
    e = emit_plan(deepseek, plan, "sglang")
    assert e.checkpoint_precision == "fp8" and serving_violations(e) == []
    assert emit_plan(deepseek, plan, "vllm", checkpoint="/ckpt/deepseek-v3-nvfp4").checkpoint_precision is None
    fp4 = [_cmd(["vllm", "serve", "m"], ["--quantization", "modelopt_fp4"])]
    assert "vllm.checkpoint-quantization" in serving_violations(  # an fp8 checkpoint is not modelopt_fp4
        _emitted("vllm", fp4).model_copy(update={"checkpoint_precision": "fp8"}))
    assert "vllm.checkpoint-quantization" not in serving_violations(_emitted("vllm", fp4))  # unknown: user's
    sg = [_cmd(SG, ["--tp-size", "8", "--quantization", "modelopt_fp4"])]  # bf16 weights: no online nvfp4 in SGLang
    assert "sglang.checkpoint-quantization" in serving_violations(
        _emitted("sglang", sg).model_copy(update={"checkpoint_precision": "bf16"}))
    assert "sglang.checkpoint-quantization" not in serving_violations(
        _emitted("sglang", sg).model_copy(update={"checkpoint_precision": "fp8"}))


@pytest.mark.parametrize(("fmt", "flag", "rule"), [("vllm", "--max-model-len", "vllm.max-model-len"),
                                                   ("sglang", "--context-length", "sglang.context-length")])
def test_requests_beyond_the_checkpoint_context_are_refused(fmt: str, flag: str, rule: str) -> None:
    """Llama-2-70B's config.json max_position_embeddings is 4096: 4000 + 96 tokens emit, 4000 + 97 are refused
    naming the rule; a longer length written by hand is caught by the rule's checker."""
    ok = emit_plan(serving("llama2-70b", prompt_len=4000, output_len=96), ServingPlan(dp=1, tp=4, batch=8), fmt)
    assert ok.checkpoint_context == 4096 and rule not in serving_violations(ok)
    with pytest.raises(ProblemError, match=f"requests of 4097 tokens.*rule {rule}"):
        emit_plan(serving("llama2-70b", prompt_len=4000, output_len=97), ServingPlan(dp=1, tp=4, batch=8), fmt)
    cmd = next(c for c in ok.commands if flag in c.args)
    args = list(cmd.args)
    args[args.index(flag) + 1] = "4097"
    bad = ok.model_copy(update={"commands": [c.model_copy(update={"args": args}) if c is cmd else c
                                             for c in ok.commands]})
    assert rule in serving_violations(bad)


@pytest.mark.parametrize(("model", "plan"), [("llama2-70b", ServingPlan(dp=1, tp=4, batch=8)),  # TensorRT backend
                                             ("mixtral-8x7b", ServingPlan(dp=1, tp=2, ep=2, batch=8))])  # PyTorch
def test_trtllm_max_seq_len_beyond_the_context_is_noted_not_refused(model: str, plan: ServingPlan) -> None:
    """TensorRT-LLM starts with a --max_seq_len above the checkpoint's max_position_embeddings (Llama-2-70B 4096,
    Mixtral-8x7B 32768): the PyTorch backend lowers it with a warning (model_engine.py _init_max_seq_len), the
    TensorRT backend builds for it with a warning. So emit writes the configuration with a note naming rule
    trtllm.max-seq-len; within the context there is no note; a longer --max_seq_len written by hand without the
    note is caught by the rule's checker."""
    context = {"llama2-70b": 4096, "mixtral-8x7b": 32768}[model]
    ok = emit_plan(serving(model, prompt_len=context - 96, output_len=96), plan, "trtllm")
    assert ok.checkpoint_context == context and serving_violations(ok) == []
    assert not any("trtllm.max-seq-len" in n for n in ok.notes)
    long = emit_plan(serving(model, prompt_len=context - 96, output_len=97), plan, "trtllm")
    server = next(c for c in long.commands if "--max_seq_len" in c.args)
    assert server.args[server.args.index("--max_seq_len") + 1] == str(context + 1)
    assert [n for n in long.notes if "rule trtllm.max-seq-len" in n] == [
        f"--max_seq_len {context + 1} is above {catalog.models()[model].hf_id}'s context of {context} tokens and "
        f"TensorRT-LLM starts anyway - {cite('trtllm.max-seq-len')}"]
    assert serving_violations(long) == []
    args = list(server.args)  # --max_seq_len context + 1 (asserted above) written into the configuration without the note
    bad = ok.model_copy(update={"commands": [c.model_copy(update={"args": args}) if "--max_seq_len" in c.args
                                             else c for c in ok.commands]})
    assert serving_violations(bad) == ["trtllm.max-seq-len"]
