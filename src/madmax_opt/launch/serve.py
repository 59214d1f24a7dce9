"""Serve commands: vLLM and SGLang, and what every serving format shares (TensorRT-LLM: launch/trtllm.py).

A serving plan is dp replicas of tp x pp GPUs, each running up to ``batch`` sequences, at a weight precision; with
prefill_replicas > 0 those replicas only prefill and send the KV cache to the rest (disaggregation). The batch is
the server's cap on running sequences per replica (vLLM --max-num-seqs per data-parallel engine, SGLang
--max-running-requests split over attention-DP ranks, TRT-LLM --max_batch_size), and so is max_num_seqs (online
plans carry only that): parsed back, the cap is the plan's batch. A plan whose max_num_seqs differs from its batch is
refused. The KV-cache precision comes from the task. With expert parallelism (ep = k x tp, MoE) each group of k
replicas is one server: vLLM --enable-expert-parallel over its data-parallel ranks, SGLang --tp-size ep
--attn-dp-size k --ep-size ep.

Launch: replicas are placed on the nodes in order (a replica of at most a node's GPUs never straddles two nodes;
a larger one takes whole nodes), every server gets its GPUs (CUDA_VISIBLE_DEVICES, SGLang --base-gpu-id), starts in
the background and is polled on /health; a router goes in front where the framework has one (vLLM's data-parallel
API server balances its own ranks; the SGLang router; none for TensorRT-LLM's aggregated replicas). The start-up
rules each configuration must meet are data (data/flags/startup-serving.yaml, checked by launch/serving_rules.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from madmax_opt.launch.common import (
    Command,
    Context,
    Emitted,
    Format,
    dotted_items,
    flag_args,
    integer,
    node_layout,
    parse_flags,
    precision_of,
    refuse,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.rules import cite, rule_refusal
from madmax_opt.launch.serving_rules import (
    CHECKPOINT_METHOD,
    CHECKPOINT_RULES,
    CONTEXT_NOTE_RULE,
    CONTEXT_RULES,
    loads,
)
from madmax_opt.launch.startup import positions_of
from madmax_opt.model.family_name import serving_task
from madmax_opt.model.inference import DEFAULT_KV_PRECISION
from madmax_opt.model.spec import TransformerModel
from madmax_opt.search.serving_space import TRAINING_KNOBS, ServingPlan

# weight precision -> (dtype, quantization) per framework; int8 / int4 / fp4 need a pre-quantized checkpoint
VLLM_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8"),
                "int8": ("bfloat16", "compressed-tensors"), "int4": ("float16", "awq"),
                "fp4": ("bfloat16", "modelopt_fp4")}
SGLANG_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8"),
                  "int8": ("bfloat16", "w8a8_int8"), "int4": ("float16", "awq"), "fp4": ("bfloat16", "modelopt_fp4")}
VLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8"}
SGLANG_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3"}
PREQUANTIZED = "int8, int4 and fp4 weights load from a pre-quantized checkpoint: the checkpoint must hold them"
REQUANTIZED = "SGLang requantizes the FP8 checkpoint's MoE experts to NVFP4 at load (modelopt_fp4)"
HEALTH = "/health"  # vLLM, SGLang and trtllm-serve all answer GET /health once the model is loaded
VLLM_PORT, SGLANG_PORT, ROUTER_PORT = 8000, 30001, 30000
VLLM_RPC_PORT, SGLANG_DIST_PORT, SGLANG_BOOTSTRAP_PORT = 13345, 5000, 8998
NIXL_PORT = 5557  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py line 159, v0.11.0)


class Serving:
    """What every serve command needs from a serving plan and its task."""

    def __init__(self, ctx: Context, fmt: str, weights: Mapping[str, tuple[str, str | None]],
                 kv: Mapping[str, str | None]) -> None:
        task, p = serving_task(ctx.problem.task), ctx.plan
        if task is None or not isinstance(p, ServingPlan):
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
        if fmt in CHECKPOINT_RULES and ctx.checkpoint is None:
            self.quantization = checkpoint_quantization(fmt, ctx.model, self.precision, self.quantization)
        self.kv = kv[kv_precision]
        self.max_len = max(r.prompt_len + r.output_len for r in task.requests())
        m = ctx.model
        self.context = positions_of(m).context if m.hf_id is not None and ctx.checkpoint in (None, m.hf_id) else None
        if fmt in CONTEXT_RULES and self.context is not None and self.max_len > self.context:
            raise rule_refusal(fmt, f"requests of {self.max_len} tokens (prompt + output) on {m.hf_id}, whose context "
                               f"is {self.context}", CONTEXT_RULES[fmt], field="task")
        self.groups = [("prefill", p.prefill_replicas), ("decode", p.dp - p.prefill_replicas)] \
            if p.prefill_replicas else [("run", p.dp)]
        self.replica_gpus = p.tp * p.pp
        self.checkpoint = ctx.checkpoint or ctx.model.hf_id or ctx.model.name

    def emitted(self, fmt: str, commands: list[Command], nodes: int, files: dict[str, str] | None = None,
                notes: list[str] | None = None) -> Emitted:
        fs, p, gpn = flagset(fmt), self.plan, self.ctx.gpus_per_node
        gpus = p.dp * self.replica_gpus
        m = self.ctx.model
        if self.ctx.checkpoint is None and m.hf_id is None:
            notes = [f"no checkpoint: model {m.name} has no hf_id (an inline model); pass --checkpoint PATH_OR_HUB_ID",
                     *(notes or [])]
        if self.task.arrival_rate is not None:
            notes = [*(notes or []), f"online load: Poisson arrivals at {self.task.arrival_rate:g} requests/s over "
                     "the deployment"]
        if fmt == "sglang" and self.quantization == "modelopt_fp4" and m.native_precision == "fp8" and \
                self.ctx.checkpoint is None:
            notes = [*(notes or []), REQUANTIZED]
        elif fmt != "trtllm" and self.precision in ("int8", "int4", "fp4") and (
                self.ctx.checkpoint is not None or m.hf_id is None):  # a catalog checkpoint was checked above
            notes = [*(notes or []), PREQUANTIZED]
        if fmt == "trtllm" and self.context is not None and self.max_len > self.context:
            notes = [*(notes or []), context_note(self.max_len, self.context, str(m.hf_id))]
        return Emitted(format=fmt, framework=fs.framework, version=fs.version, kind="serving",
                       system=self.ctx.option.system.name, gpus=gpus, nodes=nodes, gpus_per_node=min(gpus, gpn),
                       commands=commands, files=files or {}, notes=notes or [],
                       checkpoint_precision=self.ctx.checkpoint_precision, checkpoint_context=self.context)


def context_note(max_len: int, context: int, checkpoint: str) -> str:
    """TensorRT-LLM's answer to a --max_seq_len above the checkpoint's context: accepted with a warning."""
    return (f"--max_seq_len {max_len} is above {checkpoint}'s context of {context} tokens and TensorRT-LLM starts "
            f"anyway - {cite(CONTEXT_NOTE_RULE)}")


def precision_from(weights: Mapping[str, tuple[str, str | None]], dtype: str, quantization: str | None) -> str:
    if quantization == "mxfp4":  # a checkpoint's own MXFP4 (gpt-oss): priced as fp4
        return "fp4"
    return next(k for k, (d, q) in weights.items() if q == quantization and (q is not None or d == dtype))


def checkpoint_quantization(fmt: str, model: TransformerModel, precision: str, wanted: str | None) -> str | None:
    """The --quantization that loads the catalog checkpoint at the priced precision, or a refusal naming the rule:
    a quantized checkpoint takes its own method (SGLang also modelopt_fp4 on FP8), an unquantized one only online
    methods (fp8); weights above that need --checkpoint with pre-quantized weights."""
    if model.hf_id is None:
        return wanted
    method = CHECKPOINT_METHOD.get(model.native_precision or "")
    if method == "mxfp4" and precision == "fp4":
        return "mxfp4"
    if loads(fmt, method, wanted) and not (method is not None and wanted is None):
        return wanted
    ships = f"its weights ship in {model.native_precision}" if method else "its weights are not quantized"
    if method is not None and wanted is None:  # starts, but runs the checkpoint's own quantization
        ships += f", which the server would load as {method} instead of the priced {precision}"
    raise refuse(fmt, f"precision {precision} from {model.hf_id}", f"{ships}; {cite(CHECKPOINT_RULES[fmt])}; "
                 "allowed: a precision the checkpoint loads at, or --checkpoint with weights at this precision",
                 field="precision")


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


# ------------------------------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class Part:
    """The GPUs one server (or one replica) uses on one node."""

    node: int
    gpus: tuple[int, ...]

    @property
    def devices(self) -> str:
        return ",".join(map(str, self.gpus))


class Placer:
    """Hands out GPUs node by node: ``n`` GPUs within one node (the next node when they do not fit in what is left
    of this one), or, above a node, whole nodes."""

    def __init__(self, fmt: str, gpus_per_node: int) -> None:
        self.fmt, self.gpn, self.node, self.gpu = fmt, gpus_per_node, 0, 0

    def take(self, n: int) -> list[Part]:
        if n <= self.gpn:
            if self.gpu + n > self.gpn:
                self.node, self.gpu = self.node + 1, 0
            part = Part(self.node, tuple(range(self.gpu, self.gpu + n)))
            self.gpu += n
            return [part]
        nodes, per = node_layout(self.fmt, n, self.gpn)
        if self.gpu:
            self.node, self.gpu = self.node + 1, 0
        parts = [Part(self.node + j, tuple(range(per))) for j in range(nodes)]
        self.node += nodes
        return parts

    @property
    def nodes(self) -> int:
        return self.node + (1 if self.gpu else 0)


def host(node: int, nodes: int) -> str:
    """A node's address in the script: localhost on one node, else the NODE_IP_i the script asks for."""
    return "127.0.0.1" if nodes == 1 else f"${{NODE_IP_{node}}}"


def by_node(parts: list[Part]) -> list[Part]:
    """The parts of several replicas merged per node, in node order."""
    merged: dict[int, tuple[int, ...]] = {}
    for part in parts:
        merged[part.node] = merged.get(part.node, ()) + part.gpus
    return [Part(n, g) for n, g in sorted(merged.items())]


# ------------------------------------------------------------------------------------------------------- vLLM


def vllm_emit(ctx: Context) -> Emitted:
    """One ``vllm serve`` per server: its data-parallel ranks (the API server balances them) on CUDA_VISIBLE_DEVICES;
    ranks on other nodes run ``--headless`` from their start rank; a replica above a node runs on Ray."""
    s = Serving(ctx, "vllm", VLLM_WEIGHTS, VLLM_KV)
    p, gpn, r = s.plan, ctx.gpus_per_node, s.replica_gpus
    placer = Placer("vllm", gpn)
    plan_servers = servers("vllm", s)
    placed = [(role, dp, [placer.take(r) for _ in range(dp)]) for role, dp in plan_servers]
    nodes = placer.nodes
    commands, notes = [], []
    side_channel = 0  # NIXL side-channel ports used by the servers before this one
    for i, (role, dp, replicas) in enumerate(placed):
        kv_transfer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill"
                                  else "kv_consumer"}) if role != "run" else None
        common = [("--tensor-parallel-size", p.tp), ("--pipeline-parallel-size", p.pp), ("--data-parallel-size", dp),
                  ("--enable-expert-parallel", p.ep > 1), ("--max-num-seqs", s.cap), ("--max-model-len", s.max_len),
                  ("--dtype", s.dtype), ("--quantization", s.quantization), ("--kv-cache-dtype", s.kv),
                  ("--kv-transfer-config", kv_transfer)]
        port = VLLM_PORT + i
        if r > gpn and kv_transfer:
            raise refuse("vllm", f"prefill_replicas={p.prefill_replicas} with replicas of {r} GPUs over nodes",
                         "NIXL announces one side-channel host per process environment (VLLM_NIXL_SIDE_CHANNEL_HOST, "
                         "rule vllm.nixl-side-channel), which Ray workers on other nodes would share; allowed: "
                         f"replicas of at most {gpn} GPUs with disaggregation", field="prefill_replicas")
        if r > gpn:  # a replica spans nodes: Ray places its ranks
            head = replicas[0][0].node
            args = flag_args([*common, ("--distributed-executor-backend", "ray"),
                              ("--data-parallel-backend", "ray" if dp > 1 else None), ("--port", port)])
            commands.append(Command(program=["vllm", "serve", s.checkpoint], args=args, role=role, node=head,
                                    background=True, ready=f"http://{host(head, nodes)}:{port}{HEALTH}"))
            notes.append(f"{role} server {i}: a replica spans nodes; start a Ray cluster over nodes "
                         f"{', '.join(str(x.node) for rep in replicas for x in rep)} first (ray start)")
            continue
        per_node = by_node([rep[0] for rep in replicas])
        multi = len(per_node) > 1
        start = 0
        for j, part in enumerate(per_node):
            local = len(part.gpus) // r
            args = flag_args([*common, ("--data-parallel-size-local", local if multi else None),
                              ("--data-parallel-start-rank", start if j else None), ("--headless", bool(j)),
                              ("--data-parallel-address", host(per_node[0].node, nodes) if multi else None),
                              ("--data-parallel-rpc-port", VLLM_RPC_PORT + i if multi else None),
                              ("--port", None if j else port)])
            ready = None if j else f"http://{host(part.node, nodes)}:{port}{HEALTH}"
            env = {"CUDA_VISIBLE_DEVICES": part.devices}
            if kv_transfer:  # NIXL listens on base + dp_rank x tp + tp_rank: each server its own base, its own host
                env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_PORT + side_channel)
                if nodes > 1:
                    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host(part.node, nodes)
            commands.append(Command(program=["vllm", "serve", s.checkpoint], args=args, env=env,
                                    role=role if not j else f"{role} ranks {start}+ (headless)",
                                    node=part.node, background=True, ready=ready))
            start += local
        side_channel += dp * p.tp
    if p.prefill_replicas:
        notes.append("prefill and decode servers exchange KV caches through NIXL; put vLLM's disaggregation proxy "
                     f"in front (ports: prefill {VLLM_PORT}.., decode after them)")
    elif len(placed) > 1:
        notes.append(f"{len(placed)} expert-parallel servers on ports {VLLM_PORT}..{VLLM_PORT + len(placed) - 1}: "
                     "balance requests over them")
    return s.emitted("vllm", commands, nodes, notes=notes)


def vllm_parse(e: Emitted) -> ServingPlan:
    flags = [(c.role, parse_flags(c.args)) for c in e.commands if "--headless" not in c.args]
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
    """One server per replica (SGLang refuses --dp-size across nodes), or with expert parallelism one server of ep
    GPUs per EP group with attention data parallel over its k replicas; each on its GPUs (--base-gpu-id), a server
    above a node on every node it spans (--node-rank, --dist-init-addr), the SGLang router in front."""
    s = Serving(ctx, "sglang", SGLANG_WEIGHTS, SGLANG_KV)
    p, gpn, r = s.plan, ctx.gpus_per_node, s.replica_gpus
    placer = Placer("sglang", gpn)
    units = [(role, k) for role, dp in servers("sglang", s) for k in ([dp] if p.ep > 1 else [1] * dp)]
    placed = [(role, k, placer.take(k * r)) for role, k in units]
    nodes = placer.nodes
    commands, urls = [], []
    for i, (role, k, parts) in enumerate(placed):
        port = SGLANG_PORT + i
        head = host(parts[0].node, nodes)
        for j, part in enumerate(parts):
            args = flag_args([
                ("--model-path", s.checkpoint), ("--tp-size", p.tp * k), ("--pp-size", p.pp),
                ("--attn-dp-size", k if k > 1 else None), ("--ep-size", p.ep if p.ep > 1 else None),
                ("--nnodes", len(parts) if len(parts) > 1 else None), ("--node-rank", j if len(parts) > 1 else None),
                ("--dist-init-addr", f"{head}:{SGLANG_DIST_PORT + i}" if len(parts) > 1 else None),
                ("--base-gpu-id", part.gpus[0]),
                ("--max-running-requests", s.cap * k),  # split over the attention-DP ranks: cap per replica
                ("--context-length", s.max_len), ("--dtype", s.dtype), ("--quantization", s.quantization),
                ("--kv-cache-dtype", s.kv), ("--disaggregation-mode", role if role != "run" else None),
                ("--disaggregation-bootstrap-port", SGLANG_BOOTSTRAP_PORT + i if role == "prefill" else None),
                ("--host", "0.0.0.0"), ("--port", port),
            ])
            commands.append(Command(program=["python", "-m", "sglang.launch_server"], args=args, node=part.node,
                                    role=role if not j else f"{role} (node rank {j})", background=True,
                                    ready=None if j else f"http://{head}:{port}{HEALTH}"))
        urls.append((role, f"http://{head}:{port}", SGLANG_BOOTSTRAP_PORT + i))
    if p.prefill_replicas:
        pd: list[tuple[str, object]] = [("--pd-disaggregation", True)]
        pd += [("--prefill", f"{u} {b}") if role == "prefill" else ("--decode", u) for role, u, b in urls]
        router = pd_args(pd)
    else:
        router = ["--worker-urls", *(u for _, u, _ in urls)]
    commands.append(Command(program=["python", "-m", "sglang_router.launch_router"], role="router", args=[
        *router, "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]))
    return s.emitted("sglang", commands, nodes, notes=[f"the SGLang router serves on port {ROUTER_PORT}"])


def pd_args(pairs: list[tuple[str, object]]) -> list[str]:
    """Router arguments of a prefill/decode deployment: --prefill URL BOOTSTRAP_PORT and --decode URL, repeated."""
    out: list[str] = []
    for flag, value in pairs:
        out += [flag] if value is True else [flag, *str(value).split()]
    return out


def sglang_parse(e: Emitted) -> ServingPlan:
    flags = [(c.role, parse_flags(c.args)) for c in e.commands
             if c.program[-1] == "sglang.launch_server" and c.ready is not None]

    def replicas(g: dict[str, str | bool]) -> int:
        return integer(g, "--attn-dp-size")

    f = flags[-1][1]
    q = f.get("--quantization")
    k = replicas(f)
    return ServingPlan(
        dp=sum(replicas(g) for _, g in flags), tp=integer(f, "--tp-size") // k,
        pp=integer(f, "--pp-size"), ep=integer(f, "--ep-size"), batch=integer(f, "--max-running-requests") // k,
        precision=precision_from(SGLANG_WEIGHTS, str(f["--dtype"]), q if isinstance(q, str) else None),
        prefill_replicas=sum(replicas(g) for r, g in flags if r == "prefill"),
    )


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
    "dp": ("--attn-dp-size", "--worker-urls"), "tp": ("--tp-size",), "pp": ("--pp-size",),
    "ep": ("--ep-size", "--attn-dp-size"),
    "batch": ("--max-running-requests",), "max_num_seqs": ("--max-running-requests",),
    "precision": ("--dtype", "--quantization"), "prefill_replicas": ("--disaggregation-mode", "--prefill"),
    "system": ("--nnodes", "--node-rank", "--base-gpu-id"),
}, refuses={"max_num_seqs": CAP, "ep": EP_GROUPS})
