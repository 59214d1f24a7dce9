"""Workload: a model lowered to per-layer operations (FLOPs, bytes, parameters, activations).

All quantities are per token of one sequence and per transformer layer unless the name says otherwise; the cost
model (``madmax_opt.model.training`` and its op table ``madmax_opt.model.ops``) scales them by tokens per GPU and divides by the parallel degrees. Nothing here depends
on a plan or on hardware.

Conventions (Megatron / Korthikanti et al. 2022, "Reducing Activation Recomputation", Sec. 4):
- one multiply-accumulate = 2 FLOPs; backward GEMMs = 2 x forward (activation grad + weight grad);
- attention core FLOPs are counted over the full s x s score matrix in *model* FLOPs (MFU convention of
  Korthikanti eq. for 72*B*s*L*h^2*(1 + s/6h + V/12Lh)); causal flash kernels skip the masked half in *time*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madmax_opt.model.spec import Stack, Task, TrainingFramework, TransformerModel

ACT_BYTES = 2  # bf16/fp16 activations


@dataclass(frozen=True)
class Gemm:
    """One weight GEMM of a layer: y[tokens, n] = x[tokens, k] @ W[k, n]; ``tp_dim`` is the dimension TP shards."""

    name: str
    k: int
    n: int
    tp_dim: str  # "n" (column-parallel) or "k" (row-parallel)

    @property
    def flops_per_token(self) -> int:
        return 2 * self.k * self.n  # 2*k*n: one MAC per weight per token

    @property
    def params(self) -> int:
        return self.k * self.n


@dataclass(frozen=True)
class TransformerWorkload:
    """A stack of identical transformer layers plus embedding and (LLM) output head."""

    model: TransformerModel
    seq_len: int
    gemms: tuple[Gemm, ...]
    layers: int
    params_per_layer: int
    embedding_params: int  # token (or patch) embedding, on the first pipeline stage
    head_params: int  # LM head (0 when tied or ViT classifier neglected), on the last stage
    head_flops_per_token: int  # forward LM-head GEMM
    attn_flops_per_token: int  # forward QK^T + AV over the full s x s matrix
    causal: bool
    # activation bytes per token per layer (Korthikanti Sec. 4.1, generalised to GQA/SwiGLU/no dropout)
    act_replicated_bytes: int  # layer-norm inputs, QKV/MLP inputs, dropout masks: sharded only by SP
    act_tp_sharded_bytes: int  # Q, K, V, projection input, MLP intermediates: sharded by TP
    act_score_bytes_per_key: int  # s^2 terms per token per key position (softmax, mask, dropout), /TP
    # memory-bound (elementwise) traffic per token per layer in the forward pass
    elementwise_replicated_bytes: int  # norms, residual adds: sharded only by SP
    elementwise_tp_bytes: int  # activation function, bias: sharded by TP
    score_elementwise_bytes_per_key: int  # unfused softmax/mask/dropout traffic per key position, /TP
    trainable_fraction: float  # share of layer parameters with gradients (fine-tuning)
    frozen_layers: int  # leading layers whose base weights have no gradients (all of them with LoRA)
    lora_params_per_layer: int
    vocab: int
    final_norm_params: int = 0  # norm after the last layer (last pipeline stage)
    # mixture of experts: ``gemms`` then hold attention, shared experts and the router; the routed experts are here
    expert_gemms: tuple[Gemm, ...] = ()  # one expert's MLP
    num_experts: int = 0
    top_k: int = 0
    expert_load_factor: float = 1.0  # capacity factor x load imbalance: routed work on the critical path
    # torchtitan's selective AC (op-level SAC) keeps other tensors than Megatron's selective recompute:
    # per token, bytes split by how TP shards them (``op_sac_bytes``; all 0 where it does not apply: MoE, dropout)
    act_sac_replicated_bytes: int = 0  # the block input: sharded only by SP
    act_sac_tp_bytes: int = 0  # saved outputs of column-parallel mm's and of the attention kernel: / TP
    act_sac_unsharded_bytes: int = 0  # saved outputs of row-parallel mm's (partial sums before their reduction)
    sac_recompute_gemms: tuple[Gemm, ...] = ()  # the mm's op-level SAC runs again in backward (every second one)
    # FP8 under Transformer Engine: saved GEMM inputs change from bf16 to FP8 (``te_fp8_saved_delta_bytes``); signed
    # per-token changes of the replicated (/SP) and TP-sharded sets, training only (inference keeps the sets above)
    fp8_replicated_delta_bytes: int = 0
    fp8_tp_delta_bytes: int = 0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_params_per_layer(self) -> int:
        """Routed-expert parameters of one layer: E x (one expert's MLP)."""
        return self.num_experts * sum(g.params for g in self.expert_gemms)

    @property
    def routed_flops_per_token(self) -> int:
        """Forward FLOPs of the routed experts per token: top_k x one expert's MLP (no padding)."""
        return self.top_k * sum(g.flops_per_token for g in self.expert_gemms)

    @property
    def layer_flops_per_token(self) -> int:
        return sum(g.flops_per_token for g in self.gemms) + self.attn_flops_per_token + self.routed_flops_per_token

    @property
    def params(self) -> int:
        per_layer = self.params_per_layer + self.expert_params_per_layer
        return self.layers * per_layer + self.embedding_params + self.head_params + self.final_norm_params

    @property
    def trains_embedding(self) -> bool:
        """Embedding and LM head have gradients: some base weights train and no LoRA freezes the base."""
        return self.trainable_fraction > 0 and self.lora_params_per_layer == 0

    @property
    def model_flops_per_token(self) -> int:
        """Training model FLOPs per token as the task runs them (the MFU numerator): forward + activation
        gradients (weight GEMMs 1x forward, attention core 2x) + weight gradients (1x forward) of the trainable
        weights only. Pre-training / full fine-tuning: 3 x forward over the full s^2 attention and the LM head
        (Korthikanti et al. 2022 Sec. 6, Megatron's and llm-foundry's MFU); frozen layers and LoRA's frozen base
        run no weight-gradient GEMMs (the rank-r adapters' own FLOPs, < 0.5 % at r = 16 on 70B, are not counted)."""
        gemm = self.layer_flops_per_token - self.attn_flops_per_token  # weight GEMMs, routed experts included
        wgrad = (self.layers - self.frozen_layers) * gemm + self.trains_embedding * self.head_flops_per_token
        return 3 * self.layers * self.attn_flops_per_token + 2 * (self.layers * gemm + self.head_flops_per_token) + wgrad

    def op_sac_applies(self, stack: Stack) -> bool:
        """torchtitan's ``selective`` is op-level SAC (its saved set and recompute) where the block is covered."""
        return stack.framework == TrainingFramework.TORCHTITAN and bool(self.sac_recompute_gemms)

    def recompute_flops_per_layer_token(self, mode: int, op_sac: bool = False) -> int:
        """Forward FLOPs one layer runs again per token under a recompute mode (HFU counts them, MFU does not):
        full (2) = the layer's forward, selective (1) = its unfused attention core (Korthikanti et al. 2022 Sec. 5; flash
        attention recomputes inside its own backward, priced there) or, under torchtitan's op-level SAC
        (``op_sac``), the mm's it does not save (``sac_recompute_gemms``; its attention output is saved); none 0."""
        if op_sac:
            selective = sum(g.flops_per_token for g in self.sac_recompute_gemms)
        else:  # flash: inside its bwd
            selective = self.attn_flops_per_token if self.score_elementwise_bytes_per_key else 0
        return (0, selective, self.layer_flops_per_token)[mode]


def lower(model: TransformerModel, task: Task, stack: Stack) -> TransformerWorkload:
    """Lower a dense transformer to its per-layer operations for ``task``."""
    h, a, g, dh, f = model.hidden, model.heads, model.n_kv_heads, model.head_dim, model.ffn
    s = model.vit_seq_len if model.family == "vit" else task.seq_len
    if s is None:
        raise ValueError("task.seq_len is required for an llm")
    swiglu = model.ffn_kind == "swiglu"
    moe = model.moe
    if moe is not None:  # the dense MLP is replaced by shared experts + router; routed experts kept apart
        f = moe.shared_experts * moe.expert_ffn
        fe = moe.expert_ffn
        expert_gemms: tuple[Gemm, ...] = (
            Gemm("expert_up", h, (2 if swiglu else 1) * fe, "n"),
            Gemm("expert_down", fe, h, "k"),
        )
        mlp: tuple[Gemm, ...] = (Gemm("router", h, moe.num_experts, "n"),)
        if f:
            mlp = (Gemm("mlp_up", h, (2 if swiglu else 1) * f, "n"), Gemm("mlp_down", f, h, "k"), *mlp)
    else:
        expert_gemms = ()
        mlp = (Gemm("mlp_up", h, (2 if swiglu else 1) * f, "n"), Gemm("mlp_down", f, h, "k"))
    gemms = (
        Gemm("qkv", h, (a + 2 * g) * dh, "n"),
        Gemm("proj", a * dh, h, "k"),
        *mlp,
    )
    norm_width = (2 if model.norm == "layernorm" else 1) * h  # LayerNorm: scale + shift; RMSNorm: scale
    norm_params = 2 * norm_width  # two norms per layer
    bias_params = ((a + 2 * g) * dh + h + (2 if swiglu else 1) * f + h) if model.bias else 0
    params_per_layer = sum(gm.params for gm in gemms) + norm_params + bias_params

    if model.family == "vit":
        patch_in = model.channels * (model.patch_size or 1) ** 2
        patch_bias = h if model.bias else 0
        # patch projection (+ bias) + class token + position embedding of the s = patches + 1 positions
        embedding_params = patch_in * h + patch_bias + h + s * h
        head_params, head_flops, vocab = 0, 0, 0
    else:
        embedding_params = model.vocab * h
        head_params = 0 if model.tied_embeddings else model.vocab * h
        head_flops, vocab = 2 * h * model.vocab, model.vocab

    drop = 1 if stack.dropout else 0
    # Korthikanti: 2 LN inputs (4h) + QKV input (2h) + MLP input (2h) + 2 dropout masks (2h) = 10h with dropout
    act_replicated = ACT_BYTES * (2 * h + h + h) + drop * 2 * h
    # Q (2*a*dh) + K, V (2*2*g*dh) + projection input (2*a*dh) + MLP intermediates (gelu 2*2f; swiglu 3*2f)
    act_tp = ACT_BYTES * (2 * a * dh + 2 * g * dh) + (3 if swiglu else 2) * ACT_BYTES * f
    if moe is not None:  # routed tokens: dispatched input (2h) + expert intermediates, per routed copy
        act_tp += int(moe.top_k * moe.capacity_factor * ACT_BYTES * (h + (3 if swiglu else 2) * moe.expert_ffn))
    # softmax output (2as) + dropout mask (as) + dropout output (2as), per key position, when not fused
    act_score = 0 if stack.flash_attention else a * (ACT_BYTES + drop * (1 + ACT_BYTES))
    # forward elementwise traffic: 2 norms (read+write 2h each), 2 residual adds (read 2, write 1), dropouts
    elem_repl = ACT_BYTES * (2 * 2 * h + 2 * 3 * h) + drop * 2 * (ACT_BYTES * 2 * h + h)
    # activation function: gelu reads f writes f; swiglu reads 2f writes f
    elem_tp = ACT_BYTES * ((3 if swiglu else 2) * f)
    # padded capacity or the busiest rank's excess tokens set the routed experts' critical path
    load = max(moe.capacity_factor, moe.load_imbalance) if moe is not None else 1.0
    if moe is not None:
        elem_tp += int(moe.top_k * load * ACT_BYTES * (3 if swiglu else 2) * moe.expert_ffn)
    # unfused: scale+mask+softmax (read, write) and dropout (read, write, mask) over a x s scores per token
    score_elem = 0 if stack.flash_attention else a * (2 * ACT_BYTES + drop * (2 * ACT_BYTES + 1))

    if task.kind == "finetune" and task.lora_rank:
        trainable_fraction = 0.0
        lora = sum(task.lora_rank * (gm.k + gm.n) for gm in gemms)
    else:
        trainable_fraction = (model.layers - task.frozen_layers) / model.layers
        lora = 0
    if task.frozen_layers > model.layers:
        raise ValueError(f"frozen_layers ({task.frozen_layers}) exceeds the model's {model.layers} layers")

    te_fp8 = task.precision == "fp8" and stack.framework == TrainingFramework.MEGATRON_CORE
    fp8_repl, fp8_tp = te_fp8_saved_delta_bytes(h, a, dh, f, moe is None) if te_fp8 else (0, 0)
    return TransformerWorkload(
        model=model,
        seq_len=s,
        gemms=gemms,
        layers=model.layers,
        params_per_layer=params_per_layer,
        embedding_params=embedding_params,
        head_params=head_params,
        head_flops_per_token=head_flops,
        attn_flops_per_token=2 * 2 * s * a * dh,  # QK^T and AV: 2*s*a*dh each
        causal=model.family == "llm",
        act_replicated_bytes=act_replicated,
        act_tp_sharded_bytes=act_tp,
        act_score_bytes_per_key=act_score,
        elementwise_replicated_bytes=elem_repl,
        elementwise_tp_bytes=elem_tp,
        score_elementwise_bytes_per_key=score_elem,
        trainable_fraction=trainable_fraction,
        frozen_layers=model.layers if lora else task.frozen_layers,
        lora_params_per_layer=lora,
        vocab=vocab,
        expert_gemms=expert_gemms,
        num_experts=moe.num_experts if moe is not None else 0,
        top_k=moe.top_k if moe is not None else 0,
        expert_load_factor=load,
        **op_sac_bytes(model, h, a, g, dh, f, swiglu, moe is None and not drop),
        fp8_replicated_delta_bytes=fp8_repl,
        fp8_tp_delta_bytes=fp8_tp,
        final_norm_params=norm_width,
    )


def op_sac_bytes(
    model: TransformerModel, h: int, a: int, g: int, dh: int, f: int, swiglu: bool, applies: bool
) -> dict[str, Any]:
    """Bytes per token one layer keeps under torchtitan's op-level selective AC (``selective_ac_option = 'op'``,
    its Llama 3 configs' default): the checkpointed block's input, plus the outputs of the ops on its save list,
    aten.mm and the SDPA kernels, except every second mm (torchtitan/parallelisms/parallelize_llama.py
    _apply_ac_to_transformer_block @582fe7d; train_configs/llama3_8b.toml @0011fb9). The block's mm's run in order
    wq, wk, wv, wo, w1, (w3,) w2: the 1st, 3rd, 5th, 7th are kept. Column-parallel outputs (wq, wv, w1) and the
    attention output (+ its fp32 log-sum-exp) are sharded by TP; a row-parallel output (w2) is the partial sum of
    every token. MoE blocks (grouped expert mm's) and dropout masks are not covered: they keep the Megatron sets."""
    if not applies or model.family != "llm":
        return {}
    mms = _op_sac_mms(h, a, g, dh, f, swiglu)
    kept = mms[0::2]  # every second mm is recomputed
    tp_bytes = ACT_BYTES * (sum(m.n for m in kept if m.tp_dim == "n") + a * dh) + 4 * a  # + SDPA out, fp32 LSE
    return {
        "act_sac_replicated_bytes": ACT_BYTES * h,
        "act_sac_tp_bytes": tp_bytes,
        "act_sac_unsharded_bytes": ACT_BYTES * sum(m.n for m in kept if m.tp_dim == "k"),
        "sac_recompute_gemms": mms[1::2],
    }


def te_fp8_saved_delta_bytes(h: int, a: int, dh: int, f: int, dense: bool) -> tuple[int, int]:
    """Per-token change of a layer's saved activations when Transformer Engine runs the GEMMs in FP8 (delayed
    scaling, TE v1.9 @e79d915): LayerNormLinear (QKV; dense fc1) casts the LayerNorm output to FP8 inside the norm
    and saves that FP8 shard (layernorm_linear.py lines 143-156, 317-327): -h B each, /SP; Linear saves its FP8
    input (linear.py lines 298-310): fc2's SwiGLU / GELU output, saved by no one else, -f B; proj's input is the
    attention output, which flash attention keeps in bf16 for its own backward: +a dh B for the FP8 copy. MoE
    layers: the attention part only (the router and token dispatch read the bf16 norm output)."""
    return -h * (2 if dense else 1), a * dh - (f if dense else 0)  # (replicated, TP-sharded) bytes per token


def _op_sac_mms(h: int, a: int, g: int, dh: int, f: int, swiglu: bool) -> tuple[Gemm, ...]:
    """The aten.mm's of a torchtitan Llama 3 block in the order they run: attention wq, wk, wv, wo
    (torchtitan/models/llama3/model/model.py @73a0e69, Attention.forward), then FeedForward's w2(silu(w1 x) * w3 x):
    w1, w3, w2 (gelu: w1, w2). Op SAC counts them per block and recomputes the even ones: wk, wo, w3 (gelu: w2)
    (torchtitan/distributed/activation_checkpoint.py @73a0e69, _apply_op_sac, lines 108-121)."""
    mlp = (Gemm("w1", h, f, "n"), Gemm("w3", h, f, "n")) if swiglu else (Gemm("w1", h, f, "n"),)
    return (Gemm("wq", h, a * dh, "n"), Gemm("wk", h, g * dh, "n"), Gemm("wv", h, g * dh, "n"),
            Gemm("wo", a * dh, h, "k"), *mlp, Gemm("w2", f, h, "k"))
