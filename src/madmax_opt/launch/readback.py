"""The model a training configuration launches, read back from what was emitted (one reader per format).

``launched_model(emitted)`` reads the flags / overrides / TOML + flavor file / JSON the way the framework reads them
and returns the architecture, position encoding, precision and kernels it would run; tests compare it with the
model that was priced (the problem's model, its catalog position encoding, the task precision and the stack).
"""

from __future__ import annotations

from collections.abc import Mapping

import tomllib

from madmax_opt.launch.common import Emitted
from madmax_opt.launch.megatron import nemo_overrides
from madmax_opt.launch.startup import launched
from madmax_opt.launch.titan import llama_ffn
from madmax_opt.model.spec import Strict


class LaunchedModel(Strict):
    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    ffn: int
    ffn_kind: str
    vocab: int
    norm: str
    bias: bool
    tied_embeddings: bool
    num_experts: int | None = None
    top_k: int | None = None
    expert_ffn: int | None = None
    shared_experts: int = 0
    expert_tp: int | None = None  # MoE only: the tensor-parallel degree expert weights are sharded over
    positions: str  # rope or learned
    rope_theta: int | None = None
    rotary_percent: float = 1.0
    rope_scaling_factor: float | None = None  # Llama-3.1 scaling factor; None: unscaled
    precision: str
    fp8_params: bool = False  # FP8 primary weights (stack.fp8_params)
    optimizer_dtype: str = "fp32"  # Adam states (stack.optimizer_dtype); torchtitan and DeepSpeed: always fp32
    flash_attention: bool
    dropout: bool
    grouped_gemm: bool | None = None  # MoE only: experts of a rank in one grouped GEMM
    alltoall_dispatch: bool | None = None  # MoE only: all-to-all token dispatch
    seq_len: int
    global_batch: int


def _f(x: object) -> float:
    return float(str(x))


def _megatron(v: Mapping[str, object]) -> LaunchedModel:
    on = lambda k: v.get(k) is True  # noqa: E731
    num = lambda k, d=0: int(str(v[k])) if k in v else d  # noqa: E731
    heads = num("--num-attention-heads")
    moe = "--num-experts" in v
    expert_ffn = num("--moe-ffn-hidden-size") if moe else None
    fp8 = {("hybrid", "tensorwise"): "fp8", ("e4m3", "mxfp8"): "mxfp8"}.get((str(v.get("--fp8-format")),
                                                                            str(v.get("--fp8-recipe"))))
    rope = v.get("--position-embedding-type") == "rope"
    return LaunchedModel(
        layers=num("--num-layers"), hidden=num("--hidden-size"), heads=heads,
        head_dim=num("--kv-channels", num("--hidden-size") // heads),
        kv_heads=num("--num-query-groups") if on("--group-query-attention") else heads,
        ffn=num("--ffn-hidden-size"), ffn_kind="swiglu" if on("--swiglu") else "gelu", vocab=num("--vocab-size"),
        norm=str(v["--normalization"]).lower(), bias=not on("--disable-bias-linear"),
        tied_embeddings=not on("--untie-embeddings-and-output-weights"),
        num_experts=num("--num-experts") if moe else None, top_k=num("--moe-router-topk") if moe else None,
        expert_ffn=expert_ffn,
        shared_experts=num("--moe-shared-expert-intermediate-size") // expert_ffn if expert_ffn else 0,
        # unset: tensor_model_parallel_size (Megatron-LM megatron/training/arguments.py lines 569-570 @5be9626)
        expert_tp=num("--expert-tensor-parallel-size", num("--tensor-model-parallel-size", 1)) if moe else None,
        positions="rope" if rope else "learned", rope_theta=num("--rotary-base", 10000) if rope else None,
        rotary_percent=_f(v.get("--rotary-percent", 1.0)),
        rope_scaling_factor=_f(v.get("--rope-scaling-factor", 8.0)) if on("--use-rope-scaling") else None,
        precision=fp8 or ("fp16" if on("--fp16") else "bf16"), fp8_params=on("--fp8-param-gather"),
        optimizer_dtype="bf16-moments" if on("--use-precision-aware-optimizer")
        and v.get("--exp-avg-dtype") == v.get("--exp-avg-sq-dtype") == "bf16" else "fp32",
        flash_attention=v.get("--attention-backend") in ("flash", "fused", "auto", None),
        dropout=_f(v.get("--hidden-dropout", 0.1)) > 0,
        grouped_gemm=on("--moe-grouped-gemm") if moe else None,
        alltoall_dispatch=v.get("--moe-token-dispatcher-type") == "alltoall" if moe else None,
        seq_len=num("--seq-length"), global_batch=num("--global-batch-size"),
    )


NEMO_PRECISIONS = {"bf16_mixed": "bf16", "fp16_mixed": "fp16", "bf16_with_fp8_current_scaling_mixed": "fp8",
                   "bf16_with_mxfp8_mixed": "mxfp8"}
# the FP8 recipes set fp8_param_gather (Megatron-Bridge training/mixed_precision.py lines 264, 302 @067f987)
NEMO_FP8_PARAMS = {"bf16_with_fp8_current_scaling_mixed", "bf16_with_mxfp8_mixed"}


def _nemo(m: Mapping[str, str]) -> LaunchedModel:
    """``m``: the overrides as megatron.nemo_overrides reads them (model.transformer.<field> as model.<field>)."""
    num = lambda k, d=0: int(m[f"model.{k}"]) if f"model.{k}" in m else d  # noqa: E731
    on = lambda k: m.get(f"model.{k}") == "true"  # noqa: E731
    moe = "model.num_moe_experts" in m
    expert_ffn = num("moe_ffn_hidden_size") if moe else None
    rope = m.get("model.position_embedding_type") == "rope"
    return LaunchedModel(
        layers=num("num_layers"), hidden=num("hidden_size"), heads=num("num_attention_heads"),
        head_dim=num("kv_channels"), kv_heads=num("num_query_groups"), ffn=num("ffn_hidden_size"),
        ffn_kind="swiglu" if on("gated_linear_unit") else "gelu", vocab=num("vocab_size"),
        norm=m["model.normalization"].lower(), bias=on("add_bias_linear"),
        tied_embeddings=on("share_embeddings_and_output_weights"),
        num_experts=num("num_moe_experts") if moe else None, top_k=num("moe_router_topk") if moe else None,
        expert_ffn=expert_ffn,
        shared_experts=num("moe_shared_expert_intermediate_size") // expert_ffn if expert_ffn else 0,
        # unset: 1 when ep > 1, else tp (Megatron-Bridge models/transformer_config.py line 87 @067f987)
        expert_tp=num("expert_tensor_parallel_size", 1 if num("expert_model_parallel_size", 1) > 1
                      else num("tensor_model_parallel_size", 1)) if moe else None,
        positions="rope" if rope else "learned", rope_theta=num("rotary_base") if rope else None,
        rotary_percent=_f(m.get("model.rotary_percent", 1.0)),
        rope_scaling_factor=_f(m["model.rope_scaling_factor"]) if on("rope_scaling") else None,
        precision=NEMO_PRECISIONS[m["mixed_precision"]], fp8_params=m["mixed_precision"] in NEMO_FP8_PARAMS,
        optimizer_dtype="bf16-moments" if m.get("optimizer.use_precision_aware_optimizer") == "true"
        and m.get("optimizer.exp_avg_dtype") == m.get("optimizer.exp_avg_sq_dtype") == "bf16" else "fp32",
        flash_attention=m.get("model.attention_backend") in ("flash", "fused", "auto", None),
        dropout=_f(m["model.hidden_dropout"]) > 0,
        grouped_gemm=on("moe_grouped_gemm") if moe else None,
        alltoall_dispatch=m.get("model.moe_token_dispatcher_type") == "alltoall" if moe else None,
        seq_len=num("seq_length"), global_batch=int(m["train.global_batch_size"]),
    )


def _titan(e: Emitted) -> LaunchedModel:
    cfg = tomllib.loads(e.files["job.toml"])
    flavor = launched(e).flavor
    n = lambda k: int(flavor[k])  # noqa: E731
    scaling = flavor["scaling_factor"]
    converters = cfg["model"].get("converters") or []
    return LaunchedModel(
        layers=n("n_layers"), hidden=n("dim"), heads=n("n_heads"), head_dim=n("dim") // n("n_heads"),
        kv_heads=n("n_kv_heads"),
        ffn=llama_ffn(n("dim"), n("multiple_of"), flavor["ffn_dim_multiplier"]), ffn_kind="swiglu",
        vocab=n("vocab_size"), norm="rmsnorm", bias=False, tied_embeddings=False,
        positions="rope", rope_theta=n("rope_theta"), rope_scaling_factor=None if scaling == 1 else scaling,
        precision={"quantize.linear.float8": "fp8", "quantize.linear.mx": "mxfp8"}.get(
            converters[0] if converters else "", "bf16"),
        flash_attention=True,  # llama3 attn_type "sdpa" (args.py): PyTorch SDPA runs the flash kernel
        dropout=False,  # torchtitan's llama3 has no dropout layers
        seq_len=cfg["training"]["seq_len"], global_batch=cfg["training"]["global_batch_size"],
    )


def _deepspeed(v: Mapping[str, object]) -> LaunchedModel:
    """``v``: the flags and the DeepSpeed JSON's keys (``json:KEY``) as startup.launched reads them."""
    on = lambda k: v.get(k) is True  # noqa: E731
    num = lambda k, d=0: int(str(v[k])) if k in v else d  # noqa: E731
    heads = num("--num-attention-heads")
    moe = "--num-experts" in v
    rope = on("--use-rotary-position-embeddings")
    return LaunchedModel(
        layers=num("--num-layers"), hidden=num("--hidden-size"), heads=heads,
        head_dim=num("--kv-channels", num("--hidden-size") // heads),
        kv_heads=num("--num-key-value-heads", heads), ffn=num("--ffn-hidden-size"),
        ffn_kind="swiglu" if on("--swiglu") else "gelu", vocab=num("--vocab-size"), norm=str(v["--normalization"]),
        bias=not on("--disable-bias-linear"), tied_embeddings=not on("--untie-embeddings-and-output-weights"),
        num_experts=num("--num-experts") if moe else None, top_k=num("--topk", 1) if moe else None,
        expert_ffn=num("--ffn-hidden-size") if moe else None,  # DeepSpeed-MoE experts are ffn_hidden_size wide
        # experts are sliced by tp only with --enable-expert-tensor-parallelism, else whole on every tp rank
        # (deepspeedai/Megatron-DeepSpeed megatron/core/tensor_parallel/layers.py lines 529-531 @4efb479)
        expert_tp=(num("--tensor-model-parallel-size", 1) if on("--enable-expert-tensor-parallelism") else 1)
        if moe else None,
        positions="rope" if rope else "learned",
        rope_theta=num("--rotary-position-embeddings-theta", 10000) if rope else None,
        rotary_percent=_f(v.get("--rotary-percent", 1.0)),
        precision="bf16" if v.get("json:bf16.enabled") is True else "fp16",
        flash_attention=any(on(k) for k in ("--use-flash-attn-v2", "--use-flash-attn", "--use-flash-attn-v1")),
        dropout=_f(v.get("--hidden-dropout", 0.1)) > 0,
        grouped_gemm=None,  # DeepSpeed-MoE runs its experts one GEMM each (no grouped GEMM option)
        alltoall_dispatch=True if moe else None,  # DeepSpeed-MoE dispatches tokens with all-to-all
        seq_len=num("--seq-length"), global_batch=int(str(v["json:train_batch_size"])),
    )


def launched_model(e: Emitted) -> LaunchedModel:
    """The model, position encoding, precision and kernels ``e`` runs."""
    if e.format == "torchtitan":
        return _titan(e)
    if e.format == "deepspeed":
        return _deepspeed(launched(e).values)
    if e.format == "nemo":
        (cmd,) = e.commands
        return _nemo(nemo_overrides(cmd.args))
    return _megatron(launched(e).values)
