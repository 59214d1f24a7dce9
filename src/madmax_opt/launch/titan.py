"""torchtitan: a TOML job config (v0.2.2) and a flavor file that registers the model's architecture.

Plan -> torchtitan: ZeRO-3 is FSDP2 over dp (reshard after forward), ZeRO-2 FSDP2 without resharding, ZeRO-0 plain
replication (DDP); torchtitan has no optimizer-only sharding (ZeRO-1). Tensor parallelism always shards the sequence
(SP). Interleaving is the Interleaved1F1B schedule with layers per stage; an uneven split lists each stage's modules.
"""

from __future__ import annotations

import json
from typing import Any

import tomllib

from madmax_opt.launch.common import Command, Context, Emitted, Format, dotted_items, refuse
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.megatron import (
    BATCH,
    MIXED,
    STAGE_RECOMPUTE,
    emitted,
    even_layers,
    no_uneven_interleaving,
    torchrun,
    training_checks,
    uniform_recompute,
)
from madmax_opt.launch.rules import rule_refusal
from madmax_opt.launch.startup import check_positions, launcher_world, positions_of
from madmax_opt.model.spec import Plan, TransformerModel

FMT = "torchtitan"
CONFIG = "job.toml"
FLAVOR_MODULE = "madmax_flavor"
RESHARD = {0: "default", 2: "never", 3: "always"}  # ZeRO stage -> parallelism.fsdp_reshard_after_forward
CONVERTER = {"fp8": "quantize.linear.float8", "mxfp8": "quantize.linear.mx"}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)  # ints, strings and (nested) lists of strings are the same in JSON and TOML


def toml_text(sections: dict[str, dict[str, Any]]) -> str:
    out = []
    for name, body in sections.items():
        if body:
            out.append(f"[{name}]")
            out += [f"{k} = {toml_value(v)}" for k, v in body.items() if v is not None]
            out.append("")
    return "\n".join(out)


def llama_ffn(dim: int, multiple_of: int, multiplier: float) -> int:
    """FeedForward width torchtitan's llama3 builds (model.py): int(2*4d/3), times the multiplier, rounded up."""
    hidden = int(multiplier * int(2 * 4 * dim / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def flavor_file(m: TransformerModel, name: str, seq_len: int) -> str:
    """The companion file registering the model as a llama3 flavor: sizes, RoPE base and scaling (torchtitan applies
    RoPEScalingArgs always, default factor 8, models/llama3/model/model.py; factor 1 leaves the frequencies as they
    are)."""
    base = int(2 * 4 * m.hidden / 3)
    multiplier = (m.ffn + 0.5) / base  # int(multiplier * base) == ffn exactly, with multiple_of 1
    assert llama_ffn(m.hidden, 1, multiplier) == m.ffn
    pos = positions_of(m)
    sc = pos.scaling
    scaling = (f"scaling_factor={sc.factor!r}, low_freq_factor={sc.low_freq_factor!r}, high_freq_factor="
               f"{sc.high_freq_factor!r}, original_max_position_embeddings={sc.original_max_position_embeddings}"
               if sc else "scaling_factor=1.0")
    return (
        f'"""Registers the torchtitan llama3 flavor {name!r} ({m.name} from madmax-opt\'s catalog); imported through'
        ' [experimental] custom_import."""\n\n'
        "from torchtitan.models.llama3 import llama3_args\n"
        "from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs\n\n"
        f"llama3_args[{name!r}] = TransformerModelArgs(\n"
        f"    dim={m.hidden}, n_layers={m.layers}, n_heads={m.heads}, n_kv_heads={m.n_kv_heads},\n"
        f"    vocab_size={m.vocab}, multiple_of=1, ffn_dim_multiplier={multiplier!r}, max_seq_len={seq_len},\n"
        f"    rope_theta={pos.rope_theta}, rope_scaling_args=RoPEScalingArgs({scaling}),\n)\n"
    )


def check_model(m: TransformerModel) -> None:
    """torchtitan's llama3 is SwiGLU, RMSNorm, no biases, untied embeddings, dense, full RoPE (Llama-3.1 scaling)."""
    pos = check_positions(FMT, m, ("llama3",))  # RoPEScalingArgs: the Llama-3.1 scaling
    bad = [(m.ffn_kind != "swiglu", f"ffn_kind {m.ffn_kind}"), (m.norm != "rmsnorm", f"norm {m.norm}"),
           (m.bias, "bias"), (m.tied_embeddings, "tied_embeddings"), (m.moe is not None, "a mixture-of-experts MLP"),
           (pos.kind != "rope", "learned positions"), (pos.rotary_percent != 1, "partial RoPE")]
    for is_bad, what in bad:
        if is_bad:
            raise refuse(FMT, f"model {m.name} ({what})", "the llama3 model of torchtitan v0.2.2 is dense SwiGLU + "
                         "RMSNorm without biases or tied embeddings", field="model")


def stage_modules(stage_layers: list[int]) -> list[list[str]]:
    """module_fqns_per_model_part: embeddings with the first stage, norm and output with the last."""
    parts, start = [], 0
    for i, n in enumerate(stage_layers):
        part = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        parts.append((["tok_embeddings"] if i == 0 else []) + part + (["norm", "output"] if i == len(stage_layers)
                                                                     - 1 else []))
    return parts


def titan_emit(ctx: Context) -> Emitted:
    p, m = ctx.plan, ctx.model
    task = training_checks(ctx, FMT)
    no_uneven_interleaving(p, FMT)
    recompute = uniform_recompute(p, FMT)
    check_model(m)
    if p.zero == 1:
        raise refuse(FMT, "zero=1", "FSDP2 shards parameters too, there is no optimizer-only sharding; allowed: "
                     "zero 0 (replicate), 2 (no reshard), 3 (reshard after forward)")
    if p.sp != (p.tp > 1):
        raise refuse(FMT, f"sp={p.sp} with tp={p.tp}", "torchtitan's tensor parallelism always shards the sequence;"
                     " allowed: sp true exactly when tp > 1")
    stack = ctx.problem.stack
    if not stack.flash_attention or stack.dropout:
        raise refuse(FMT, f"stack flash_attention {stack.flash_attention}, dropout {stack.dropout}", "llama3 attention "
                     "is PyTorch SDPA (flash kernel) and the model has no dropout; allowed: flash_attention true, "
                     "dropout false", field="stack")
    if task.precision == "fp16":
        raise refuse(FMT, "precision fp16", "mixed precision is bfloat16 or float32; allowed: bf16, fp8, mxfp8",
                     field="task.precision")
    if stack.fp8_params and task.precision in CONVERTER:
        raise refuse(FMT, "stack.fp8_params true", "Float8Linear keeps high-precision weights (mixed_precision_param "
                     "bfloat16 / float32); enable_fsdp_float8_all_gather only casts them for the all-gather "
                     "(config/job_config.py line 732 @73a0e69); allowed: stack.fp8_params false", field="stack.fp8_params")
    if stack.optimizer_dtype != "fp32":
        raise refuse(FMT, f"stack.optimizer_dtype {stack.optimizer_dtype}", "the optimizer config has no state dtype: "
                     "AdamW keeps its states in the fp32 parameters' precision (config/job_config.py lines 133-170 "
                     "@73a0e69); allowed: fp32", field="stack.optimizer_dtype")
    if task.global_batch % (p.dp * p.mbs):
        raise rule_refusal(FMT, f"mbs={p.mbs} with dp={p.dp}", "torchtitan.global-batch", field="mbs")
    if p.zero == 0 and p.gpus > p.dp:
        raise rule_refusal(FMT, f"zero=0 with tp={p.tp} pp={p.pp} cp={p.cp}", "torchtitan.ddp-1d", field="zero")
    if m.heads % p.tp or m.n_kv_heads % p.tp:
        raise rule_refusal(FMT, f"tp={p.tp} with {m.heads} heads / {m.n_kv_heads} KV heads", "torchtitan.heads-tp",
                              field="tp")
    assert task.seq_len is not None
    if task.seq_len % (p.tp * 2 * p.cp):
        raise rule_refusal(FMT, f"seq_len {task.seq_len} with tp={p.tp} cp={p.cp}", "torchtitan.seq-divisor",
                              field="tp")
    per_stage = even_layers(m.layers, p.pp * p.vpp, FMT, f"pp={p.pp} vpp={p.vpp}") if p.stage_layers is None else None
    flavor = f"madmax_{m.name}"
    sections: dict[str, dict[str, Any]] = {
        "model": {"name": "llama3", "flavor": flavor, "converters": [CONVERTER[task.precision]] if task.precision
                  in CONVERTER else None},
        "experimental": {"custom_import": FLAVOR_MODULE},
        "training": {"local_batch_size": task.global_batch // p.dp if p.pp > 1 else p.mbs,
                     "global_batch_size": task.global_batch, "seq_len": task.seq_len,
                     "mixed_precision_param": "bfloat16"},
        "parallelism": {
            "data_parallel_replicate_degree": p.dp if p.zero == 0 else 1,
            "data_parallel_shard_degree": 1 if p.zero == 0 else p.dp,
            "fsdp_reshard_after_forward": RESHARD[p.zero], "tensor_parallel_degree": p.tp,
            "pipeline_parallel_degree": p.pp, "context_parallel_degree": p.cp, "expert_parallel_degree": p.ep,
            "pipeline_parallel_schedule": ("Interleaved1F1B" if p.vpp > 1 else "1F1B") if p.pp > 1 else None,
            "pipeline_parallel_microbatch_size": p.mbs if p.pp > 1 else None,
            "pipeline_parallel_layers_per_stage": per_stage if p.pp > 1 else None,
            # torchtitan.virtual-stages: embedding and output are not counted as layers (defaults 1 each)
            "pipeline_parallel_first_stage_less_layers": 0 if p.pp > 1 else None,
            "pipeline_parallel_last_stage_less_layers": 0 if p.pp > 1 else None,
            "module_fqns_per_model_part": stage_modules(p.stage_layers) if p.stage_layers else None,
        },
        "activation_checkpoint": {"mode": recompute,
                                  "selective_ac_option": "op" if recompute == "selective" else None},
        "quantize.linear.float8": {"recipe_name": "tensorwise"} if task.precision == "fp8" else {},
    }
    launcher, nodes = torchrun(ctx, FMT)
    cmd = Command(launcher=[*launcher, "-m"], program=[flagset(FMT).program], args=["--job.config_file", CONFIG])
    files = {CONFIG: toml_text(sections), f"{FLAVOR_MODULE}.py": flavor_file(m, flavor, task.seq_len)}
    notes = [f"put {FLAVOR_MODULE}.py on PYTHONPATH; set [model] hf_assets_path to your tokenizer"]
    return emitted(ctx, FMT, [cmd], nodes, files=files, notes=notes)


def titan_parse(e: Emitted) -> Plan:
    (cmd,) = e.commands
    cfg = tomllib.loads(e.files[CONFIG])
    par, train = cfg["parallelism"], cfg["training"]
    tp, pp, cp = par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp == launcher_world(cmd.launcher) // (tp * pp * cp)
    parts = par.get("module_fqns_per_model_part")
    stages = [sum(x.startswith("layers.") for x in part) for part in parts] if parts else None
    layers = sum(stages) if stages else None
    vpp = 1
    if par.get("pipeline_parallel_schedule") == "Interleaved1F1B":
        layers = tomllib_layers(e.files[f"{FLAVOR_MODULE}.py"])
        vpp = layers // (pp * par["pipeline_parallel_layers_per_stage"])
    recompute = cfg["activation_checkpoint"]["mode"]
    return Plan(
        dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp,
        mbs=par["pipeline_parallel_microbatch_size"] if pp > 1 else train["local_batch_size"],
        zero={v: k for k, v in RESHARD.items()}[par["fsdp_reshard_after_forward"]], recompute=recompute,
        sp=tp > 1, ep=par["expert_parallel_degree"], stage_layers=stages,
        stage_recompute=[recompute] * pp if stages else None,
    )


def tomllib_layers(flavor_py: str) -> int:
    """n_layers of the registered flavor (the TOML names the flavor; its size lives in the flavor file)."""
    return int(flavor_py.split("n_layers=", 1)[1].split(",", 1)[0])


def titan_config(e: Emitted) -> dict[str, Any]:
    return dotted_items(tomllib.loads(e.files[CONFIG]))


TORCHTITAN = Format(
    name=FMT, kind="training", emit=titan_emit, parse=titan_parse, config=titan_config,
    maps={
        "dp": ("parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree"),
        "tp": ("parallelism.tensor_parallel_degree",), "pp": ("parallelism.pipeline_parallel_degree",),
        "cp": ("parallelism.context_parallel_degree",),
        "vpp": ("parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_layers_per_stage"),
        "mbs": ("parallelism.pipeline_parallel_microbatch_size", "training.local_batch_size"),
        "zero": ("parallelism.data_parallel_shard_degree", "parallelism.fsdp_reshard_after_forward"),
        "recompute": ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option"),
        "sp": ("parallelism.tensor_parallel_degree",), "ep": ("parallelism.expert_parallel_degree",),
        "system": ("--nnodes", "--nproc-per-node"), "stage_layers": ("parallelism.module_fqns_per_model_part",),
        "stage_recompute": ("activation_checkpoint.mode",), "stage_systems": ("--nnodes", "--nproc-per-node"),
    },
    refuses={"batch": BATCH, "stage_recompute": STAGE_RECOMPUTE, "stage_systems": MIXED,
             "zero": "zero=1: FSDP2 has no optimizer-only sharding",
             "sp": "sp other than (tp > 1): torchtitan's TP always shards the sequence"},
)
