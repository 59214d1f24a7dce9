"""launch/hf_config.py: the catalog model as its checkpoint's config.json, read back by the project's own
Hugging Face reader (io/problem.model_from_hf_config) into the model that was priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from madmax_opt.io.catalog import models
from madmax_opt.io.problem import model_from_hf_config
from madmax_opt.launch.hf_config import hf_config

SHAPE = ("layers", "hidden", "heads", "kv_heads", "ffn", "ffn_kind", "vocab", "tied_embeddings", "norm", "bias",
         "mla")


@pytest.mark.parametrize("name", sorted(models()))
def test_every_written_config_reads_back_as_the_catalog_model(name: str, tmp_path: Path) -> None:
    m = models()[name]
    cfg = hf_config(m)
    if isinstance(cfg, str):
        assert cfg.startswith(f"{name}: ")  # one line saying why (MLA, GELU GPTs, unknown context)
        return
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    back = model_from_hf_config(path, file=None)
    assert {k: getattr(back, k) for k in SHAPE} == {k: getattr(m, k) for k in SHAPE}
    assert (back.moe is None) == (m.moe is None)
    if m.moe is not None and back.moe is not None:
        assert (back.moe.num_experts, back.moe.top_k, back.moe.expert_ffn, back.moe.shared_experts) == \
            (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn, m.moe.shared_experts)


def test_llama_configs_by_hand() -> None:
    """The published config.json values (meta-llama/Llama-2-70b-hf, meta-llama/Meta-Llama-3-70B,
    mistralai/Mixtral-8x7B-v0.1) for the keys the serving frameworks read."""
    l2, l3, mx = (hf_config(models()[n]) for n in ("llama2-70b", "llama3-70b", "mixtral-8x7b"))
    assert isinstance(l2, dict) and isinstance(l3, dict) and isinstance(mx, dict)
    assert (l2["num_key_value_heads"], l2["max_position_embeddings"], l2["rope_theta"], l2["torch_dtype"]) == \
        (8, 4096, 10000.0, "float16")
    assert (l3["vocab_size"], l3["max_position_embeddings"], l3["rope_theta"], l3["torch_dtype"]) == \
        (128256, 8192, 500000.0, "bfloat16")
    assert (mx["architectures"], mx["num_local_experts"], mx["num_experts_per_tok"], mx["intermediate_size"],
            mx["max_position_embeddings"]) == (["MixtralForCausalLM"], 8, 2, 14336, 32768)


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-r1"])
def test_deepseek_configs_by_hand(name: str, tmp_path: Path) -> None:
    """DeepSeek-V3 / R1-0528 (MLA MoE, FP8 checkpoint): the values of the Hugging Face config.json of
    deepseek-ai/DeepSeek-V3 and deepseek-ai/DeepSeek-R1-0528 for the keys DeepseekV3Config reads, and the priced
    shape read back (the catalog's 576-value MLA latent = kv_lora_rank 512 + qk_rope_head_dim 64)."""
    cfg = hf_config(models()[name])
    assert isinstance(cfg, dict)
    published = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "rope_theta": 10000, "topk_method": "noaux_tc", "n_group": 8,
        "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "norm_topk_prob": True,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
    }
    assert {k: cfg[k] for k in published} == published
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    back = model_from_hf_config(path, file=None)
    assert (back.mla_kv_dim, back.ffn, back.moe and back.moe.shared_experts) == (512 + 64, 2048, 1)


def test_models_without_a_known_config_are_refused_with_the_reason() -> None:
    scout, gpt3 = hf_config(models()["llama4-scout"]), hf_config(models()["gpt3-175b"])
    assert isinstance(scout, str) and scout.startswith("llama4-scout: ")
    assert isinstance(gpt3, str) and "not a Llama-style model" in gpt3
