"""DeepSpeed: a JSON config for the ZeRO stage and batch sizes, with Megatron-DeepSpeed flags for tp / pp.

DeepSpeed's pipeline engine allows ZeRO stage 0 or 1 only (deepspeed/runtime/pipe/engine.py); Megatron-DeepSpeed's
sequence parallelism over more ranks is Ulysses (all-to-all), not ring context parallelism, and its pipeline has no
interleaving or explicit per-stage layer counts; native DeepSpeed MoE rejects ZeRO-3 (deepspeed/runtime/engine.py):
those plans are refused.
"""

from __future__ import annotations

import json
from typing import Any

from madmax_opt.launch.cluster import deepspeed_launcher
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
    refuse,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.megatron import BATCH, MIXED, emitted, even_layers, training_checks
from madmax_opt.launch.rules import rule_refusal
from madmax_opt.launch.startup import check_positions
from madmax_opt.model.spec import Plan

FMT = "deepspeed"
CONFIG = "ds_config.json"


def ds_emit(ctx: Context) -> Emitted:
    p, m = ctx.plan, ctx.model
    task = training_checks(ctx, FMT)
    unsupported = [
        (p.cp > 1, f"cp={p.cp}", "Megatron-DeepSpeed shards sequences with Ulysses all-to-all, not ring context "
                                 "parallelism; allowed: cp 1"),
        (p.vpp > 1, f"vpp={p.vpp}", "the DeepSpeed pipeline engine has no interleaved schedule; allowed: vpp 1"),
        (p.stage_layers is not None, "an uneven pipeline (stage_layers)", "PipelineModule partitions by method "
                                                                          "(uniform, parameters), not by counts"),
        (task.precision in ("fp8", "mxfp8"), f"precision {task.precision}", "no FP8 training path; allowed: bf16, "
                                                                           "fp16"),
        (ctx.problem.stack.optimizer_dtype != "fp32", f"stack.optimizer_dtype {ctx.problem.stack.optimizer_dtype}",
         "the bf16 path keeps fp32 master weights and Adam states (BF16_Optimizer: deepspeed/runtime/"
         "bf16_optimizer.py line 170 @v0.19.5); allowed: fp32"),
        (m.moe is not None and (m.moe.shared_experts > 0 or m.moe.expert_ffn != m.ffn), "this MoE layout",
         "DeepSpeed-MoE experts are ffn_hidden_size wide, without shared experts"),
    ]
    for bad, setting, why in unsupported:
        if bad:
            fields = {"an uneven pipeline (stage_layers)": "stage_layers", "this MoE layout": "model.moe",
                      f"precision {task.precision}": "task.precision",
                      f"stack.optimizer_dtype {ctx.problem.stack.optimizer_dtype}": "stack.optimizer_dtype"}
            raise refuse(FMT, setting, why, field=fields.get(setting))
    if m.heads % p.tp or m.n_kv_heads % p.tp:
        raise rule_refusal(FMT, f"tp={p.tp} with {m.heads} heads / {m.n_kv_heads} KV heads", "deepspeed.heads-tp",
                              field="tp")
    if m.moe is not None and m.moe.num_experts % p.ep:
        raise rule_refusal(FMT, f"ep={p.ep} with {m.moe.num_experts} experts", "deepspeed.experts-ep", field="ep")
    if p.zero >= 2 and p.pp > 1:
        raise rule_refusal(FMT, f"zero={p.zero} with pp={p.pp}", "deepspeed.pipe-zero", field="zero")
    if m.moe is not None and p.zero == 3:
        raise rule_refusal(FMT, "zero=3 with a mixture-of-experts model", "deepspeed.moe-zero3", field="zero")
    even_layers(m.layers, p.pp, FMT, f"pp={p.pp}")
    config = {
        "train_batch_size": task.global_batch, "train_micro_batch_size_per_gpu": p.mbs,
        "gradient_accumulation_steps": task.global_batch // (p.dp * p.mbs),
        "zero_optimization": {"stage": p.zero},
        "bf16" if task.precision == "bf16" else "fp16": {"enabled": True},
    }
    if task.global_batch % (p.dp * p.mbs):
        raise rule_refusal(FMT, f"mbs={p.mbs} with dp={p.dp}", "deepspeed.batch", field="mbs")
    moe = m.moe
    pos = check_positions(FMT, m, ())  # Megatron-DeepSpeed's rotary embedding: a base and a fraction, no scaling
    args = flag_args([
        ("--deepspeed", True), ("--deepspeed_config", CONFIG), ("--zero-stage", p.zero),
        ("--tensor-model-parallel-size", p.tp), ("--pipeline-model-parallel-size", p.pp),
        ("--no-pipeline-parallel", p.pp == 1), ("--sequence-parallel", p.sp),
        ("--micro-batch-size", p.mbs), ("--global-batch-size", task.global_batch),
        ("--recompute-granularity", None if p.recompute == "none" else p.recompute),
        ("--recompute-method", "uniform" if p.recompute == "full" else None),
        ("--recompute-num-layers", 1 if p.recompute == "full" else None),
        ("--bf16", task.precision == "bf16"), ("--fp16", task.precision == "fp16"),
        ("--use-flash-attn-v2", ctx.problem.stack.flash_attention),
        ("--hidden-dropout", 0.1 if ctx.problem.stack.dropout else 0.0),
        ("--attention-dropout", 0.1 if ctx.problem.stack.dropout else 0.0),
        ("--use-rotary-position-embeddings", pos.kind == "rope"),
        ("--rotary-position-embeddings-theta", pos.rope_theta if pos.kind == "rope" else None),
        ("--rotary-percent", pos.rotary_percent if pos.kind == "rope" and pos.rotary_percent != 1 else None),
        ("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--num-attention-heads", m.heads),
        ("--num-key-value-heads", m.n_kv_heads), ("--ffn-hidden-size", m.ffn), ("--swiglu", m.ffn_kind == "swiglu"),
        ("--normalization", m.norm), ("--seq-length", task.seq_len), ("--max-position-embeddings", task.seq_len),
        ("--vocab-size", m.vocab), ("--untie-embeddings-and-output-weights", not m.tied_embeddings),
        ("--disable-bias-linear", not m.bias),
        ("--num-experts", moe.num_experts if moe else None), ("--moe-expert-parallel-size", p.ep if moe else None),
        ("--topk", moe.top_k if moe else None), ("--expert-interval", 1 if moe else None),
        # experts sharded by tp as priced; without the flag every tp rank holds whole experts
        # (Megatron-DeepSpeed megatron/core/tensor_parallel/layers.py lines 529-531 @4efb479)
        ("--enable-expert-tensor-parallelism", moe is not None and p.tp > 1),
    ])
    if p.ep > 1 and moe is None:
        raise refuse(FMT, f"ep={p.ep}", "expert parallelism needs a mixture-of-experts model")
    nodes, per_node = node_layout(FMT, p.gpus, ctx.gpus_per_node)
    fs = flagset(FMT)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if p.sp else {}  # deepspeed.sp-max-connections
    cmd = Command(launcher=deepspeed_launcher(nodes, per_node), program=[fs.program], args=args, env=env)
    notes = ["Megatron-DeepSpeed's pretrain_gpt.py; add data, tokenizer and schedule flags",
             f"position encoding: {pos.source}"]
    return emitted(ctx, FMT, [cmd], nodes, files={CONFIG: json.dumps(config, indent=2) + "\n"}, notes=notes)


def ds_parse(e: Emitted) -> Plan:
    (cmd,) = e.commands
    f = parse_flags(cmd.args)
    launch = parse_flags(cmd.launcher[1:])
    config = json.loads(e.files[CONFIG])
    tp = integer(f, "--tensor-model-parallel-size")
    pp = 1 if "--no-pipeline-parallel" in f else integer(f, "--pipeline-model-parallel-size")
    zero = integer(f, "--zero-stage", 0)
    assert zero == config["zero_optimization"]["stage"]
    assert integer(f, "--micro-batch-size") == config["train_micro_batch_size_per_gpu"]
    granularity = f.get("--recompute-granularity")
    return Plan(
        dp=integer(launch, "--num_nodes") * integer(launch, "--num_gpus") // (tp * pp), tp=tp, pp=pp,
        mbs=integer(f, "--micro-batch-size"), zero=zero,
        recompute=str(granularity) if isinstance(granularity, str) else "none",
        sp="--sequence-parallel" in f, ep=integer(f, "--moe-expert-parallel-size"),
    )


def ds_config(e: Emitted) -> dict[str, Any]:
    return dotted_items(json.loads(e.files[CONFIG]))


UNEVEN = "an uneven pipeline: DeepSpeed partitions by method, not by per-stage counts"
DEEPSPEED = Format(
    name=FMT, kind="training", emit=ds_emit, parse=ds_parse, config=ds_config,
    maps={
        "dp": ("--num_nodes", "--num_gpus", "gradient_accumulation_steps"), "tp": ("--tensor-model-parallel-size",),
        "pp": ("--pipeline-model-parallel-size", "--no-pipeline-parallel"),
        "mbs": ("--micro-batch-size", "train_micro_batch_size_per_gpu"),
        "zero": ("--zero-stage", "zero_optimization.stage"),
        "recompute": ("--recompute-granularity", "--recompute-method", "--recompute-num-layers"),
        "sp": ("--sequence-parallel",), "ep": ("--moe-expert-parallel-size",), "system": ("--num_nodes", "--num_gpus"),
    },
    refuses={"cp": "cp > 1: Ulysses is not ring context parallelism", "vpp": "vpp > 1: no interleaved schedule",
             "batch": BATCH, "stage_layers": UNEVEN, "stage_recompute": UNEVEN, "stage_systems": MIXED,
             "zero": "zero 2/3 with pp > 1; zero 3 with MoE"},
)
