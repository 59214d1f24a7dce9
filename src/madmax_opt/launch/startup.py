"""Start-up conformance of the training formats: a checker per start-up rule.

The rules are data (``madmax_opt/data/flags/startup-training.yaml``, read and cited by launch/rules.py).
``violations(emitted)`` reads an emitted configuration the way the framework would (flags, environment, override
keys, TOML, JSON) and lists the rules it breaks; emit refuses a plan that would break a ``refuse`` rule with
``rules.rule_refusal``, which names the rule. Also the catalog models' position encodings
(``data/flags/model-positions.yaml``), which every training format must set.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

import tomllib
import yaml
from pydantic import Field

from madmax_opt.launch.common import Emitted, dotted_items, key_values, parse_flags, refuse
from madmax_opt.model.spec import Strict, TransformerModel

# ------------------------------------------------------------------------------------------ position encodings


class Scaling(Strict):
    type: Literal["llama3", "yarn"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int


class Positions(Strict):
    """How a model encodes positions: learned absolute embeddings, or rotary (base, rotated fraction, scaling)."""

    kind: Literal["rope", "learned"]
    rope_theta: int = 10000
    rotary_percent: float = 1.0
    scaling: Scaling | None = None
    unsupported: str | None = Field(None, description="a position scheme no training format here expresses")
    context: int | None = Field(None, gt=0, description="the checkpoint's max_position_embeddings (serving: the "
                                "longest sequence the server accepts without scaling)")
    source: str = "framework default"


DEFAULT_ROPE = Positions(kind="rope", source="not in data/flags/model-positions.yaml: RoPE base 10000, unscaled")


@cache
def position_table() -> dict[str, Positions]:
    text = resources.files("madmax_opt").joinpath("data/flags/model-positions.yaml").read_text(encoding="utf-8")
    return {k: Positions.model_validate(v) for k, v in yaml.safe_load(text).items()}


def positions_of(m: TransformerModel) -> Positions:
    """The catalog model's position encoding; a model outside the table (inline) is taken as RoPE base 10000."""
    return position_table().get(m.name, DEFAULT_ROPE)


def check_positions(fmt: str, m: TransformerModel, scalings: tuple[str, ...]) -> Positions:
    """The model's position encoding, or a refusal when ``fmt`` cannot set it (an unsupported scheme, or a RoPE
    scaling outside ``scalings``)."""
    pos = positions_of(m)
    if pos.unsupported is not None:
        raise refuse(fmt, f"model {m.name} ({pos.unsupported})", "this position scheme is not emitted", field="model")
    if pos.scaling is not None and pos.scaling.type not in scalings:
        allowed = ", ".join(scalings) or "none"
        raise refuse(fmt, f"model {m.name} ({pos.scaling.type} RoPE scaling)", f"{fmt} is emitted with RoPE "
                     f"scaling {allowed} only", field="model")
    return pos


# ------------------------------------------------------------------------------------------------- checkers


@dataclass(frozen=True)
class Launched:
    """An emitted configuration as the framework reads it: world size, environment, flags / keys -> values."""

    world: int
    env: Mapping[str, str]
    values: Mapping[str, Any]
    flavor: Mapping[str, Any]

    def num(self, key: str, default: int = 1) -> int:
        v = self.values.get(key)
        return default if v is None or isinstance(v, bool) or v == "null" else int(v)

    def on(self, key: str) -> bool:
        return self.values.get(key) in (True, "true")


def launcher_world(launcher: Sequence[str]) -> int:
    """The ranks a launcher starts: nodes x processes per node (torchrun's --nnodes x --nproc-per-node, the
    deepspeed launcher's --num_nodes x --num_gpus)."""
    f = parse_flags([t for t in launcher[1:] if t != "-m"])
    nodes = f.get("--nnodes", f.get("--num_nodes", "1"))
    per = f.get("--nproc-per-node", f.get("--num_gpus", "1"))
    return int(str(nodes)) * int(str(per))


def launched(e: Emitted) -> Launched:
    """Read ``e`` as its framework does: Megatron / Megatron-DeepSpeed flags (with the DeepSpeed JSON), Bridge
    overrides, torchtitan's TOML (with the flavor file's TransformerModelArgs)."""
    (cmd,) = [c for c in e.commands if c.role == "run"] or e.commands[:1]
    values: dict[str, Any] = {}
    if e.format == "nemo":  # --recipe R --mode M, then KEY=VALUE overrides
        values = {**parse_flags([a for a in cmd.args if a.startswith("--") or "=" not in a]),
                  **key_values(cmd.args)}
    elif e.format == "torchtitan":
        values = dotted_items(tomllib.loads(e.files["job.toml"]))
    else:
        values = dict(parse_flags(cmd.args))
        if e.format == "deepspeed":
            values |= {f"json:{k}": v for k, v in dotted_items(json.loads(e.files["ds_config.json"])).items()}
    flavor = {}
    for text in (v for k, v in e.files.items() if k.endswith(".py")):
        flavor = {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+(?:e[+-]?\d+)?)", text)}
    return Launched(world=launcher_world(cmd.launcher), env=cmd.env, values=values, flavor=flavor)


Check = Callable[[Launched], bool]


def _mg_dp(x: Launched, tp: str, pp: str, cp: str) -> int:
    return x.world // (x.num(tp) * x.num(pp) * x.num(cp))


def _megatron_checks() -> dict[str, Check]:
    tp, pp, cp = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"
    fsdp = "--use-megatron-fsdp"

    def layers_per_stage(x: Launched) -> bool:
        uneven = any(k in x.values for k in ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
                                              "--decoder-last-pipeline-num-layers"))
        return uneven or x.num("--num-layers") % x.num(pp) == 0

    def layers_per_chunk(x: Launched) -> bool:
        chunk = x.num("--num-layers-per-virtual-pipeline-stage", 0)
        return chunk == 0 or (x.num("--num-layers") // x.num(pp)) % chunk == 0

    return {
        "megatron.fsdp-ckpt-format": lambda x: not x.on(fsdp) or x.values.get("--ckpt-format") == "fsdp_dtensor",
        "megatron.fsdp-max-connections": lambda x: not x.on(fsdp) or x.env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
        "megatron.tp-cp-max-connections": lambda x: x.on(fsdp) or (x.num(tp) == 1 and x.num(cp) == 1)
        or x.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
        "megatron.interleaved-pp": lambda x: "--num-layers-per-virtual-pipeline-stage" not in x.values
        or x.num(pp) > (2 if x.on("--no-overlap-p2p-communication") else 1),
        "megatron.layers-per-stage": layers_per_stage,
        "megatron.layers-per-chunk": layers_per_chunk,
        "megatron.overlap-param-gather": lambda x: not x.on("--overlap-param-gather") or (
            (x.on("--use-distributed-optimizer") or x.on(fsdp)) and x.on("--overlap-grad-reduce")),
        "megatron.fp8-param-gather": lambda x: not x.on("--fp8-param-gather") or x.on("--use-distributed-optimizer")
        or x.on(fsdp),
        "megatron.precision-aware-optimizer": lambda x: not x.on("--use-precision-aware-optimizer")
        or x.on("--use-distributed-optimizer") or x.on(fsdp),
        "megatron.cp-seq-length": lambda x: x.num(cp) == 1 or x.num("--seq-length") % (2 * x.num(cp)) == 0,
        "megatron.tp-comm-overlap-sp": lambda x: not x.on("--tp-comm-overlap") or (
            x.on("--sequence-parallel") and x.num(tp) > 1),
        "megatron.heads-tp": lambda x: x.num("--num-attention-heads") % x.num(tp) == 0,
        "megatron.query-groups-tp": lambda x: _groups_ok(x.num("--num-query-groups", x.num("--num-attention-heads")),
                                                         x.num(tp)),
        "megatron.ep-needs-experts": lambda x: x.num("--expert-model-parallel-size") == 1 or "--num-experts" in x.values,
        "megatron.experts-ep": lambda x: x.num("--num-experts") % x.num("--expert-model-parallel-size") == 0,
        "megatron.moe-bias-etp": lambda x: "--num-experts" not in x.values or x.on("--disable-bias-linear")
        or x.num("--expert-tensor-parallel-size", x.num(tp)) == 1,
        "megatron.expert-grid": lambda x: x.world % (x.num(tp) * x.num("--expert-model-parallel-size") * x.num(pp))
        == 0,
        "megatron.global-batch": lambda x: x.num("--global-batch-size") % (
            x.num("--micro-batch-size") * _mg_dp(x, tp, pp, cp)) == 0,
    }


def _groups_ok(groups: int, tp: int) -> bool:
    return groups % tp == 0 or tp % groups == 0


# Megatron-Core GPTModelConfig's own fields (megatron/training/models/gpt.py @ 2a75ac1, lines 155-187, and the
# ModelConfig base, models/base.py): everything else of a builder-backed model lives under model.transformer.
GPT_MODEL_CONFIG_FIELDS = frozenset({
    "transformer", "transformer_layer_spec", "vocab_size", "make_vocab_size_divisible_by", "should_pad_vocab",
    "seq_length", "fp16_lm_cross_entropy", "logit_dtype", "parallel_output", "share_embeddings_and_output_weights",
    "position_embedding_type", "rotary_percent", "rotary_base", "rope_scaling", "rope_scaling_factor",
    "scatter_embedding_sequence_parallel", "seq_len_interpolation_factor", "tp_comm_overlap_cfg",
    "use_arbitrary_attention_mask", "restore_modelopt_state", "extra_checkpoint_metadata",
})
BUILDER_RECIPE = re.compile(r"llama3")  # recipes whose model is AutoBridge.get_model_config() (builder-backed)


def _nemo_checks(recipe: Callable[[Launched], str]) -> dict[str, Check]:
    def field(x: Launched, name: str) -> str | None:
        v = x.values.get(f"model.transformer.{name}", x.values.get(f"model.{name}"))
        return None if v is None else str(v)

    def num(x: Launched, name: str, default: int = 1) -> int:
        v = field(x, name)
        return default if v in (None, "null") else int(str(v))

    def nesting(x: Launched) -> bool:
        flat = {k.split(".")[1] for k in x.values if k.startswith("model.") and not k.startswith("model.transformer.")}
        nested = any(k.startswith("model.transformer.") for k in x.values)
        if BUILDER_RECIPE.search(recipe(x)):
            return flat <= GPT_MODEL_CONFIG_FIELDS
        return not nested

    def dp(x: Launched) -> int:
        return x.world // (num(x, "tensor_model_parallel_size") * num(x, "pipeline_model_parallel_size")
                           * num(x, "context_parallel_size"))

    def comm_overlap(x: Launched) -> bool:
        if "comm_overlap.tp_comm_overlap" not in x.values:
            return False
        return x.values["comm_overlap.tp_comm_overlap"] != "true" or (
            num(x, "tensor_model_parallel_size") > 1 and field(x, "sequence_parallel") == "true")

    return {
        "nemo.builder-nesting": nesting,
        "nemo.recipe-vpp": lambda x: field(x, "virtual_pipeline_model_parallel_size") is not None,
        "nemo.bias-gelu-fusion": lambda x: field(x, "gated_linear_unit") == "true"
        or field(x, "add_bias_linear") != "false" or field(x, "bias_activation_fusion") == "false",
        "nemo.sp-needs-tp": lambda x: field(x, "sequence_parallel") != "true" or num(x, "tensor_model_parallel_size") > 1,
        "nemo.fsdp-ckpt-format": lambda x: x.values.get("ddp.use_megatron_fsdp") != "true"
        or x.values.get("checkpoint.ckpt_format") == "fsdp_dtensor",
        "nemo.recipe-comm-overlap": comm_overlap,
        "nemo.defer-wgrad-pp": lambda x: num(x, "pipeline_model_parallel_size") > 1
        or x.values.get("comm_overlap.defer_embedding_wgrad_compute") == "false",
        "nemo.precision-aware-optimizer": lambda x: x.values.get("optimizer.use_precision_aware_optimizer") != "true"
        or x.values.get("ddp.use_distributed_optimizer") == "true",
        "nemo.heads-tp": lambda x: num(x, "num_attention_heads") % num(x, "tensor_model_parallel_size") == 0,
        "nemo.query-groups-tp": lambda x: _groups_ok(num(x, "num_query_groups"), num(x, "tensor_model_parallel_size")),
        "nemo.experts-ep": lambda x: num(x, "num_moe_experts", 0) % num(x, "expert_model_parallel_size") == 0,
        "nemo.moe-bias-etp": lambda x: num(x, "num_moe_experts", 0) == 0 or field(x, "add_bias_linear") == "false"
        or num(x, "expert_tensor_parallel_size", num(x, "tensor_model_parallel_size")) == 1,
        "nemo.expert-grid": lambda x: x.world % (num(x, "tensor_model_parallel_size") * num(
            x, "expert_model_parallel_size") * num(x, "pipeline_model_parallel_size")) == 0,
        "nemo.global-batch": lambda x: x.num("train.global_batch_size") % (x.num("train.micro_batch_size") * dp(x))
        == 0,
    }


def _titan_checks() -> dict[str, Check]:
    p = "parallelism."

    def virtual_stages(x: Launched) -> int:
        per_stage = x.num(p + "pipeline_parallel_layers_per_stage", 0)
        first, last = x.num(p + "pipeline_parallel_first_stage_less_layers"), x.num(
            p + "pipeline_parallel_last_stage_less_layers")
        return math.ceil((int(x.flavor["n_layers"]) + first + last) / per_stage) if per_stage else 0

    def stages_ok(x: Launched) -> bool:
        if x.num(p + "pipeline_parallel_degree") == 1 or not virtual_stages(x):
            return True
        per_rank = virtual_stages(x) // x.num(p + "pipeline_parallel_degree")
        single = x.values.get(p + "pipeline_parallel_schedule") in ("1F1B", "GPipe")
        return per_rank == 1 if single else per_rank >= 2

    def dp(x: Launched) -> int:
        return x.num(p + "data_parallel_replicate_degree") * x.num(p + "data_parallel_shard_degree")

    return {
        "torchtitan.virtual-stages": lambda x: virtual_stages(x) % x.num(p + "pipeline_parallel_degree") == 0,
        "torchtitan.stages-per-rank": stages_ok,
        "torchtitan.microbatch": lambda x: x.num(p + "pipeline_parallel_degree") == 1
        or x.num("training.local_batch_size") % x.num(p + "pipeline_parallel_microbatch_size") == 0,
        "torchtitan.global-batch": lambda x: x.num("training.global_batch_size") % (
            x.num("training.local_batch_size") * dp(x)) == 0,
        "torchtitan.ddp-1d": lambda x: x.num(p + "data_parallel_shard_degree") > 1
        or x.num(p + "data_parallel_replicate_degree") in (1, x.world),
        "torchtitan.heads-tp": lambda x: all(int(x.flavor[k]) % x.num(p + "tensor_parallel_degree") == 0
                                             for k in ("n_heads", "n_kv_heads")),
        "torchtitan.world-size": lambda x: dp(x) * x.num(p + "context_parallel_degree") * x.num(
            p + "tensor_parallel_degree") * x.num(p + "pipeline_parallel_degree") == x.world,
        "torchtitan.seq-divisor": lambda x: x.num("training.seq_len") % (
            x.num(p + "tensor_parallel_degree") * 2 * x.num(p + "context_parallel_degree")) == 0,
    }


def _deepspeed_checks() -> dict[str, Check]:
    def pp(x: Launched) -> int:
        return 1 if x.on("--no-pipeline-parallel") else x.num("--pipeline-model-parallel-size")

    return {
        "deepspeed.pipe-zero": lambda x: pp(x) == 1 or x.num("json:zero_optimization.stage", 0) < 2,
        "deepspeed.moe-zero3": lambda x: "--num-experts" not in x.values or x.num("json:zero_optimization.stage", 0)
        < 3,
        "deepspeed.experts-ep": lambda x: "--num-experts" not in x.values or x.num("--num-experts") % x.num(
            "--moe-expert-parallel-size") == 0,
        "deepspeed.batch": lambda x: x.num("json:train_batch_size") == x.num("json:train_micro_batch_size_per_gpu")
        * x.num("json:gradient_accumulation_steps") * x.world // (x.num("--tensor-model-parallel-size") * pp(x)),
        "deepspeed.heads-tp": lambda x: x.num("--num-attention-heads") % x.num("--tensor-model-parallel-size") == 0
        and x.num("--num-key-value-heads", x.num("--num-attention-heads")) % x.num("--tensor-model-parallel-size")
        == 0,
        "deepspeed.query-groups": lambda x: x.num("--num-attention-heads") % x.num(
            "--num-key-value-heads", x.num("--num-attention-heads")) == 0,
        "deepspeed.sp-max-connections": lambda x: not x.on("--sequence-parallel")
        or x.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
    }


def _recipe(x: Launched) -> str:
    return str(x.values.get("--recipe", ""))


CHECKS: dict[str, dict[str, Check]] = {
    "megatron": _megatron_checks(), "nemo": _nemo_checks(_recipe), "torchtitan": _titan_checks(),
    "deepspeed": _deepspeed_checks(),
}


def violations(e: Emitted) -> list[str]:
    """The start-up rules of ``e``'s framework that ``e`` breaks (ids; empty: it starts)."""
    x = launched(e)
    return [rule_id for rule_id, check in CHECKS[e.format].items() if not check(x)]
