"""Megatron-LM command lines and NeMo 2 / Megatron-Bridge recipe overrides (both Megatron-Core underneath).

Plan -> Megatron-Core: dp comes from the launcher (world size / (tp pp cp)); ZeRO-1 is the distributed optimizer,
ZeRO-2/3 Megatron-FSDP with sharding optim_grads / optim_grads_params; an uneven split is first / last stage layer
counts when the stages between are equal, else a pipeline layout string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from madmax_opt.launch.cluster import SBATCH, sbatch_script, torchrun_launcher
from madmax_opt.launch.common import (
    Command,
    Context,
    Emitted,
    Format,
    flag_args,
    integer,
    key_values,
    layout_layers,
    layout_string,
    node_layout,
    parse_flags,
    refuse,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.rules import rule_refusal
from madmax_opt.launch.startup import (
    BUILDER_RECIPE,
    GPT_MODEL_CONFIG_FIELDS,
    Positions,
    check_positions,
    launcher_world,
    positions_of,
)
from madmax_opt.model.family_name import training_task
from madmax_opt.model.spec import Plan, Stack, Task

SHARDING = {2: "optim_grads", 3: "optim_grads_params"}  # Megatron-FSDP data_parallel_sharding_strategy per ZeRO stage
FP8_RECIPE = {"fp8": ("hybrid", "tensorwise"), "mxfp8": ("e4m3", "mxfp8")}  # task precision -> (format, recipe)
NEMO_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": "bf16_with_fp8_current_scaling_mixed",
                  "mxfp8": "bf16_with_mxfp8_mixed"}
NEMO_RECIPE = {"swiglu": "llama3_70b_pretrain_32gpu_h100_bf16_config",  # silu + gated MLP base
               "gelu": "gpt3_175b_pretrain_32gpu_h100_bf16_config"}


def training_checks(ctx: Context, fmt: str) -> Task:
    """Settings no training format expresses: ViT, fine-tuning recipes, a serving batch, mixed GPU types."""
    p, m, task = ctx.plan, ctx.model, training_task(ctx.problem.task)
    if task is None:
        raise refuse(fmt, "an inference task", "a training format; allowed for serving: vllm, sglang, trtllm",
                     field="task.kind")
    if m.family != "llm":
        raise refuse(fmt, f"model family {m.family}", "only decoder LLMs are emitted; allowed: family llm",
                     field="model.family")
    if task.lora_rank or task.frozen_layers:
        raise refuse(fmt, "lora_rank / frozen_layers", "fine-tuning recipes are not emitted; allowed: full training",
                     field="task")
    if p.batch is not None:
        raise refuse(fmt, "batch", "a serving setting; training plans use mbs", field="batch")
    if p.stage_systems is not None and len(set(p.stage_systems)) > 1:
        raise refuse(fmt, "mixed GPU types per pipeline stage", "one launch runs on one system; allowed: "
                     "stage_systems all equal", field="stage_systems")
    return task


def uniform_recompute(p: Plan, fmt: str) -> str:
    """The plan's recompute mode: an uneven plan's per-stage modes (what the model costs), which must agree."""
    if p.stage_recompute is None:
        return p.recompute
    if len(set(p.stage_recompute)) > 1:
        raise refuse(fmt, f"per-stage recompute {p.stage_recompute}",
                     "recomputation is one setting for every stage; allowed: stage_recompute all equal",
                     field="stage_recompute")
    return p.stage_recompute[0]


def even_layers(layers: int, stages: int, fmt: str, what: str, rule: str | None = None) -> int:
    """Layers per stage of an even split; a split that is not even is refused, naming the framework's ``rule``."""
    if layers % stages:
        if rule is not None:
            raise rule_refusal(fmt, f"{what} with {layers} layers", rule)
        raise refuse(fmt, what, f"{layers} layers do not split evenly over {stages} stages; allowed: a divisor, "
                     "or an uneven plan (stage_layers)")
    return layers // stages


def no_uneven_interleaving(p: Plan, fmt: str) -> None:
    """Uneven stages with vpp > 1: the emitted stage splits (Megatron's first/last-stage layer counts or layout,
    torchtitan's modules per stage) place layers per pipeline stage, not per virtual chunk, so the interleaving
    would be dropped or mis-split; refuse it (megatron, nemo, torchtitan)."""
    if p.stage_layers is not None and p.vpp > 1:
        raise refuse(fmt, f"uneven stages with vpp={p.vpp}",
                     "the emitted stage split places layers per stage, not per virtual chunk; "
                     "allowed: uneven stages at vpp 1, or an even split with interleaving", field="vpp")


def uneven_split(stage_layers: Sequence[int] | None) -> tuple[tuple[int, int] | None, str | None]:
    """(first, last) stage layers when the stages between are equal (Megatron's first/last flags), else a layout."""
    if stage_layers is None:
        return None, None
    if len(stage_layers) >= 2 and len(set(stage_layers[1:-1])) <= 1:
        return (stage_layers[0], stage_layers[-1]), None
    return None, layout_string(stage_layers)


def stages_from(pp: int, layers: int, first_last: tuple[int, int] | None, layout: str | None) -> list[int] | None:
    """The inverse of :func:`uneven_split`."""
    if layout is not None:
        return layout_layers(layout)
    if first_last is None:
        return None
    first, last = first_last
    middle = [(layers - first - last) // (pp - 2)] * (pp - 2) if pp > 2 else []
    return [first, *middle, last]


def torchrun(ctx: Context, fmt: str) -> tuple[list[str], int]:
    nodes, per_node = node_layout(fmt, ctx.plan.gpus, ctx.gpus_per_node)
    return torchrun_launcher(nodes, per_node), nodes


def emitted(ctx: Context, fmt: str, commands: list[Command], nodes: int, files: dict[str, str] | None = None,
            notes: list[str] | None = None) -> Emitted:
    fs = flagset(fmt)
    per_node = min(ctx.plan.gpus, ctx.gpus_per_node)
    sbatch = sbatch_script(f"madmax-{fmt}", nodes, per_node, "deepspeed" if fmt == "deepspeed" else "torchrun")
    notes = [*(notes or []), f"Slurm: sbatch {SBATCH} (runs launch.sh on each of the {nodes} node(s))" if fmt !=
             "deepspeed" else f"Slurm: sbatch {SBATCH} (writes the hostfile, runs launch.sh once)"]
    return Emitted(format=fmt, framework=fs.framework, version=fs.version, kind="training",
                   system=ctx.option.system.name, gpus=ctx.plan.gpus, nodes=nodes,
                   gpus_per_node=per_node, commands=commands, files={**(files or {}), SBATCH: sbatch},
                   notes=notes)


# ----------------------------------------------------------------------------------------------- Megatron-LM


def megatron_refusals(ctx: Context, fmt: str, task: Task) -> None:
    """Plans Megatron-Core refuses at start-up (megatron and nemo; rules in data/flags/startup-training.yaml)."""
    p, m = ctx.plan, ctx.model
    rules = "megatron" if fmt == "megatron" else "nemo"
    if m.heads % p.tp:
        raise rule_refusal(fmt, f"tp={p.tp}", f"{rules}.heads-tp", field="tp")
    if m.n_kv_heads % p.tp and p.tp % m.n_kv_heads:
        raise rule_refusal(fmt, f"tp={p.tp} with {m.n_kv_heads} KV heads", f"{rules}.query-groups-tp", field="tp")
    if task.global_batch % (p.dp * p.mbs):
        raise rule_refusal(fmt, f"mbs={p.mbs} with dp={p.dp}", f"{rules}.global-batch", field="mbs")
    assert task.seq_len is not None
    if p.cp > 1 and task.seq_len % (2 * p.cp):
        raise rule_refusal(fmt, f"cp={p.cp} with seq_len {task.seq_len}", "megatron.cp-seq-length", field="cp")
    if p.ep > 1 and m.moe is None:
        raise rule_refusal(fmt, f"ep={p.ep} on a dense model", "megatron.ep-needs-experts", field="ep")
    if m.moe is not None and m.moe.num_experts % p.ep:
        raise rule_refusal(fmt, f"ep={p.ep} with {m.moe.num_experts} experts", f"{rules}.experts-ep", field="ep")
    if m.moe is not None and m.bias and p.tp > 1:  # expert tensor parallelism defaults to tp
        raise rule_refusal(fmt, f"tp={p.tp} on an MoE model with linear biases", f"{rules}.moe-bias-etp", field="tp")
    if p.gpus % (p.tp * p.ep * p.pp):
        raise rule_refusal(fmt, f"tp={p.tp} ep={p.ep} pp={p.pp} on {p.gpus} GPUs", f"{rules}.expert-grid",
                              field="ep")
    # Adam states: bf16 moments via the precision-aware optimizer (distributed optimizer only); no all-bf16 master
    opt = ctx.problem.stack.optimizer_dtype
    if opt == "bf16" or (opt == "bf16-moments" and p.zero == 0):
        raise rule_refusal(fmt, f"stack.optimizer_dtype {opt} with zero={p.zero}", f"{rules}.precision-aware-optimizer",
                           field="stack.optimizer_dtype")
    if p.vpp > 1 and p.pp == 1:
        raise rule_refusal(fmt, f"vpp={p.vpp} with pp=1", "megatron.interleaved-pp", field="vpp")
    check_positions(fmt, m, ("llama3",))  # --use-rope-scaling / rope_scaling: the Llama-3.1 scaling


def bf16_moments_args(switch: str, exp_avg: str, exp_avg_sq: str, stack: Stack) -> list[tuple[str, object]]:
    """stack.optimizer_dtype bf16-moments: Megatron-Core's precision-aware optimizer with bf16 m and v (fp32 master)."""
    on = stack.optimizer_dtype == "bf16-moments"
    return [(switch, on), (exp_avg, "bf16" if on else None), (exp_avg_sq, "bf16" if on else None)]


def rope_flags(pos: Positions) -> list[tuple[str, object]]:
    """Position encoding flags (Megatron-LM arguments.py: --position-embedding-type, --rotary-base, ...)."""
    rope = pos.kind == "rope"
    llama3 = pos.scaling is not None and pos.scaling.type == "llama3"
    return [("--position-embedding-type", "rope" if rope else "learned_absolute"),
            ("--rotary-base", pos.rope_theta if rope else None),
            ("--rotary-percent", pos.rotary_percent if rope and pos.rotary_percent != 1 else None),
            ("--use-rope-scaling", llama3), ("--rope-scaling-factor", pos.scaling.factor if llama3 and pos.scaling
                                              else None)]


def megatron_emit(ctx: Context) -> Emitted:
    fmt, p, m = "megatron", ctx.plan, ctx.model
    task = training_checks(ctx, fmt)
    no_uneven_interleaving(p, fmt)
    recompute = uniform_recompute(p, fmt)
    first_last, layout = uneven_split(p.stage_layers)
    if p.stage_layers is None:
        even_layers(m.layers, p.pp, fmt, f"pp={p.pp}", "megatron.layers-per-stage")
    per_chunk = even_layers(m.layers, p.pp * p.vpp, fmt, f"pp={p.pp} vpp={p.vpp}", "megatron.layers-per-chunk") \
        if p.stage_layers is None else None
    megatron_refusals(ctx, fmt, task)
    moe, stack = m.moe, ctx.problem.stack
    fsdp = p.zero >= 2
    fp8 = FP8_RECIPE.get(task.precision)
    fp8_params = stack.fp8_params and fp8 is not None  # the price keeps bf16 weights for bf16 / fp16 tasks
    if fp8_params and p.zero == 0:
        raise rule_refusal(fmt, "stack.fp8_params with zero=0", "megatron.fp8-param-gather", field="zero")
    launcher, nodes = torchrun(ctx, fmt)
    args = flag_args([
        ("--tensor-model-parallel-size", p.tp), ("--pipeline-model-parallel-size", p.pp),
        ("--num-layers-per-virtual-pipeline-stage", per_chunk if p.vpp > 1 else None),
        ("--pipeline-model-parallel-layout", layout),
        ("--decoder-first-pipeline-num-layers", first_last[0] if first_last else None),
        ("--decoder-last-pipeline-num-layers", first_last[1] if first_last else None),
        ("--context-parallel-size", p.cp), ("--expert-model-parallel-size", p.ep),
        ("--sequence-parallel", p.sp),
        ("--micro-batch-size", p.mbs), ("--global-batch-size", task.global_batch),
        ("--recompute-granularity", None if recompute == "none" else recompute),
        ("--recompute-method", "uniform" if recompute == "full" else None),
        ("--recompute-num-layers", 1 if recompute == "full" else None),
        ("--use-distributed-optimizer", p.zero == 1),
        ("--use-megatron-fsdp", fsdp), ("--data-parallel-sharding-strategy", SHARDING.get(p.zero)),
        ("--ckpt-format", "fsdp_dtensor" if fsdp else None),  # megatron.fsdp-ckpt-format
        ("--overlap-grad-reduce", stack.dp_overlap),
        ("--overlap-param-gather", stack.dp_overlap and p.zero >= 1),
        ("--tp-comm-overlap", stack.tp_comm_overlap and p.tp > 1 and p.sp),
        ("--fp16", task.precision == "fp16"), ("--bf16", task.precision != "fp16"),
        ("--fp8-format", fp8[0] if fp8 else None), ("--fp8-recipe", fp8[1] if fp8 else None),
        ("--fp8-param-gather", fp8_params),
        *bf16_moments_args("--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype", stack),
        ("--attention-backend", "flash" if stack.flash_attention else "unfused"),
        ("--hidden-dropout", 0.1 if stack.dropout else 0.0), ("--attention-dropout", 0.1 if stack.dropout else 0.0),
        ("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--num-attention-heads", m.heads),
        ("--group-query-attention", m.n_kv_heads != m.heads),
        ("--num-query-groups", m.n_kv_heads if m.n_kv_heads != m.heads else None),
        ("--ffn-hidden-size", m.ffn), ("--swiglu", m.ffn_kind == "swiglu"),
        ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
        ("--seq-length", task.seq_len), ("--max-position-embeddings", task.seq_len), ("--vocab-size", m.vocab),
        *rope_flags(positions_of(m)),
        ("--untie-embeddings-and-output-weights", not m.tied_embeddings), ("--disable-bias-linear", not m.bias),
        ("--num-experts", moe.num_experts if moe else None), ("--moe-router-topk", moe.top_k if moe else None),
        ("--moe-ffn-hidden-size", moe.expert_ffn if moe else None),
        ("--moe-shared-expert-intermediate-size", moe.shared_experts * moe.expert_ffn if moe and moe.shared_experts
         else None),
        ("--moe-grouped-gemm", moe is not None), ("--moe-token-dispatcher-type", "alltoall" if moe else None),
    ])
    # megatron.tp-cp-max-connections (TP / CP without FSDP) and megatron.fsdp-max-connections (never 1 with FSDP)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (p.tp > 1 or p.cp > 1) and not fsdp else {}
    cmd = Command(launcher=launcher, program=[flagset(fmt).program], args=args, env=env)
    notes = ["add your data and tokenizer flags (--data-path, --tokenizer-type) and training schedule "
             "(--train-iters, --lr)", f"position encoding: {positions_of(m).source}"]
    return emitted(ctx, fmt, [cmd], nodes, notes=notes)


def megatron_parse(e: Emitted) -> Plan:
    (cmd,) = e.commands
    f = parse_flags(cmd.args)
    tp, pp, cp = integer(f, "--tensor-model-parallel-size"), integer(f, "--pipeline-model-parallel-size"), integer(
        f, "--context-parallel-size")
    layers = integer(f, "--num-layers")
    granularity = f.get("--recompute-granularity")
    recompute = str(granularity) if isinstance(granularity, str) else "none"
    zero = 1 if "--use-distributed-optimizer" in f else 0
    if "--use-megatron-fsdp" in f:
        zero = {v: k for k, v in SHARDING.items()}[str(f["--data-parallel-sharding-strategy"])]
    layout = f.get("--pipeline-model-parallel-layout")
    first_last = (integer(f, "--decoder-first-pipeline-num-layers"), integer(f, "--decoder-last-pipeline-num-layers")) \
        if "--decoder-first-pipeline-num-layers" in f else None
    stages = stages_from(pp, layers, first_last, layout if isinstance(layout, str) else None)
    per_chunk = f.get("--num-layers-per-virtual-pipeline-stage")
    return Plan(
        dp=launcher_world(cmd.launcher) // (tp * pp * cp), tp=tp, pp=pp, cp=cp,
        vpp=layers // (pp * int(per_chunk)) if isinstance(per_chunk, str) else 1,
        mbs=integer(f, "--micro-batch-size"), zero=zero, recompute=recompute,
        sp="--sequence-parallel" in f, ep=integer(f, "--expert-model-parallel-size"),
        stage_layers=stages, stage_recompute=[recompute] * pp if stages else None,
    )


# ------------------------------------------------------------------------------------ NeMo / Megatron-Bridge


def nemo_model_fields(ctx: Context, task: Task) -> list[tuple[str, object]]:
    """(field, value) of the model section; None values are not emitted, "null" clears the recipe's value."""
    p, m, stack = ctx.plan, ctx.model, ctx.problem.stack
    recompute = uniform_recompute(p, "nemo")
    first_last, layout = uneven_split(p.stage_layers)
    moe, pos = m.moe, positions_of(m)
    llama3 = pos.scaling is not None and pos.scaling.type == "llama3"
    return [
        ("tensor_model_parallel_size", p.tp), ("pipeline_model_parallel_size", p.pp),
        ("virtual_pipeline_model_parallel_size", p.vpp if p.vpp > 1 else "null"),  # nemo.recipe-vpp
        ("pipeline_model_parallel_layout", layout),
        ("num_layers_in_first_pipeline_stage", first_last[0] if first_last else None),
        ("num_layers_in_last_pipeline_stage", first_last[1] if first_last else None),
        ("context_parallel_size", p.cp), ("expert_model_parallel_size", p.ep),
        # experts sharded by tp as priced: Bridge sets expert tp 1 when ep > 1 and it is unset
        # (models/transformer_config.py line 87 @067f987; Megatron-Core's own default is tp)
        ("expert_tensor_parallel_size", p.tp if moe else None),
        ("sequence_parallel", p.sp and p.tp > 1),  # nemo.sp-needs-tp
        ("recompute_granularity", "null" if recompute == "none" else recompute),
        ("recompute_method", "uniform" if recompute == "full" else "null"),
        ("recompute_num_layers", 1 if recompute == "full" else "null"),
        ("tp_comm_overlap", stack.tp_comm_overlap and p.tp > 1 and p.sp),
        ("seq_length", task.seq_len),
        ("num_layers", m.layers), ("hidden_size", m.hidden), ("num_attention_heads", m.heads),
        ("kv_channels", m.head_dim),  # the Llama-3 recipe's HF-derived config fixes it at 128 otherwise
        ("num_query_groups", m.n_kv_heads), ("ffn_hidden_size", m.ffn), ("vocab_size", m.vocab),
        ("normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
        ("gated_linear_unit", m.ffn_kind == "swiglu"), ("add_bias_linear", m.bias),
        # the GPT-3 recipe fuses bias and GELU, which Megatron-Core refuses without linear biases
        ("bias_activation_fusion", False if m.ffn_kind != "swiglu" and not m.bias else None),  # nemo.bias-gelu-fusion
        ("share_embeddings_and_output_weights", m.tied_embeddings),
        ("position_embedding_type", "rope" if pos.kind == "rope" else "learned_absolute"),
        ("rotary_base", pos.rope_theta if pos.kind == "rope" else None),
        ("rotary_percent", pos.rotary_percent if pos.kind == "rope" else None),
        ("rope_scaling", llama3), ("rope_scaling_factor", pos.scaling.factor if llama3 and pos.scaling else None),
        # attention_backend is left to the recipe (None: Transformer Engine picks flash / fused attention); the
        # override would arrive as a string, not Megatron-Core's AttnBackend enum
        ("hidden_dropout", 0.1 if stack.dropout else 0.0), ("attention_dropout", 0.1 if stack.dropout else 0.0),
        ("num_moe_experts", moe.num_experts if moe else None), ("moe_router_topk", moe.top_k if moe else None),
        ("moe_ffn_hidden_size", moe.expert_ffn if moe else None),
        ("moe_shared_expert_intermediate_size", moe.shared_experts * moe.expert_ffn if moe and moe.shared_experts
         else None),
        ("moe_grouped_gemm", True if moe else None), ("moe_token_dispatcher_type", "alltoall" if moe else None),
    ]


def model_key(recipe: str, name: str) -> str:
    """model.<field>, or model.transformer.<field> for a TransformerConfig field of a builder-backed recipe
    (nemo.builder-nesting)."""
    nested = BUILDER_RECIPE.search(recipe) and name not in GPT_MODEL_CONFIG_FIELDS
    return f"model.transformer.{name}" if nested else f"model.{name}"


def nemo_emit(ctx: Context) -> Emitted:
    fmt, p, m = "nemo", ctx.plan, ctx.model
    task = training_checks(ctx, fmt)
    no_uneven_interleaving(p, fmt)
    if p.stage_layers is None:
        even_layers(m.layers, p.pp * p.vpp, fmt, f"pp={p.pp} vpp={p.vpp}", "megatron.layers-per-chunk")
    megatron_refusals(ctx, fmt, task)
    if not ctx.problem.stack.flash_attention:
        raise refuse(fmt, "stack.flash_attention false", "the recipes run Transformer Engine's flash / fused attention "
                     "(attention_backend None); allowed: flash_attention true", field="stack.flash_attention")
    recipe = NEMO_RECIPE[m.ffn_kind]
    stack, fsdp = ctx.problem.stack, p.zero >= 2
    if task.precision in FP8_RECIPE and not stack.fp8_params:
        raise refuse(fmt, f"precision {task.precision} with stack.fp8_params false", "Bridge's FP8 mixed-precision "
                     "recipes set fp8_param_gather (FP8 primary weights) and copy it onto the model and DDP configs "
                     "(training/mixed_precision.py lines 264, 302, 138-155 @067f987); allowed: stack.fp8_params true",
                     field="stack.fp8_params")
    overrides: list[tuple[str, object]] = [(model_key(recipe, k), v) for k, v in nemo_model_fields(ctx, task)]
    overrides += [
        ("train.micro_batch_size", p.mbs), ("train.global_batch_size", task.global_batch),
        ("dataset.seq_length", task.seq_len),
        ("ddp.use_distributed_optimizer", p.zero >= 1), ("optimizer.use_distributed_optimizer", p.zero >= 1),
        ("ddp.use_megatron_fsdp", fsdp), ("dist.use_megatron_fsdp", True if fsdp else None),
        ("ddp.data_parallel_sharding_strategy", SHARDING.get(p.zero, "no_shard")),
        ("checkpoint.ckpt_format", "fsdp_dtensor" if fsdp else None),  # nemo.fsdp-ckpt-format
        ("comm_overlap.tp_comm_overlap", stack.tp_comm_overlap and p.tp > 1 and p.sp),  # nemo.recipe-comm-overlap
        ("comm_overlap.defer_embedding_wgrad_compute", False if p.pp == 1 else None),  # nemo.defer-wgrad-pp
        ("ddp.overlap_grad_reduce", stack.dp_overlap),
        ("ddp.overlap_param_gather", stack.dp_overlap and p.zero >= 1),
        ("mixed_precision", NEMO_PRECISION[task.precision]),
        *bf16_moments_args("optimizer.use_precision_aware_optimizer", "optimizer.exp_avg_dtype",
                           "optimizer.exp_avg_sq_dtype", stack),
    ]
    args = ["--recipe", recipe, "--mode", "pretrain"]
    args += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides if v is not None]
    launcher, nodes = torchrun(ctx, fmt)
    cmd = Command(launcher=launcher, program=[flagset(fmt).program], args=args)
    notes = [f"base recipe {recipe} supplies the optimizer and data defaults; the overrides set the architecture, "
             "position encoding and the plan", f"position encoding: {positions_of(m).source}",
             "add --dataset and checkpoint options for your run"]
    return emitted(ctx, fmt, [cmd], nodes, notes=notes)


def nemo_overrides(args: Sequence[str]) -> dict[str, str]:
    """The KEY=VALUE overrides, model.transformer.<field> read as model.<field>."""
    return {k.replace("model.transformer.", "model."): v for k, v in key_values(args).items()}


def nemo_parse(e: Emitted) -> Plan:
    (cmd,) = e.commands
    o = nemo_overrides(cmd.args)

    def num(key: str, default: int = 1) -> int:
        return int(o[key]) if key in o and o[key] != "null" else default

    tp, pp, cp = num("model.tensor_model_parallel_size"), num("model.pipeline_model_parallel_size"), num(
        "model.context_parallel_size")
    recompute = o.get("model.recompute_granularity", "null")
    recompute = "none" if recompute == "null" else recompute
    zero = 1 if o.get("ddp.use_distributed_optimizer") == "true" else 0
    if o.get("ddp.use_megatron_fsdp") == "true":
        zero = {v: k for k, v in SHARDING.items()}[o["ddp.data_parallel_sharding_strategy"]]
    first_last = (num("model.num_layers_in_first_pipeline_stage"), num("model.num_layers_in_last_pipeline_stage")) \
        if "model.num_layers_in_first_pipeline_stage" in o else None
    stages = stages_from(pp, num("model.num_layers"), first_last, o.get("model.pipeline_model_parallel_layout"))
    return Plan(
        dp=launcher_world(cmd.launcher) // (tp * pp * cp), tp=tp, pp=pp, cp=cp,
        vpp=num("model.virtual_pipeline_model_parallel_size"), mbs=num("train.micro_batch_size"), zero=zero,
        recompute=recompute,
        sp=o.get("model.sequence_parallel") == "true", ep=num("model.expert_model_parallel_size"),
        stage_layers=stages, stage_recompute=[recompute] * pp if stages else None,
    )


def nemo_config(e: Emitted) -> dict[str, Any]:
    return {k: v for c in e.commands for k, v in key_values(c.args).items()}


MIXED = "stage_systems with more than one system: one launch runs on one GPU type"
STAGE_RECOMPUTE = "stage_recompute that differs between stages: recomputation is one setting for every stage"
BATCH = "batch: a serving setting"

MEGATRON = Format(
    name="megatron", kind="training", emit=megatron_emit, parse=megatron_parse,
    maps={
        "dp": ("--nnodes", "--nproc-per-node"), "tp": ("--tensor-model-parallel-size",),
        "pp": ("--pipeline-model-parallel-size",), "cp": ("--context-parallel-size",),
        "vpp": ("--num-layers-per-virtual-pipeline-stage",), "mbs": ("--micro-batch-size",),
        "zero": ("--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy"),
        "recompute": ("--recompute-granularity", "--recompute-method", "--recompute-num-layers"),
        "sp": ("--sequence-parallel",), "ep": ("--expert-model-parallel-size",),
        "system": ("--nnodes", "--nproc-per-node"), "stage_layers": ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
                                                                      "--decoder-last-pipeline-num-layers"),
        "stage_recompute": ("--recompute-granularity",), "stage_systems": ("--nnodes", "--nproc-per-node"),
    },
    refuses={"batch": BATCH, "stage_recompute": STAGE_RECOMPUTE, "stage_systems": MIXED},
)

NEMO = Format(
    name="nemo", kind="training", emit=nemo_emit, parse=nemo_parse, config=nemo_config,
    maps={
        "dp": ("--nnodes", "--nproc-per-node"), "tp": ("model.tensor_model_parallel_size",),
        "pp": ("model.pipeline_model_parallel_size",), "cp": ("model.context_parallel_size",),
        "vpp": ("model.virtual_pipeline_model_parallel_size",), "mbs": ("train.micro_batch_size",),
        "zero": ("ddp.use_distributed_optimizer", "ddp.use_megatron_fsdp", "ddp.data_parallel_sharding_strategy"),
        "recompute": ("model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers"),
        "sp": ("model.sequence_parallel",), "ep": ("model.expert_model_parallel_size",),
        "system": ("--nnodes", "--nproc-per-node"), "stage_layers": ("model.pipeline_model_parallel_layout", "model.num_layers_in_first_pipeline_stage",
                                                                      "model.num_layers_in_last_pipeline_stage"),
        "stage_recompute": ("model.recompute_granularity",), "stage_systems": ("--nnodes", "--nproc-per-node"),
    },
    refuses={"batch": BATCH, "stage_recompute": STAGE_RECOMPUTE, "stage_systems": MIXED},
)
