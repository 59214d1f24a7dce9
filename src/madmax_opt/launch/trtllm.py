"""TensorRT-LLM serve commands: ``trtllm-serve`` on the TensorRT engine backend or on the PyTorch backend.

Dense aggregated plans run on the TensorRT engine backend (``--backend tensorrt``): the LLM API builds the engine and
quantizes it as ``quant_config`` says. Mixture-of-experts plans (expert parallelism) and disaggregated plans
(prefill_replicas > 0) run on the PyTorch backend (``--backend pytorch``): one server per replica with
``--ep_size`` and an ``--extra_llm_api_options`` file (KV-cache dtype, CUDA-graph batch sizes, the cache
transceiver of a disaggregated server), and, disaggregated, ``trtllm-serve disaggregated -c disagg.yaml`` in front
(the context and generation servers' URLs). The PyTorch backend reads the weights' quantization from the checkpoint
(``tensorrt_llm/_torch/model_config.py``, load_hf_quant_config), so a plan precision other than the checkpoint's is
refused unless ``--checkpoint`` names weights at it. A replica above a node starts under mpirun through
trtllm-llmapi-launch (MPI world = tp x pp). The start-up rules are data (data/flags/startup-serving.yaml).
"""

from __future__ import annotations

from typing import Any

import yaml

from madmax_opt.launch.common import (
    Command,
    Context,
    Emitted,
    dotted_items,
    flag_args,
    integer,
    parse_flags,
    refuse,
)
from madmax_opt.launch.rules import rule_refusal
from madmax_opt.launch.serve import (
    HEALTH,
    ROUTER_PORT,
    Placer,
    Serving,
    host,
    precision_from,
    servers,
    serving_format,
)
from madmax_opt.search.serving_space import ServingPlan

TRTLLM_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "FP8"),
                  "int8": ("bfloat16", "W8A8_SQ_PER_CHANNEL"), "int4": ("float16", "W4A16_AWQ"),
                  "fp4": ("bfloat16", "NVFP4")}
TRTLLM_KV = {"bf16": None, "fp16": None, "fp8": "FP8", "int8": "INT8"}
PYTORCH_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}  # KvCacheConfig.dtype (llmapi/llm_args.py)
TRTLLM_CONFIG, DISAGG_CONFIG = "trtllm.yaml", "disagg.yaml"
TRTLLM_PORT = 8000
# the plan precisions a checkpoint's weights run at on the PyTorch backend, by the dtype they ship in
CHECKPOINT_PRECISIONS = {"fp32": ("bf16", "fp16"), "bf16": ("bf16", "fp16"), "fp16": ("bf16", "fp16"),
                         "fp8": ("fp8",), "mxfp4": ("fp4",), "nvfp4": ("fp4",), "int4": ("int4",)}
QUANTIZED = ("fp8", "mxfp4", "nvfp4", "int4")
ROLE_CONFIG = {"prefill": "trtllm-context.yaml", "decode": "trtllm-generation.yaml", "run": TRTLLM_CONFIG}
# The PyTorch backend keeps pp_size x max_batch_size requests active per rank (PyTorchModelEngine.
# get_max_num_sequences, tensorrt_llm/_torch/pyexecutor/model_engine.py), and with attention DP the server admits
# tp_size times that (PyExecutor._fetch_new_requests: total_max_num_active_requests = tp_size x
# max_num_active_requests), so --max_batch_size is a replica's cap over pp (read in the stored versions of both files).


def pytorch_backend(ctx: Context) -> bool:
    p = ctx.plan
    return bool(getattr(p, "prefill_replicas", 0)) or getattr(p, "ep", 1) > 1 or ctx.model.moe is not None


def trtllm_emit(ctx: Context) -> Emitted:
    """One trtllm-serve per replica (per expert-parallel server): the TensorRT engine backend for dense aggregated
    plans, the PyTorch backend for MoE and disaggregated ones (with the disaggregated router in front)."""
    if not pytorch_backend(ctx):
        return _engine_emit(ctx)
    s = Serving(ctx, "trtllm", TRTLLM_WEIGHTS, PYTORCH_KV)
    p = s.plan
    known = ctx.checkpoint_precision is not None
    native = ctx.checkpoint_precision or "bf16"
    if s.precision not in CHECKPOINT_PRECISIONS[native]:
        ships = f"its weights ship in {native}" if known else "weights outside the catalog are taken as " \
            "unquantized (their quantization is not known here)"
        raise refuse("trtllm", f"precision {s.precision} from {s.checkpoint}", f"{ships}, and the PyTorch backend "
                     "takes the weights' quantization from the checkpoint (tensorrt_llm/_torch/model_config.py, "
                     "load_hf_quant_config); quantizing at load is not confirmed from the source; allowed: precision "
                     + " or ".join(CHECKPOINT_PRECISIONS[native]), field="precision")
    if p.ep > p.tp and p.tp > 1:  # attention DP: one GPU of attention per rank
        raise rule_refusal("trtllm", f"ep={p.ep} with tp={p.tp}", "trtllm.attention-dp", field="ep")
    if s.cap % p.pp:
        raise refuse("trtllm", f"batch {s.cap} with pp={p.pp}", "the PyTorch backend keeps pp x --max_batch_size "
                     "requests active per rank (model_engine.py get_max_num_sequences); allowed: a batch that is a "
                     "multiple of pp", field="batch")
    placer = Placer("trtllm", ctx.gpus_per_node)
    k = p.ep if p.ep > p.tp else 1  # replicas per server: attention-DP ranks of tp 1, else one replica
    placed = [(role, placer.take(k * s.replica_gpus)) for role, n in servers("trtllm", s)
              for _ in range(n if k == 1 and p.ep == 1 else 1)]
    nodes = placer.nodes
    files = {ROLE_CONFIG[role]: _options(s, role, k) for role in dict.fromkeys(r for r, _ in placed)}
    commands = [_server(s, i, role, parts, nodes, "pytorch", ROLE_CONFIG[role], k) for i, (role, parts) in
                enumerate(placed)]
    notes = ["--backend pytorch loads the checkpoint's own quantization (no engine build)"]
    if p.prefill_replicas:
        urls = {role: [f"{host(parts[0].node, nodes)}:{TRTLLM_PORT + i}" for i, (r, parts) in enumerate(placed)
                       if r == role] for role in ("prefill", "decode")}
        files[DISAGG_CONFIG] = yaml.safe_dump({
            "hostname": "0.0.0.0", "port": ROUTER_PORT,
            "context_servers": {"num_instances": len(urls["prefill"]), "urls": urls["prefill"]},
            "generation_servers": {"num_instances": len(urls["decode"]), "urls": urls["decode"]}}, sort_keys=False)
        if nodes > 1:  # the file names the nodes' addresses: filled in from NODE_IP_i on the head node
            commands.append(Command(program=["sh", "-c", f"envsubst < {DISAGG_CONFIG} > run-{DISAGG_CONFIG}"],
                                    args=[], role="router config", env={f"NODE_IP_{i}": f"${{NODE_IP_{i}}}"
                                                                        for i in range(nodes)}))
        commands.append(Command(program=["trtllm-serve", "disaggregated"], role="router",
                                args=["-c", f"run-{DISAGG_CONFIG}" if nodes > 1 else DISAGG_CONFIG]))
        notes.append(f"the disaggregated router (trtllm-serve disaggregated) serves on port {ROUTER_PORT}")
    elif len(placed) > 1:
        notes.append(f"{len(placed)} trtllm-serve servers on ports {TRTLLM_PORT}..{TRTLLM_PORT + len(placed) - 1} "
                     "(TensorRT-LLM has no router for aggregated replicas): balance requests over them")
    return s.emitted("trtllm", commands, nodes, files=files, notes=notes)


def _options(s: Serving, role: str, k: int) -> str:
    """The --extra_llm_api_options file of one role: weights dtype, KV-cache dtype, CUDA graphs up to a rank's
    --max_batch_size, attention DP over k replicas, and for a disaggregated server the KV-cache transceiver."""
    options: dict[str, Any] = {"dtype": s.dtype, "kv_cache_config": {"dtype": s.kv},
                               "cuda_graph_config": {"enable_padding": True, "max_batch_size": s.cap // s.plan.pp}}
    if k > 1:
        options["enable_attention_dp"] = True
    if role != "run":
        options["cache_transceiver_config"] = {"backend": "DEFAULT"}
    return yaml.safe_dump(options, sort_keys=False)


def _server(s: Serving, i: int, role: str, parts: list[Any], nodes: int, backend: str, config: str,
            k: int = 1) -> Command:
    """trtllm-serve ``i`` (one replica, or k attention-DP replicas of tp 1) on its GPUs; above a node under mpirun
    (MPI world = the server's tp x pp ranks). The PyTorch backend's --max_batch_size is a rank's cap over pp."""
    p = s.plan
    port = TRTLLM_PORT + i
    head = parts[0].node
    cap = s.cap // p.pp if backend == "pytorch" else s.cap
    args = flag_args([("--backend", backend), ("--tp_size", p.tp * k), ("--pp_size", p.pp),
                      ("--ep_size", p.ep if p.ep > 1 else None), ("--gpus_per_node", len(parts[0].gpus)),
                      ("--max_batch_size", cap), ("--max_seq_len", s.max_len), ("--host", "0.0.0.0"),
                      ("--port", port), ("--extra_llm_api_options", config)])
    ready = f"http://{host(head, nodes)}:{port}{HEALTH}"
    name = role if role != "run" else f"replica {i}"
    if len(parts) > 1:
        hosts = ",".join(f"{host(x.node, nodes)}:{len(x.gpus)}" for x in parts)
        return Command(launcher=["mpirun", "-np", str(k * s.replica_gpus), "-H", hosts],
                       program=["trtllm-llmapi-launch", "trtllm-serve", s.checkpoint], args=args, role=name,
                       node=head, background=True, ready=ready)
    return Command(program=["trtllm-serve", s.checkpoint], args=args, role=name, node=head, background=True,
                   env={"CUDA_VISIBLE_DEVICES": parts[0].devices}, ready=ready)


def _engine_emit(ctx: Context) -> Emitted:
    """Dense aggregated plans on the TensorRT engine backend: the LLM API builds the engine and applies
    quant_config (weights and KV cache)."""
    s = Serving(ctx, "trtllm", TRTLLM_WEIGHTS, TRTLLM_KV)
    quant = {"quant_algo": s.quantization, "kv_cache_quant_algo": s.kv}
    config = {"dtype": s.dtype, "quant_config": {k: v for k, v in quant.items() if v is not None} or None}
    text = yaml.safe_dump({k: v for k, v in config.items() if v is not None}, sort_keys=False)
    placer = Placer("trtllm", ctx.gpus_per_node)
    placed = [placer.take(s.replica_gpus) for _ in range(s.plan.dp)]
    commands = [_server(s, i, "run", parts, placer.nodes, "tensorrt", TRTLLM_CONFIG) for i, parts in enumerate(placed)]
    notes = ["--backend tensorrt builds the engine at start-up (the trtllm-build path) and applies quant_config"]
    if s.plan.dp > 1:
        notes.append(f"{s.plan.dp} trtllm-serve replicas on ports {TRTLLM_PORT}..{TRTLLM_PORT + s.plan.dp - 1} "
                     "(TensorRT-LLM has no router for aggregated replicas): balance requests over them")
    return s.emitted("trtllm", commands, placer.nodes, files={TRTLLM_CONFIG: text}, notes=notes)


def trtllm_parse(e: Emitted) -> ServingPlan:
    serves = [c for c in e.commands if "trtllm-serve" in c.program and "disaggregated" not in c.program]
    f = parse_flags(serves[0].args)
    config = yaml.safe_load(e.files[str(f["--extra_llm_api_options"])])
    if f["--backend"] == "tensorrt":
        quant = (config.get("quant_config") or {}).get("quant_algo")
        precision = precision_from(TRTLLM_WEIGHTS, config["dtype"], quant)
    else:  # the checkpoint's own weights: a catalog checkpoint's quantization, else unquantized at dtype
        native = e.checkpoint_precision or "bf16"
        precision = CHECKPOINT_PRECISIONS[native][0] if native in QUANTIZED else \
            precision_from(TRTLLM_WEIGHTS, config["dtype"], None)
    pytorch = f["--backend"] == "pytorch"
    k = integer(f, "--tp_size") if config.get("enable_attention_dp") else 1  # attention-DP ranks: replicas of tp 1
    pp = integer(f, "--pp_size")
    return ServingPlan(dp=k * len(serves), tp=integer(f, "--tp_size") // k, pp=pp, ep=integer(f, "--ep_size"),
                       batch=integer(f, "--max_batch_size") * (pp if pytorch else 1), precision=precision,
                       prefill_replicas=k * sum(1 for c in serves if c.role == "prefill"))


def trtllm_config(e: Emitted) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for name, text in e.files.items():
        prefix = "disagg." if name == DISAGG_CONFIG else ""
        items |= {prefix + k: v for k, v in dotted_items(yaml.safe_load(text)).items()}
    return items


TRTLLM = serving_format("trtllm", trtllm_emit, trtllm_parse, config=trtllm_config, maps={
    "dp": ("--port",), "tp": ("--tp_size",), "pp": ("--pp_size",), "ep": ("--ep_size",),
    "batch": ("--max_batch_size", "cuda_graph_config.max_batch_size"), "max_num_seqs": ("--max_batch_size",),
    "precision": ("dtype", "quant_config.quant_algo", "--backend"),
    "prefill_replicas": ("disagg.context_servers.num_instances", "cache_transceiver_config.backend"),
    "system": ("--gpus_per_node",),
}, refuses={"max_num_seqs": "max_num_seqs other than batch: one server cap carries both",
            "ep": "ep above tp with tp > 1 (attention DP runs one GPU of attention per rank)"})
