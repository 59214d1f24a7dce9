"""Serve commands: vLLM, SGLang and TensorRT-LLM (trtllm-serve with the engine-building TensorRT backend).

A serving plan is dp replicas of tp x pp GPUs, each running up to ``batch`` sequences, at a weight precision; with
prefill_replicas > 0 those replicas only prefill and send the KV cache to the rest (disaggregation). The batch is
the server's cap on running sequences (vLLM --max-num-seqs, SGLang --max-running-requests, TRT-LLM
--max_batch_size), and so is max_num_seqs (online plans, Poisson arrivals, carry only that): parsed back, the cap is
the plan's batch. A plan whose max_num_seqs differs from its batch is refused. The KV-cache precision comes from the
task. With expert parallelism (ep = k x tp, MoE) each group of k replicas is one server: vLLM
--enable-expert-parallel over its data-parallel ranks, SGLang --tp-size ep --attn-dp-size k --ep-size ep.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from madmax_opt.launch.common import (
    Command,
    Context,
    Emitted,
    Format,
    dotted_items,
    flag_args,
    integer,
    parse_flags,
    precision_of,
    refuse,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.model.inference import DEFAULT_KV_PRECISION
from madmax_opt.model.spec import InferenceTask
from madmax_opt.search.serving_space import TRAINING_KNOBS, ServingPlan

# weight precision -> (dtype, quantization) per framework; int8 / int4 / fp4 need a pre-quantized checkpoint
VLLM_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8"),
                "int8": ("bfloat16", "compressed-tensors"), "int4": ("float16", "awq"),
                "fp4": ("bfloat16", "modelopt_fp4")}
SGLANG_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8"),
                  "int8": ("bfloat16", "w8a8_int8"), "int4": ("float16", "awq"), "fp4": ("bfloat16", "modelopt_fp4")}
TRTLLM_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "FP8"),
                  "int8": ("bfloat16", "W8A8_SQ_PER_CHANNEL"), "int4": ("float16", "W4A16_AWQ"),
                  "fp4": ("bfloat16", "NVFP4")}
VLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
SGLANG_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3"}
TRTLLM_KV = {"bf16": None, "fp16": None, "fp8": "FP8", "int8": "INT8"}
TRTLLM_CONFIG = "trtllm.yaml"
PREQUANTIZED = "int8, int4 and fp4 weights load from a pre-quantized checkpoint: point MODEL at one"


class Serving:
    """What every serve command needs from a serving plan and its task."""

    def __init__(self, ctx: Context, fmt: str, weights: Mapping[str, tuple[str, str | None]],
                 kv: Mapping[str, str | None]) -> None:
        task, p = ctx.problem.task, ctx.plan
        if not isinstance(task, InferenceTask) or not isinstance(p, ServingPlan):
            raise refuse(fmt, "a training task", "a serving format; allowed for training: megatron, nemo, "
                         "torchtitan, deepspeed", field="task.kind")
        if p.batch is not None and p.max_num_seqs is not None and p.max_num_seqs != p.batch:
            raise refuse(fmt, f"max_num_seqs={p.max_num_seqs} with batch={p.batch}", "one server cap carries both; "
                         "an offered batch above the cap is load, not a server setting; allowed: max_num_seqs = "
                         "batch or unset")
        cap = p.max_num_seqs or p.batch  # saturated plans size the cap by batch, online plans by max_num_seqs
        if cap is None:
            raise refuse(fmt, "a plan without batch or max_num_seqs", "the server needs its cap on running "
                         "sequences; allowed: a batch or max_num_seqs (solve returns one)", field="batch")
        self.ctx, self.plan, self.task, self.cap = ctx, p, task, cap
        self.precision = precision_of(p, task.precisions()[0])
        kv_precision = task.kv_precision or DEFAULT_KV_PRECISION[self.precision]
        if self.precision not in weights:
            raise refuse(fmt, f"precision {self.precision}", f"allowed: {', '.join(weights)}", field="precision")
        if kv_precision not in kv:
            raise refuse(fmt, f"a {kv_precision} KV cache", f"allowed: {', '.join(kv)}",
                         field="task.kv_precision")
        self.dtype, self.quantization = weights[self.precision]
        self.kv = kv[kv_precision]
        self.max_len = max(r.prompt_len + r.output_len for r in task.requests())
        self.groups = [("prefill", p.prefill_replicas), ("decode", p.dp - p.prefill_replicas)] \
            if p.prefill_replicas else [("run", p.dp)]

    def emitted(self, fmt: str, commands: list[Command], files: dict[str, str] | None = None,
                notes: list[str] | None = None) -> Emitted:
        fs, p, gpn = flagset(fmt), self.plan, self.ctx.gpus_per_node
        gpus = p.dp * p.tp * p.pp
        notes = [f"MODEL = {self.ctx.model.name}: replace with the checkpoint path or hub id", *(notes or [])]
        if self.task.arrival_rate is not None:
            notes.append(f"online load: Poisson arrivals at {self.task.arrival_rate:g} requests/s over the deployment")
        if self.precision in ("int8", "int4", "fp4"):
            notes.append(PREQUANTIZED)
        return Emitted(format=fmt, framework=fs.framework, version=fs.version, kind="serving",
                       system=self.ctx.option.system.name, gpus=gpus, nodes=-(-gpus // gpn),
                       gpus_per_node=min(gpus, gpn), commands=commands, files=files or {}, notes=notes)


def precision_from(weights: Mapping[str, tuple[str, str | None]], dtype: str, quantization: str | None) -> str:
    return next(k for k, (d, q) in weights.items() if q == quantization and (q is not None or d == dtype))


def servers(fmt: str, s: Serving) -> list[tuple[str, int]]:
    """(role, replicas) of every server: with expert parallelism (ep = k x tp) one server per EP group of k
    replicas; without, one server per role holding all its replicas."""
    p = s.plan
    k = p.ep // p.tp if p.ep > 1 else 0
    if p.ep > 1 and p.ep % p.tp:
        raise refuse(fmt, f"ep={p.ep} with tp={p.tp}", "an expert-parallel group is whole replicas; allowed: ep a "
                     "multiple of tp")
    out = []
    for role, dp in s.groups:
        if k and dp % k:
            raise refuse(fmt, f"ep={p.ep}", f"{dp} {role} replicas do not split into expert-parallel groups of {k}")
        out += [(role, k)] * (dp // k) if k else [(role, dp)]
    return out


def ports(base: int, n: int, i: int) -> int | None:
    return base + i if n > 1 else None


# ------------------------------------------------------------------------------------------------------- vLLM


def vllm_emit(ctx: Context) -> Emitted:
    s = Serving(ctx, "vllm", VLLM_WEIGHTS, VLLM_KV)
    p, gpn = s.plan, ctx.gpus_per_node
    commands = []
    plan_servers = servers("vllm", s)
    for i, (role, dp) in enumerate(plan_servers):
        replica = p.tp * p.pp
        local = gpn // replica if dp * replica > gpn and replica <= gpn else None
        kv_transfer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill"
                                  else "kv_consumer"}) if role != "run" else None
        args = flag_args([
            ("--tensor-parallel-size", p.tp), ("--pipeline-parallel-size", p.pp), ("--data-parallel-size", dp),
            ("--data-parallel-size-local", local), ("--distributed-executor-backend", "ray" if replica > gpn else None),
            ("--enable-expert-parallel", p.ep > 1), ("--max-num-seqs", s.cap), ("--max-model-len", s.max_len),
            ("--dtype", s.dtype), ("--quantization", s.quantization),
            ("--kv-cache-dtype", s.kv), ("--kv-transfer-config", kv_transfer),
            ("--port", ports(8000, len(plan_servers), i)),
        ])
        commands.append(Command(program=["vllm", "serve", ctx.model.name], args=args, role=role))
    notes = ["prefill and decode servers exchange KV caches through NIXL; put a disaggregation proxy in front"] \
        if p.prefill_replicas else []
    if any("--data-parallel-size-local" in c.args for c in commands):
        notes.append("data parallelism spans nodes: run the command on every node with --data-parallel-start-rank "
                     "and --data-parallel-address (vLLM multi-node data parallel)")
    return s.emitted("vllm", commands, notes=notes)


def vllm_parse(e: Emitted) -> ServingPlan:
    flags = [(c.role, parse_flags(c.args)) for c in e.commands]
    f = flags[-1][1]
    tp, dp = integer(f, "--tensor-parallel-size"), integer(f, "--data-parallel-size")
    q = f.get("--quantization")
    return ServingPlan(
        dp=sum(integer(g, "--data-parallel-size") for _, g in flags), tp=tp, pp=integer(f, "--pipeline-parallel-size"),
        batch=integer(f, "--max-num-seqs"), ep=tp * dp if "--enable-expert-parallel" in f else 1,
        precision=precision_from(VLLM_WEIGHTS, str(f["--dtype"]), q if isinstance(q, str) else None),
        prefill_replicas=sum(integer(g, "--data-parallel-size") for r, g in flags if r == "prefill"),
    )


def vllm_config(e: Emitted) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for c in e.commands:
        value = parse_flags(c.args).get("--kv-transfer-config")
        if isinstance(value, str):
            items |= dotted_items(json.loads(value))
    return items


# ----------------------------------------------------------------------------------------------------- SGLang


def sglang_emit(ctx: Context) -> Emitted:
    """Expert parallelism: one server of ep GPUs per EP group, attention data parallel over its k replicas."""
    s = Serving(ctx, "sglang", SGLANG_WEIGHTS, SGLANG_KV)
    p, gpn = s.plan, ctx.gpus_per_node
    commands = []
    plan_servers = servers("sglang", s)
    for i, (role, dp) in enumerate(plan_servers):
        nodes = -(-(dp * p.tp * p.pp) // gpn)
        args = flag_args([
            ("--model-path", ctx.model.name), ("--tp-size", p.tp * dp if p.ep > 1 else p.tp), ("--pp-size", p.pp),
            ("--dp-size", dp if p.ep == 1 else None), ("--attn-dp-size", dp if p.ep > 1 and dp > 1 else None),
            ("--ep-size", p.ep if p.ep > 1 else None), ("--nnodes", nodes if nodes > 1 else None),
            ("--node-rank", 0 if nodes > 1 else None), ("--max-running-requests", s.cap),
            ("--context-length", s.max_len), ("--dtype", s.dtype), ("--quantization", s.quantization),
            ("--kv-cache-dtype", s.kv), ("--disaggregation-mode", role if role != "run" else None),
            ("--port", ports(30000, len(plan_servers), i)),
        ])
        commands.append(Command(program=["python", "-m", "sglang.launch_server"], args=args, role=role))
    notes = []
    if any("--nnodes" in c.args for c in commands):
        notes.append("a server spans nodes: start it on every node with --node-rank i and --dist-init-addr")
    if p.prefill_replicas:
        notes.append("prefill and decode servers need the sglang router in PD mode in front")
    return s.emitted("sglang", commands, notes=notes)


def sglang_parse(e: Emitted) -> ServingPlan:
    flags = [(c.role, parse_flags(c.args)) for c in e.commands]

    def replicas(g: dict[str, str | bool]) -> int:
        return integer(g, "--attn-dp-size") if "--ep-size" in g else integer(g, "--dp-size")

    f = flags[-1][1]
    q = f.get("--quantization")
    return ServingPlan(
        dp=sum(replicas(g) for _, g in flags), tp=integer(f, "--tp-size") // integer(f, "--attn-dp-size"),
        pp=integer(f, "--pp-size"), ep=integer(f, "--ep-size"), batch=integer(f, "--max-running-requests"),
        precision=precision_from(SGLANG_WEIGHTS, str(f["--dtype"]), q if isinstance(q, str) else None),
        prefill_replicas=sum(replicas(g) for r, g in flags if r == "prefill"),
    )


# ----------------------------------------------------------------------------------------------- TensorRT-LLM


def trtllm_emit(ctx: Context) -> Emitted:
    """One trtllm-serve per replica on the TensorRT engine backend (the trtllm-build path): the LLM API builds the
    engine and quantizes it as quant_config says. Expert parallelism / attention data parallelism (MoE serving)
    run on the PyTorch backend from pre-quantized checkpoints, which is not emitted."""
    s = Serving(ctx, "trtllm", TRTLLM_WEIGHTS, TRTLLM_KV)
    p = s.plan
    if p.prefill_replicas:
        raise refuse("trtllm", f"prefill_replicas={p.prefill_replicas}", "disaggregated serving needs a "
                     "trtllm-serve disaggregated cluster file, which is not emitted; allowed: prefill_replicas 0")
    if p.ep > 1 or ctx.model.moe is not None:
        raise refuse("trtllm", "expert parallelism (a mixture-of-experts model)", "emitted for the TensorRT engine "
                     "backend, whose build quantizes dense models; MoE serving runs on the PyTorch backend from "
                     "pre-quantized checkpoints; allowed: dense models, ep 1",
                     field="ep" if p.ep > 1 else "model.moe")
    quant = {"quant_algo": s.quantization, "kv_cache_quant_algo": s.kv}
    config = {"dtype": s.dtype, "quant_config": {k: v for k, v in quant.items() if v is not None} or None}
    text = yaml.safe_dump({k: v for k, v in config.items() if v is not None}, sort_keys=False)
    commands = [
        Command(program=["trtllm-serve", ctx.model.name], role=f"replica {i}", args=flag_args([
            ("--backend", "tensorrt"), ("--tp_size", p.tp), ("--pp_size", p.pp),
            ("--gpus_per_node", ctx.gpus_per_node), ("--max_batch_size", s.cap), ("--max_seq_len", s.max_len),
            ("--port", 8000 + i), ("--extra_llm_api_options", TRTLLM_CONFIG),
        ]))
        for i in range(p.dp)
    ]
    notes = ["one trtllm-serve per replica (ports 8000+i), each on its own tp x pp GPUs; balance requests over them",
             "--backend tensorrt builds the engine at start-up (the trtllm-build path) and applies quant_config"]
    return s.emitted("trtllm", commands, files={TRTLLM_CONFIG: text}, notes=notes)


def trtllm_parse(e: Emitted) -> ServingPlan:
    f = parse_flags(e.commands[0].args)
    config = yaml.safe_load(e.files[TRTLLM_CONFIG])
    quant = (config.get("quant_config") or {}).get("quant_algo")
    return ServingPlan(
        dp=len(e.commands), tp=integer(f, "--tp_size"), pp=integer(f, "--pp_size"),
        batch=integer(f, "--max_batch_size"), precision=precision_from(TRTLLM_WEIGHTS, config["dtype"], quant),
    )


def trtllm_config(e: Emitted) -> dict[str, Any]:
    return dotted_items(yaml.safe_load(e.files[TRTLLM_CONFIG]))


TRAINING_ONLY = "training-only (a serving plan rejects it)"


def serving_format(name: str, emit: Callable[[Context], Emitted], parse: Callable[[Emitted], ServingPlan],
                   maps: dict[str, tuple[str, ...]], refuses: dict[str, str],
                   config: Callable[[Emitted], dict[str, Any]] = lambda e: {}) -> Format:
    training = {k: TRAINING_ONLY for k in (*TRAINING_KNOBS, "stage_systems")}  # stage_systems needs stage_layers
    return Format(name=name, kind="serving", emit=emit, parse=parse, maps=maps, refuses={**training, **refuses},
                  config=config)


CAP = "max_num_seqs other than batch: one server cap carries both"
EP_GROUPS = "ep not a multiple of tp, or replicas that do not split into expert-parallel groups"
VLLM = serving_format("vllm", vllm_emit, vllm_parse, config=vllm_config, maps={
    "dp": ("--data-parallel-size",), "tp": ("--tensor-parallel-size",), "pp": ("--pipeline-parallel-size",),
    "ep": ("--enable-expert-parallel", "--data-parallel-size"), "batch": ("--max-num-seqs",),
    "max_num_seqs": ("--max-num-seqs",),
    "precision": ("--dtype", "--quantization"), "prefill_replicas": ("--kv-transfer-config", "kv_role"),
    "system": ("--data-parallel-size-local", "--distributed-executor-backend"),
}, refuses={"max_num_seqs": CAP, "ep": EP_GROUPS})
SGLANG = serving_format("sglang", sglang_emit, sglang_parse, maps={
    "dp": ("--dp-size", "--attn-dp-size"), "tp": ("--tp-size",), "pp": ("--pp-size",),
    "ep": ("--ep-size", "--attn-dp-size"),
    "batch": ("--max-running-requests",), "max_num_seqs": ("--max-running-requests",),
    "precision": ("--dtype", "--quantization"), "prefill_replicas": ("--disaggregation-mode", "--dp-size"),
    "system": ("--nnodes", "--node-rank"),
}, refuses={"max_num_seqs": CAP, "ep": EP_GROUPS})
TRTLLM = serving_format("trtllm", trtllm_emit, trtllm_parse, config=trtllm_config, maps={
    "dp": ("--port",), "tp": ("--tp_size",), "pp": ("--pp_size",),
    "batch": ("--max_batch_size",), "max_num_seqs": ("--max_batch_size",),
    "precision": ("dtype", "quant_config.quant_algo"), "system": ("--gpus_per_node",),
}, refuses={"max_num_seqs": CAP, "prefill_replicas": "prefill_replicas > 0: no disaggregated cluster file",
            "ep": "ep > 1: MoE serving runs on the PyTorch backend, not the emitted TensorRT engine"})
