"""Serve commands: vLLM, SGLang and TensorRT-LLM (trtllm-serve with the engine-building TensorRT backend).

A serving plan is dp replicas of tp x pp GPUs, each running up to ``batch`` sequences, at a weight precision; with
prefill_replicas > 0 those replicas only prefill and send the KV cache to the rest (disaggregation). The batch is
the server's cap on running sequences (vLLM --max-num-seqs, SGLang --max-running-requests, TRT-LLM
--max_batch_size); the KV-cache precision comes from the task.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import yaml

from madmax_opt.launch.common import (
    Command,
    Context,
    Emitted,
    Format,
    dotted_keys,
    flag_args,
    integer,
    parse_flags,
    precision_of,
    refuse,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.model.inference import DEFAULT_KV_PRECISION
from madmax_opt.model.spec import InferenceTask
from madmax_opt.search.serving_space import ServingPlan

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
                         "torchtitan, deepspeed")
        if p.batch is None:
            raise refuse(fmt, "a plan without batch", "the server's cap on running sequences is the plan's batch; "
                         "allowed: a batch (solve returns one)")
        if p.max_num_seqs is not None and p.max_num_seqs != p.batch:
            raise refuse(fmt, f"max_num_seqs={p.max_num_seqs} with batch={p.batch}", "one server cap carries both; "
                         "an offered batch above the cap is load, not a server setting; allowed: max_num_seqs = "
                         "batch or unset")
        self.ctx, self.plan, self.task = ctx, p, task
        self.precision = precision_of(p, task.precisions()[0])
        kv_precision = task.kv_precision or DEFAULT_KV_PRECISION[self.precision]
        if self.precision not in weights:
            raise refuse(fmt, f"precision {self.precision}", f"allowed: {', '.join(weights)}")
        if kv_precision not in kv:
            raise refuse(fmt, f"a {kv_precision} KV cache", f"allowed: {', '.join(kv)}")
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
        if self.precision in ("int8", "int4", "fp4"):
            notes.append(PREQUANTIZED)
        return Emitted(format=fmt, framework=fs.framework, version=fs.version, kind="serving",
                       system=self.ctx.option.system.name, gpus=gpus, nodes=-(-gpus // gpn),
                       gpus_per_node=min(gpus, gpn), commands=commands, files=files or {}, notes=notes)


def precision_from(weights: Mapping[str, tuple[str, str | None]], dtype: str, quantization: str | None) -> str:
    return next(k for k, (d, q) in weights.items() if q == quantization and (q is not None or d == dtype))


# ------------------------------------------------------------------------------------------------------- vLLM


def vllm_emit(ctx: Context) -> Emitted:
    s = Serving(ctx, "vllm", VLLM_WEIGHTS, VLLM_KV)
    p, gpn = s.plan, ctx.gpus_per_node
    if p.ep > 1 and (p.prefill_replicas or p.ep != p.tp * p.dp):
        raise refuse("vllm", f"ep={p.ep}", f"--enable-expert-parallel spans tp x dp = {p.tp * p.dp} ranks of one "
                     "aggregated deployment; allowed: ep 1 or tp*dp")
    commands = []
    for role, dp in s.groups:
        replica = p.tp * p.pp
        local = gpn // replica if dp * replica > gpn and replica <= gpn else None
        kv_transfer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill"
                                  else "kv_consumer"}) if role != "run" else None
        args = flag_args([
            ("--tensor-parallel-size", p.tp), ("--pipeline-parallel-size", p.pp), ("--data-parallel-size", dp),
            ("--data-parallel-size-local", local), ("--distributed-executor-backend", "ray" if replica > gpn else None),
            ("--enable-expert-parallel", p.ep > 1), ("--max-num-seqs", p.batch), ("--max-model-len", s.max_len),
            ("--dtype", s.dtype), ("--quantization", s.quantization),
            ("--kv-cache-dtype", s.kv), ("--kv-transfer-config", kv_transfer),
        ])
        commands.append(Command(program=["vllm", "serve", ctx.model.name], args=args, role=role))
    notes = ["prefill and decode servers exchange KV caches through NIXL; put a disaggregation proxy in front"] \
        if p.prefill_replicas else []
    if len(commands) == 1 and "--data-parallel-size-local" in commands[0].args:
        notes.append("data parallelism spans nodes: run the command on every node with --data-parallel-start-rank "
                     "and --data-parallel-address (vLLM multi-node data parallel)")
    return s.emitted("vllm", commands, notes=notes)


def vllm_parse(e: Emitted) -> ServingPlan:
    groups = {c.role: parse_flags(c.args) for c in e.commands}
    f = groups.get("decode", groups.get("run", {}))
    tp, dp = integer(f, "--tensor-parallel-size"), sum(integer(g, "--data-parallel-size") for g in groups.values())
    q = f.get("--quantization")
    return ServingPlan(
        dp=dp, tp=tp, pp=integer(f, "--pipeline-parallel-size"), batch=integer(f, "--max-num-seqs"),
        ep=tp * dp if "--enable-expert-parallel" in f else 1,
        precision=precision_from(VLLM_WEIGHTS, str(f["--dtype"]), q if isinstance(q, str) else None),
        prefill_replicas=integer(groups["prefill"], "--data-parallel-size") if "prefill" in groups else 0,
    )


def vllm_keys(e: Emitted) -> set[str]:
    keys: set[str] = set()
    for c in e.commands:
        value = parse_flags(c.args).get("--kv-transfer-config")
        if isinstance(value, str):
            keys |= dotted_keys(json.loads(value))
    return keys


# ----------------------------------------------------------------------------------------------------- SGLang


def sglang_emit(ctx: Context) -> Emitted:
    s = Serving(ctx, "sglang", SGLANG_WEIGHTS, SGLANG_KV)
    p, gpn = s.plan, ctx.gpus_per_node
    commands = []
    for role, dp in s.groups:
        nodes = -(-(dp * p.tp * p.pp) // gpn)
        args = flag_args([
            ("--model-path", ctx.model.name), ("--tp-size", p.tp), ("--pp-size", p.pp), ("--dp-size", dp),
            ("--ep-size", p.ep if p.ep > 1 else None), ("--nnodes", nodes if nodes > 1 else None),
            ("--node-rank", 0 if nodes > 1 else None), ("--max-running-requests", p.batch),
            ("--context-length", s.max_len), ("--dtype", s.dtype), ("--quantization", s.quantization),
            ("--kv-cache-dtype", s.kv), ("--disaggregation-mode", role if role != "run" else None),
        ])
        commands.append(Command(program=["python", "-m", "sglang.launch_server"], args=args, role=role))
    notes = []
    if any("--nnodes" in c.args for c in commands):
        notes.append("a server spans nodes: start it on every node with --node-rank i and --dist-init-addr")
    if p.prefill_replicas:
        notes.append("prefill and decode servers need the sglang router in PD mode in front")
    return s.emitted("sglang", commands, notes=notes)


def sglang_parse(e: Emitted) -> ServingPlan:
    groups = {c.role: parse_flags(c.args) for c in e.commands}
    f = groups.get("decode", groups.get("run", {}))
    q = f.get("--quantization")
    return ServingPlan(
        dp=sum(integer(g, "--dp-size") for g in groups.values()), tp=integer(f, "--tp-size"),
        pp=integer(f, "--pp-size"), ep=integer(f, "--ep-size"), batch=integer(f, "--max-running-requests"),
        precision=precision_from(SGLANG_WEIGHTS, str(f["--dtype"]), q if isinstance(q, str) else None),
        prefill_replicas=integer(groups["prefill"], "--dp-size") if "prefill" in groups else 0,
    )


# ----------------------------------------------------------------------------------------------- TensorRT-LLM


def trtllm_emit(ctx: Context) -> Emitted:
    s = Serving(ctx, "trtllm", TRTLLM_WEIGHTS, TRTLLM_KV)
    p = s.plan
    if p.prefill_replicas:
        raise refuse("trtllm", f"prefill_replicas={p.prefill_replicas}", "disaggregated serving needs a "
                     "trtllm-serve disaggregated cluster file, which is not emitted; allowed: prefill_replicas 0")
    quant = {"quant_algo": s.quantization, "kv_cache_quant_algo": s.kv}
    config = {"dtype": s.dtype, "quant_config": {k: v for k, v in quant.items() if v is not None} or None}
    text = yaml.safe_dump({k: v for k, v in config.items() if v is not None}, sort_keys=False)
    commands = [
        Command(program=["trtllm-serve", ctx.model.name], role=f"replica {i}", args=flag_args([
            ("--backend", "tensorrt"), ("--tp_size", p.tp), ("--pp_size", p.pp), ("--ep_size", p.ep if p.ep > 1
                                                                                   else None),
            ("--gpus_per_node", ctx.gpus_per_node), ("--max_batch_size", p.batch), ("--max_seq_len", s.max_len),
            ("--port", 8000 + i), ("--extra_llm_api_options", TRTLLM_CONFIG),
        ]))
        for i in range(p.dp)
    ]
    notes = ["one trtllm-serve per replica (ports 8000+i), each on its own tp x pp GPUs; balance requests over them"]
    return s.emitted("trtllm", commands, files={TRTLLM_CONFIG: text}, notes=notes)


def trtllm_parse(e: Emitted) -> ServingPlan:
    f = parse_flags(e.commands[0].args)
    config = yaml.safe_load(e.files[TRTLLM_CONFIG])
    quant = (config.get("quant_config") or {}).get("quant_algo")
    return ServingPlan(
        dp=len(e.commands), tp=integer(f, "--tp_size"), pp=integer(f, "--pp_size"), ep=integer(f, "--ep_size"),
        batch=integer(f, "--max_batch_size"), precision=precision_from(TRTLLM_WEIGHTS, config["dtype"], quant),
    )


def trtllm_keys(e: Emitted) -> set[str]:
    return dotted_keys(yaml.safe_load(e.files[TRTLLM_CONFIG]))


TRAINING_ONLY = "training-only (a serving plan rejects it)"


def serving_format(name: str, emit: Callable[[Context], Emitted], parse: Callable[[Emitted], ServingPlan],
                   maps: dict[str, tuple[str, ...]], refuses: dict[str, str],
                   keys: Callable[[Emitted], set[str]] = lambda e: set()) -> Format:
    training = {k: TRAINING_ONLY for k in ("cp", "vpp", "mbs", "zero", "recompute", "sp", "stage_layers",
                                           "stage_recompute", "stage_systems")}
    return Format(name=name, kind="serving", emit=emit, parse=parse, maps=maps, refuses={**training, **refuses},
                  config_keys=keys)


CAP = "max_num_seqs other than batch: one server cap carries both"
VLLM = serving_format("vllm", vllm_emit, vllm_parse, keys=vllm_keys, maps={
    "dp": ("--data-parallel-size",), "tp": ("--tensor-parallel-size",), "pp": ("--pipeline-parallel-size",),
    "ep": ("--enable-expert-parallel",), "batch": ("--max-num-seqs",), "max_num_seqs": ("--max-num-seqs",),
    "precision": ("--dtype", "--quantization"), "prefill_replicas": ("--kv-transfer-config", "kv_role"),
    "system": ("--data-parallel-size-local", "--distributed-executor-backend"),
}, refuses={"max_num_seqs": CAP, "ep": "ep other than tp*dp (aggregated)"})
SGLANG = serving_format("sglang", sglang_emit, sglang_parse, maps={
    "dp": ("--dp-size",), "tp": ("--tp-size",), "pp": ("--pp-size",), "ep": ("--ep-size",),
    "batch": ("--max-running-requests",), "max_num_seqs": ("--max-running-requests",),
    "precision": ("--dtype", "--quantization"), "prefill_replicas": ("--disaggregation-mode", "--dp-size"),
    "system": ("--nnodes", "--node-rank"),
}, refuses={"max_num_seqs": CAP})
TRTLLM = serving_format("trtllm", trtllm_emit, trtllm_parse, keys=trtllm_keys, maps={
    "dp": ("--port",), "tp": ("--tp_size",), "pp": ("--pp_size",), "ep": ("--ep_size",),
    "batch": ("--max_batch_size",), "max_num_seqs": ("--max_batch_size",),
    "precision": ("dtype", "quant_config.quant_algo"), "system": ("--gpus_per_node",),
}, refuses={"max_num_seqs": CAP, "prefill_replicas": "prefill_replicas > 0: no disaggregated cluster file"})
