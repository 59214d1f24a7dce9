"""Start-up conformance of the serving formats: a checker per start-up rule.

The rules are data (``madmax_opt/data/flags/startup-serving.yaml``, read and cited by launch/rules.py).
``serving_violations(emitted)`` reads an emitted deployment the way the servers and launchers would (every
command's flags, environment and node) and lists the rules it breaks; tests run it on every emitted configuration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from madmax_opt.launch.common import Emitted, parse_flags


@dataclass(frozen=True)
class Started:
    """One command of a deployment as its program reads it."""

    program: str
    role: str
    argv_model: str  # the program's positional model argument (vllm serve MODEL, trtllm-serve MODEL)
    node: int
    flags: dict[str, str | bool]
    launcher: dict[str, str | bool]
    env: dict[str, str]

    def num(self, flag: str, default: int = 1) -> int:
        v = self.flags.get(flag)
        return default if v is None or isinstance(v, bool) else int(v)

    def host_of(self, nodes: int) -> str:
        """The address of the node running it, as the script names it."""
        return "127.0.0.1" if nodes == 1 else f"${{NODE_IP_{self.node}}}"

    def on(self, flag: str) -> bool:
        return self.flags.get(flag) is True

    @property
    def devices(self) -> list[int]:
        return [int(x) for x in self.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x]


def started(e: Emitted) -> list[Started]:
    return [Started(program=" ".join(c.program[:2]), role=c.role, argv_model=c.program[-1], node=c.node,
                    flags=parse_flags(c.args),
                    launcher=parse_flags(c.launcher[1:]), env=dict(c.env)) for c in e.commands]


Check = Callable[[Emitted, list[Started]], bool]

# the quantization method a catalog checkpoint's config.json declares, by its native precision (None: unquantized)
CHECKPOINT_METHOD = {"fp8": "fp8", "mxfp4": "mxfp4", "nvfp4": "modelopt"}
ONLINE = ("fp8",)  # methods vLLM and SGLang apply to unquantized weights at load (no quantization config needed)
SGLANG_COMPATIBLE = {("modelopt_fp4", "fp8")}  # model_config.py line 2046: MoE experts of an FP8 checkpoint requantized
CHECKPOINT_RULES = {"vllm": "vllm.checkpoint-quantization", "sglang": "sglang.checkpoint-quantization"}
CONTEXT_RULES = {"vllm": "vllm.max-model-len", "sglang": "sglang.context-length"}
CONTEXT_NOTE_RULE = "trtllm.max-seq-len"  # TensorRT-LLM accepts a longer max_seq_len with a warning: a note


def within_context(e: Emitted, length: str | bool | None) -> bool:
    """The server's longest sequence (its --max-model-len / --context-length) fits the checkpoint's context, where
    that is known (``Emitted.checkpoint_context``)."""
    return e.checkpoint_context is None or length is None or isinstance(length, bool) or \
        int(length) <= e.checkpoint_context


def loads(fmt: str, method: str | None, wanted: str | None) -> bool:
    """Whether ``--quantization wanted`` loads a checkpoint declaring ``method`` (None: unquantized)."""
    if method is None:
        return wanted is None or wanted in ONLINE
    return wanted in (None, method) or (fmt == "sglang" and (wanted, method) in SGLANG_COMPATIBLE)


def checkpoint_loads(fmt: str, native: str | None, quantization: str | bool | None) -> bool:
    """The rule on a checkpoint whose dtype is known (``Emitted.checkpoint_precision``, the priced model's
    native_precision); other weights are the user's to match."""
    if native is None:
        return True
    return loads(fmt, CHECKPOINT_METHOD.get(native), quantization if isinstance(quantization, str) else None)


def _disjoint(gpus: list[tuple[int, list[int]]]) -> bool:
    """No GPU of a node claimed twice."""
    counts = Counter((node, g) for node, ids in gpus for g in ids)
    return all(n == 1 for n in counts.values())


def _vllm_checks() -> dict[str, Check]:
    def serves(cmds: list[Started]) -> list[Started]:
        return [c for c in cmds if c.program.startswith("vllm serve")]

    def local(c: Started) -> int:
        return c.num("--data-parallel-size-local", c.num("--data-parallel-size"))

    def multi_node(c: Started) -> bool:
        return local(c) < c.num("--data-parallel-size") and c.flags.get("--data-parallel-backend") != "ray"

    def devices(e: Emitted, cmds: list[Started]) -> bool:
        """Each node's ranks find local x world visible devices (all of the node's without CUDA_VISIBLE_DEVICES),
        and no device is used by two servers."""
        mp = [c for c in serves(cmds) if c.flags.get("--distributed-executor-backend") != "ray"]
        used = []
        for c in mp:
            visible = c.devices or list(range(e.gpus_per_node))
            need = local(c) * c.num("--tensor-parallel-size") * c.num("--pipeline-parallel-size")
            if need > len(visible) or max(visible) >= e.gpus_per_node:
                return False
            used.append((c.node, visible[:need]))
        return _disjoint(used)

    def nixl(e: Emitted, cmds: list[Started]) -> bool:
        ports: list[tuple[int, list[int]]] = []
        for c in serves(cmds):
            if "--kv-transfer-config" not in c.flags:
                continue
            if e.nodes > 1 and c.env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost") == "localhost":
                return False
            base, tp, first = int(c.env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", 5557)), c.num("--tensor-parallel-size"), \
                c.num("--data-parallel-start-rank", 0)
            ports.append((c.node, [base + rank * tp + t for rank in range(first, first + local(c)) for t in range(tp)]))
        return _disjoint(ports)

    return {
        "vllm.dp-local": lambda e, cmds: all(local(c) <= c.num("--data-parallel-size") for c in serves(cmds)),
        "vllm.headless-local": lambda e, cmds: all(local(c) > 0 for c in serves(cmds) if c.on("--headless")),
        "vllm.secondary-headless": lambda e, cmds: all(c.on("--headless") for c in serves(cmds)
                                                       if c.num("--data-parallel-start-rank", 0) > 0),
        "vllm.dp-address": lambda e, cmds: all("--data-parallel-address" in c.flags and "--data-parallel-rpc-port"
                                               in c.flags for c in serves(cmds) if multi_node(c)),
        "vllm.ray-across-nodes": lambda e, cmds: all(
            c.flags.get("--distributed-executor-backend") == "ray" for c in serves(cmds)
            if c.num("--tensor-parallel-size") * c.num("--pipeline-parallel-size") > e.gpus_per_node),
        "vllm.dp-devices": devices,
        "vllm.nixl-side-channel": nixl,
        "vllm.checkpoint-quantization": lambda e, cmds: all(
            checkpoint_loads("vllm", e.checkpoint_precision, c.flags.get("--quantization")) for c in serves(cmds)),
        "vllm.max-model-len": lambda e, cmds: all(within_context(e, c.flags.get("--max-model-len"))
                                                  for c in serves(cmds)),
    }


def _sglang_checks() -> dict[str, Check]:
    def servers(cmds: list[Started]) -> list[Started]:
        return [c for c in cmds if c.program == "python -m" and "--tp-size" in c.flags]

    def per_node(c: Started) -> int:
        return c.num("--tp-size") * c.num("--pp-size") // c.num("--nnodes")

    def node_ranks(e: Emitted, cmds: list[Started]) -> bool:
        groups: dict[str, list[int]] = {}
        for c in servers(cmds):
            if c.num("--nnodes") > 1:
                groups.setdefault(str(c.flags.get("--dist-init-addr")), []).append(c.num("--node-rank", 0))
        by_addr = {str(c.flags.get("--dist-init-addr")): c.num("--nnodes") for c in servers(cmds)}
        return all(sorted(ranks) == list(range(by_addr[a])) for a, ranks in groups.items())

    def bootstrap(e: Emitted, cmds: list[Started]) -> bool:
        ports = [(c.node, c.num("--disaggregation-bootstrap-port", 8998)) for c in servers(cmds)
                 if c.flags.get("--disaggregation-mode") == "prefill"]
        return len(ports) == len(set(ports))

    def gpus(e: Emitted, cmds: list[Started]) -> bool:
        claimed = [(c.node, list(range(c.num("--base-gpu-id", 0), c.num("--base-gpu-id", 0) + per_node(c))))
                   for c in servers(cmds)]
        return all(c.num("--base-gpu-id", 0) >= 0 and c.num("--base-gpu-id", 0) + per_node(c) <= e.gpus_per_node
                   for c in servers(cmds)) and _disjoint(claimed)

    return {
        "sglang.tp-nodes": lambda e, cmds: all(c.num("--tp-size") * c.num("--pp-size") % c.num("--nnodes") == 0
                                               for c in servers(cmds)),
        "sglang.dp-single-node": lambda e, cmds: all(c.num("--dp-size") == 1 or c.num("--nnodes") == 1
                                                     for c in servers(cmds)),
        "sglang.dp-with-attn-dp": lambda e, cmds: all(c.num("--dp-size") == 1 or c.num("--attn-dp-size") == 1
                                                      for c in servers(cmds)),
        "sglang.attn-dp-divides-tp": lambda e, cmds: all(c.num("--tp-size") % c.num("--attn-dp-size") == 0
                                                         for c in servers(cmds)),
        "sglang.requests-per-attn-dp": lambda e, cmds: all(
            c.num("--max-running-requests") % c.num("--attn-dp-size") == 0 for c in servers(cmds)),
        "sglang.base-gpu-id": gpus,
        "sglang.dist-init-addr": lambda e, cmds: all("--dist-init-addr" in c.flags for c in servers(cmds)
                                                     if c.num("--nnodes") > 1),
        "sglang.node-ranks": node_ranks,
        "sglang.bootstrap-port": bootstrap,
        "sglang.checkpoint-quantization": lambda e, cmds: all(
            checkpoint_loads("sglang", e.checkpoint_precision, c.flags.get("--quantization"))
            for c in servers(cmds)),
        "sglang.context-length": lambda e, cmds: all(within_context(e, c.flags.get("--context-length"))
                                                     for c in servers(cmds)),
    }


def _trtllm_checks() -> dict[str, Check]:
    def mpi_world(e: Emitted, cmds: list[Started]) -> bool:
        for c in cmds:
            world = c.num("--tp_size") * c.num("--pp_size")
            if world <= e.gpus_per_node and "-np" not in c.launcher:
                continue
            slots = sum(int(h.rsplit(":", 1)[1]) for h in str(c.launcher.get("-H", "")).split(",") if ":" in h)
            if not (c.program == "trtllm-llmapi-launch trtllm-serve" and str(c.launcher.get("-np")) == str(world)
                    and slots == world):
                return False
        return True

    def moe_world(e: Emitted, cmds: list[Started]) -> bool:
        return all(c.num("--tp_size") % c.num("--ep_size") == 0 for c in cmds)

    def disagg_instances(e: Emitted, cmds: list[Started]) -> bool:
        if "disagg.yaml" not in e.files:
            return not any(c.flags.get("--backend") == "pytorch" and "cache_transceiver_config" in
                           e.files.get(str(c.flags.get("--extra_llm_api_options")), "") for c in cmds)
        config = yaml.safe_load(e.files["disagg.yaml"])
        started = {role: [f"{c.host_of(e.nodes)}:{c.num('--port')}" for c in cmds if c.role == role]
                   for role in ("prefill", "decode")}
        return all(len(config[key]["urls"]) == config[key]["num_instances"] and config[key]["urls"] == started[role]
                   for key, role in (("context_servers", "prefill"), ("generation_servers", "decode")))

    def attention_dp(e: Emitted, cmds: list[Started]) -> bool:
        adp = [c for c in cmds if "enable_attention_dp: true" in e.files.get(str(c.flags.get(
            "--extra_llm_api_options")), "")]
        return all(c.num("--ep_size") == c.num("--tp_size") for c in adp)

    def max_seq_len(e: Emitted, cmds: list[Started]) -> bool:
        """Every server's --max_seq_len within the checkpoint's context, or the notes say it is not (naming the
        rule): TensorRT-LLM starts either way, the note tells what it does with the longer length."""
        noted = any(f"rule {CONTEXT_NOTE_RULE}" in n for n in e.notes)
        return noted or all(within_context(e, c.flags.get("--max_seq_len")) for c in cmds)

    return {"trtllm.mpi-world": mpi_world, "trtllm.moe-world": moe_world, "trtllm.disagg-instances": disagg_instances,
            "trtllm.attention-dp": attention_dp, CONTEXT_NOTE_RULE: max_seq_len}


SERVING_CHECKS: dict[str, dict[str, Check]] = {"vllm": _vllm_checks(), "sglang": _sglang_checks(),
                                               "trtllm": _trtllm_checks()}


def serving_violations(e: Emitted) -> list[str]:
    """The start-up rules of ``e``'s framework that ``e`` breaks (ids; empty: it starts)."""
    cmds = started(e)
    return [rule_id for rule_id, check in SERVING_CHECKS[e.format].items() if not check(e, cmds)]
