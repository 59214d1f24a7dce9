"""A catalog model as the Hugging Face ``config.json`` its checkpoint ships, for a serving framework's own model
config (vLLM's ``create_engine_config``) to be built from what was priced, without the hub.

Written for the architectures whose ``config.json`` keys the catalog determines: Llama-style dense models
(SwiGLU, RMSNorm; transformers ``models/llama/configuration_llama.py``) and Mixtral-style MoE (``models/mixtral/
configuration_mixtral.py``: ``num_local_experts``, ``num_experts_per_tok``), and DeepSeek-V3-style MLA MoE
(``models/deepseek_v3/configuration_deepseek_v3.py``: DeepseekV3Config's keys, the FP8 checkpoint's
quantization_config). Others (GELU/LayerNorm GPTs, Llama 4's shared-expert MoE) are refused with the reason. The
inverse of :func:`madmax_opt.io.problem.model_from_hf_config` on these keys.
"""

from __future__ import annotations

from typing import Any

from madmax_opt.launch.startup import positions_of
from madmax_opt.model.spec import TransformerModel

# the checkpoint's torch_dtype by the catalog's native precision (fp8 / mxfp4 checkpoints keep bf16 non-quantized
# tensors and state the quantization separately: not written here)
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
RMS_NORM_EPS = 1e-5  # meta-llama/Llama-2-70b-hf and Meta-Llama-3-70B config.json rms_norm_eps


def hf_config(m: TransformerModel) -> dict[str, Any] | str:
    """The config.json of catalog model ``m``, or why it cannot be written from the catalog (a string)."""
    pos = positions_of(m)
    if m.ffn_kind != "swiglu" or m.norm != "rmsnorm" or pos.kind != "rope":
        return f"{m.name}: not a Llama-style model (ffn {m.ffn_kind}, norm {m.norm}, positions {pos.kind})"
    if pos.context is None:
        return f"{m.name}: its context (max_position_embeddings) is not in data/flags/model-positions.yaml"
    if m.mla_kv_dim is not None:
        return _deepseek_v3(m)
    if m.moe is not None and m.moe.shared_experts:
        return f"{m.name}: a shared-expert MoE without MLA (Llama 4) needs keys the catalog does not hold"
    if m.native_precision not in TORCH_DTYPE:
        return f"{m.name}: a {m.native_precision} checkpoint (quantization_config not written)"
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": m.layers,
        "hidden_size": m.hidden, "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads or m.heads,
        "intermediate_size": m.ffn, "vocab_size": m.vocab, "hidden_act": "silu", "rms_norm_eps": RMS_NORM_EPS,
        "tie_word_embeddings": m.tied_embeddings, "attention_bias": m.bias, "mlp_bias": m.bias,
        "rope_theta": float(pos.rope_theta), "max_position_embeddings": pos.context,
        "torch_dtype": TORCH_DTYPE[m.native_precision], "bos_token_id": 1, "eos_token_id": 2,
    }
    if pos.scaling is not None:
        s = pos.scaling
        cfg["rope_scaling"] = {"rope_type": s.type, "factor": s.factor,
                               "original_max_position_embeddings": s.original_max_position_embeddings}
        if s.type == "llama3":
            cfg["rope_scaling"] |= {"low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor}
    if m.moe is not None:
        cfg |= {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": m.moe.num_experts, "num_experts_per_tok": m.moe.top_k,
                "intermediate_size": m.moe.expert_ffn or m.ffn}
        for key in ("attention_bias", "mlp_bias"):
            del cfg[key]
    return cfg


# DeepSeek-V3's config.json keys that the catalog does not hold (the cost model prices the 3 dense layers as MoE
# layers: data/models.yaml), as the Hugging Face config.json of deepseek-ai/DeepSeek-V3 and
# deepseek-ai/DeepSeek-R1-0528 ship them (the two are identical on these keys): the dense layers before the first
# MoE layer and their FFN width, the router (noaux_tc top-k over 8 groups, 4 of them kept; sigmoid scores,
# normalised, scaled 2.5), the multi-token-prediction layer, RMSNorm eps, YaRN's attention-scale keys and the
# block-scaled FP8 weights. The MLA widths are the catalog model's (``mla``, which prices MLA attention).
DEEPSEEK_V3_REST = {
    "first_k_dense_replace": 3, "intermediate_size": 18432, "moe_layer_freq": 1,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-6,
}
DEEPSEEK_V3_YARN = {"beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
DEEPSEEK_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
DEEPSEEK_CHECKPOINTS = ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1-0528")


def _deepseek_v3(m: TransformerModel) -> dict[str, Any] | str:
    """DeepseekV3ForCausalLM's config.json: the catalog's shape (layers, hidden, heads, routed / shared experts,
    top-k, expert width, vocab, the MLA widths, RoPE and context), the rest from :data:`DEEPSEEK_V3_REST` (a
    DeepSeek-V3 checkpoint's)."""
    pos, moe, mla = positions_of(m), m.moe, m.mla
    if m.hf_id not in DEEPSEEK_CHECKPOINTS or moe is None or mla is None or pos.scaling is None or pos.scaling.type != "yarn" \
            or pos.context is None:
        return f"{m.name}: an MLA model other than DeepSeek-V3 / R1 (its MLA ranks and router are not known here)"
    if m.native_precision not in ("fp8", *TORCH_DTYPE):
        return f"{m.name}: a {m.native_precision} MLA checkpoint (quantization_config not written)"
    s = pos.scaling
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": m.layers,
        "hidden_size": m.hidden, "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads or m.heads,
        "vocab_size": m.vocab, "hidden_act": "silu", "tie_word_embeddings": m.tied_embeddings,
        "attention_bias": m.bias, "n_routed_experts": moe.num_experts, "n_shared_experts": moe.shared_experts,
        "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.expert_ffn or m.ffn,
        **mla.model_dump(), **DEEPSEEK_V3_REST,
        "rope_theta": pos.rope_theta, "max_position_embeddings": pos.context,
        "rope_scaling": {**DEEPSEEK_V3_YARN, "factor": s.factor,
                         "original_max_position_embeddings": s.original_max_position_embeddings, "type": s.type},
        "torch_dtype": "bfloat16" if m.native_precision == "fp8" else TORCH_DTYPE[m.native_precision],
        "bos_token_id": 0, "eos_token_id": 1,
    }
    if m.native_precision == "fp8":
        cfg["quantization_config"] = dict(DEEPSEEK_FP8)
    return cfg
