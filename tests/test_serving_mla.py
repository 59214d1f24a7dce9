"""MLA attention FLOPs in serving (issue 23): the decompressed multi-head form in prefill, the absorbed form over the
cached latent in decode (FlashMLA's count), checked by hand on DeepSeek-R1's dimensions."""

from __future__ import annotations

import numpy as np
import pytest

from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.inference import device, layer_pass_s
from madmax_opt.model.serving_calibration import CalibrationColumns
from madmax_opt.search.serving import ServingModel, ServingPlan


def test_mla_flops_per_key_by_hand() -> None:
    # DeepSeek-R1-0528 config.json: 128 heads, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # kv_lora_rank 512. Prefill: 2 x 128 x (128 + 64) for QK^T plus 2 x 128 x 128 for AV
    prefill = 2 * 128 * (128 + 64) + 2 * 128 * 128
    # decode (FlashMLA deep dive: 2 h_q s_q s_k (d_k + d_v), d_k = 576 latent + rope, d_v = 512 latent)
    decode = 2 * 128 * (576 + 512)
    m = ServingModel(problem_from_dict(_problem("deepseek-r1")))
    assert m.workload.attn_flops_per_key == prefill == 81_920
    assert m.workload.decode_attn_flops_per_key == decode == 278_528
    # a GQA model: one count, 4 a d_h (Llama-3-70B: 64 heads of 128)
    dense = ServingModel(problem_from_dict(_problem("llama3-70b"))).workload
    assert dense.attn_flops_per_key == dense.decode_attn_flops_per_key == 4 * 64 * 128
    assert catalog.models()["deepseek-r1"].mla_kv_dim == 512 + 64


def test_decode_attention_is_compute_bound_at_128_heads() -> None:
    """FlashMLA deep dive: with all 128 heads on a GPU (no TP), bf16 latent, the kernel's FLOPs per byte are
    h_q (d_k + d_v) / d_k = 241.8 FLOP/byte; the model's decode attention (fp8 latent: twice that) is then the
    compute term, t = tokens x keys x 278,528 / (peak16 x attn_eff), while a prefill pass with the same tokens and
    keys takes 81,920 / 278,528 of it once both are compute-bound."""
    m = ServingModel(problem_from_dict(_problem("deepseek-r1")))
    plans = m.arrays([ServingPlan(dp=8, tp=1, ep=8, batch=64, precision="fp8")])
    cal = CalibrationColumns.of([serving_catalog().prior], serving_catalog().frameworks["sglang"])
    dev = device(m.workload, m.task, m.table, plans, cal)
    tokens, keys = np.array([64.0]), np.array([4096.0])
    dec = layer_pass_s(m.workload, dev, tokens, keys, tokens * keys, decode=True)["attention"]
    pre = layer_pass_s(m.workload, dev, tokens, keys, tokens * keys)["attention"]
    peak16 = float(m.table.options[0].gpu.peak_flops["bf16"])
    by_hand = 64 * 4096 * 278_528 / (peak16 * serving_catalog().prior.attn_eff)
    kv_s = 64 * 4096 * 576 * 1.0 / (float(m.table.options[0].gpu.hbm_bw) * serving_catalog().prior.hbm_eff)
    assert by_hand > kv_s  # compute-bound
    assert float(dec[0]) == pytest.approx(by_hand, rel=1e-9)
    assert float(pre[0]) == pytest.approx(max(by_hand * 81_920 / 278_528, kv_s), rel=1e-9)


def _problem(model: str) -> dict[str, object]:
    return {"model": model, "hardware": {"gpu": "h200-sxm", "gpus": 8},
            "task": {"kind": "inference", "prompt_len": 1000, "output_len": 100, "precision": "fp8"},
            "stack": {"framework": "sglang"}}


def test_mla_widths_come_from_the_model_not_from_deepseek_v3() -> None:
    """An MLA model of other widths (half of DeepSeek-V3's, no query compression as in DeepSeek-V2-Lite) is priced
    with its own: prefill 2 a (d_nope + d_rope + d_v), decode 2 a ((kv_lora_rank + d_rope) + kv_lora_rank), a cache
    of kv_lora_rank + d_rope values per token and layer."""
    half = {"kv_lora_rank": 256, "q_lora_rank": None, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "v_head_dim": 64}
    model = {**catalog.models()["deepseek-r1"].model_dump(exclude={"name", "source", "mla"}), "mla": half}
    m = ServingModel(problem_from_dict({**_problem("deepseek-r1"), "model": model}))
    assert m.workload.attn_flops_per_key == 2 * 128 * (64 + 32 + 64)
    assert m.workload.decode_attn_flops_per_key == 2 * 128 * ((256 + 32) + 256)
    assert m.workload.model.mla_kv_dim == 256 + 32
