"""A catalog model as the Hugging Face ``config.json`` its checkpoint ships, for a serving framework's own model
config (vLLM's ``create_engine_config``) to be built from what was priced, without the hub.

Written for the architectures whose ``config.json`` keys the catalog determines: Llama-style dense models
(SwiGLU, RMSNorm; transformers ``models/llama/configuration_llama.py``) and Mixtral-style MoE (``models/mixtral/
configuration_mixtral.py``: ``num_local_experts``, ``num_experts_per_tok``). Others (MLA, GELU/LayerNorm GPTs) are
refused with the reason. The inverse of :func:`madmax_opt.io.problem.model_from_hf_config` on these keys.
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
    if m.mla_kv_dim is not None or (m.moe is not None and m.moe.shared_experts):
        return f"{m.name}: MLA / shared experts (DeepSeek) need keys the catalog does not hold"
    if pos.context is None:
        return f"{m.name}: its context (max_position_embeddings) is not in data/flags/model-positions.yaml"
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
