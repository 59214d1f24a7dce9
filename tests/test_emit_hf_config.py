"""launch/hf_config.py: the catalog model as its checkpoint's config.json, read back by the project's own
Hugging Face reader (io/problem.model_from_hf_config) into the model that was priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from madmax_opt.io.catalog import models
from madmax_opt.io.problem import model_from_hf_config
from madmax_opt.launch.hf_config import hf_config

SHAPE = ("layers", "hidden", "heads", "kv_heads", "ffn", "ffn_kind", "vocab", "tied_embeddings", "norm", "bias")


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
        assert (back.moe.num_experts, back.moe.top_k, back.moe.expert_ffn) == \
            (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn)


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
    assert isinstance(hf_config(models()["deepseek-v3"]), str)
