"""Workload lowering: parameter counts, FLOPs and activation bytes, each computed by hand from the architecture.

Parameter counts are checked against the exact totals published for the released checkpoints where one exists
(Llama-2-70B 68,976,648,192; Llama-3-8B 8,030,261,248; ViT-L/16 303,301,632 without the classifier), and FLOPs
and activations against Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models").
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from conftest import toy_model
from madmax_opt.io import catalog
from madmax_opt.model.memory import layer_activation_bytes
from madmax_opt.model.spec import Stack, Task, TransformerModel
from madmax_opt.model.workload import TransformerWorkload, lower

KORTHIKANTI_STACK = Stack(dropout=True, flash_attention=False)  # GPT-3-era Megatron: dropout, unfused attention


def lowered(name: str, seq_len: int = 2048, stack: Stack | None = None, **task: int) -> TransformerWorkload:
    return lower(catalog.models()[name], Task(seq_len=seq_len, global_batch=8, **task), stack or Stack())


# ---------------------------------------------------------------------------------------- parameter counts


def test_llama2_70b_parameters_by_hand() -> None:
    # h = 8192, 64 query heads and 8 KV heads of 128, SwiGLU 28672, RMSNorm, no biases, vocab 32000, untied head
    qkv = 8192 * (64 + 2 * 8) * 128  # 83,886,080
    proj = 8192 * 8192  # 67,108,864
    mlp = 8192 * 2 * 28672 + 28672 * 8192  # gate + up, down: 704,643,072
    norms = 2 * 8192  # two RMSNorm scales
    layer = qkv + proj + mlp + norms
    assert layer == 855_654_400
    embedding = head = 32000 * 8192  # 262,144,000 each
    total = 80 * layer + embedding + head + 8192  # + final RMSNorm
    assert total == 68_976_648_192  # the released checkpoint's parameter count (~68.98e9)
    wl = lowered("llama2-70b", 4096)
    assert (wl.params_per_layer, wl.embedding_params, wl.head_params) == (layer, embedding, head)
    assert wl.params == total


def test_llama3_8b_parameters_by_hand() -> None:
    # h = 4096, 32 heads / 8 KV heads of 128, SwiGLU 14336, vocab 128256, untied
    layer = 4096 * (32 + 16) * 128 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert layer == 218_112_000
    total = 32 * layer + 2 * 128256 * 4096 + 4096
    assert total == 8_030_261_248  # the released checkpoint's parameter count
    assert lowered("llama3-8b", 8192).params == total


def test_gpt3_175b_parameters_by_hand() -> None:
    h = 12288
    # per layer: QKV 3h^2 + 3h, projection h^2 + h, MLP 4h^2 + 4h and 4h^2 + h, two LayerNorms 4h = 12h^2 + 13h
    layer = 12 * h * h + 13 * h
    assert layer == 1_812_099_072
    total = 96 * layer + 50257 * h + 2 * h  # tied embeddings counted once, final LayerNorm
    assert total == 174_579_093_504
    wl = lowered("gpt3-175b")
    assert wl.head_params == 0  # tied
    assert wl.params == total
    # Brown et al. 2020 Table 2.1 reports "175.0B"; the learned position embeddings (2048 x 12288 = 25.2M,
    # not modelled) would add 0.014 %.
    assert round(wl.params / 1e9) == 175


def test_megatron_gpt_22b_parameters_by_hand() -> None:
    h = 6144
    layer = 12 * h * h + 13 * h
    assert layer == 453_064_704
    total = 48 * layer + 51200 * h + 2 * h
    assert lowered("megatron-gpt-22b").params == total == 22_061_690_880


def test_vit_large_parameters_by_hand() -> None:
    h = 1024
    # patch projection 16*16*3 -> h with bias, class token, 197 positions, 24 layers, final LayerNorm
    total = 768 * h + h + h + 197 * h + 24 * (12 * h * h + 13 * h) + 2 * h
    assert total == 303_301_632  # ViT-L/16 backbone (304,326,632 with the 1000-class head)
    wl = lower(catalog.models()["vit-l"], Task(global_batch=8), Stack())
    assert wl.seq_len == 197
    assert wl.params == total


# --------------------------------------------------------------------------------------------------- FLOPs


def test_llama2_70b_flops_per_token_by_hand() -> None:
    s, h, L, V = 4096, 8192, 80, 32000
    gemm_params = 855_654_400 - 2 * 8192  # weights of the four GEMMs of one layer
    attention = 2 * 2 * s * h  # QK^T and AV: 2 s h MACs per token per layer (full s x s score matrix)
    forward = L * (2 * gemm_params + attention) + 2 * h * V  # + LM head GEMM
    assert forward == 148_163_788_800
    wl = lowered("llama2-70b", s)
    assert wl.model_flops_per_token == 3 * forward == 444_491_366_400  # fwd + 2x bwd
    # the same number as "6 N + 12 L s h" with N the GEMM parameters (layers + head)
    assert wl.model_flops_per_token == 6 * (L * gemm_params + h * V) + 12 * L * s * h


@pytest.mark.parametrize("name", ["megatron-gpt-22b", "megatron-gpt-175b", "gpt3-175b", "vtrain-gpt-3.6b"])
@pytest.mark.parametrize(("batch", "seq_len"), [(4, 2048), (1, 4096)])
def test_korthikanti_model_flops_formula(name: str, batch: int, seq_len: int) -> None:
    """72 B s L h^2 (1 + s/(6h) + V/(12 L h)) (Korthikanti et al. 2022, Sec. 6) for a GPT: MHA, GELU, f = 4h."""
    m = catalog.models()[name]
    assert m.ffn == 4 * m.hidden and m.ffn_kind == "gelu" and m.n_kv_heads == m.heads
    B, s, L, h, V = batch, seq_len, m.layers, m.hidden, m.vocab
    korthikanti = 72 * B * s * L * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))
    wl = lower(m, Task(seq_len=s, global_batch=B), Stack())
    assert wl.model_flops_per_token * B * s == korthikanti  # exact, in integers


@pytest.mark.parametrize(
    ("case", "gpus", "batch", "iter_s", "reported_mfu"),
    [  # data/validation/korthikanti2022_table5.yaml: measured time and the paper's MFU
        ("megatron-gpt-22b", 8, 4, 1.10, 0.417),
        ("megatron-gpt-175b", 64, 64, 13.75, 0.514),
        ("megatron-gpt-530b", 280, 280, 37.83, 0.560),
        ("megatron-gpt-1t", 512, 512, 71.49, 0.563),
    ],
)
def test_model_flops_reproduce_the_papers_mfu(
    case: str, gpus: int, batch: int, iter_s: float, reported_mfu: float
) -> None:
    wl = lowered(case, 2048)
    mfu = wl.model_flops_per_token * batch * 2048 / (iter_s * gpus * 312e12)
    assert mfu == pytest.approx(reported_mfu, abs=0.0005 + 1e-9)  # the paper rounds to 3 decimals


# ----------------------------------------------------------------------------------- activation bytes


def stored_bytes(wl: TransformerWorkload, tokens: int, tp: int, sp: bool, recompute: int) -> float:
    stored, _ = layer_activation_bytes(
        np.array([float(tokens)]), np.array([float(tp)]), np.array([int(sp)]), np.array([recompute]),
        wl.act_replicated_bytes, wl.act_tp_sharded_bytes,
        np.array([wl.seq_len * wl.act_score_bytes_per_key], dtype=np.float64), 2.0 * wl.model.hidden,
    )
    return float(stored[0])


def gpt(heads: int = 16, hidden: int = 2048, **fields: object) -> TransformerModel:
    return toy_model(hidden=hidden, heads=heads, ffn=4 * hidden, **fields)


@pytest.mark.parametrize(("s", "b", "h", "a"), [(2048, 1, 2048, 16), (1024, 4, 4096, 32), (2048, 4, 6144, 64)])
def test_korthikanti_equation_1_activations_per_layer(s: int, b: int, h: int, a: int) -> None:
    """sbh (34 + 5 a s / h) bytes per layer: 16-bit activations, dropout, unfused attention, no parallelism."""
    wl = lower(gpt(a, h), Task(seq_len=s, global_batch=b), KORTHIKANTI_STACK)
    per_token = wl.act_replicated_bytes + wl.act_tp_sharded_bytes + s * wl.act_score_bytes_per_key
    assert per_token == 34 * h + 5 * a * s
    assert stored_bytes(wl, s * b, 1, False, 0) == s * b * (34 * h + 5 * a * s)  # = sbh(34 + 5as/h), in integers


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tensor_and_sequence_parallel_activations(t: int) -> None:
    s, b, h, a = 2048, 2, 4096, 32
    sbh = s * b * h
    wl = lower(gpt(a, h), Task(seq_len=s, global_batch=b), KORTHIKANTI_STACK)
    # eq. 2: tensor parallel only: sbh (10 + 24/t + 5as/(ht))
    assert stored_bytes(wl, s * b, t, False, 0) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-14)
    # eq. 4: tensor + sequence parallel: sbh/t (34 + 5as/h)
    assert stored_bytes(wl, s * b, t, True, 0) == pytest.approx(sbh / t * (34 + 5 * a * s / h), rel=1e-14)
    # eq. 5/6: + selective recomputation: sbh 34/t
    assert stored_bytes(wl, s * b, t, True, 1) == pytest.approx(sbh * 34 / t, rel=1e-14)
    # full recomputation keeps only the layer input, 2sbh (sharded by SP)
    assert stored_bytes(wl, s * b, t, False, 2) == 2 * sbh
    assert stored_bytes(wl, s * b, t, True, 2) == pytest.approx(2 * sbh / t, rel=1e-14)


def test_without_dropout_the_masks_go() -> None:
    s, h, a = 2048, 4096, 32
    m = gpt(a, h)
    with_dropout = lower(m, Task(seq_len=s, global_batch=1), KORTHIKANTI_STACK)
    without = lower(m, Task(seq_len=s, global_batch=1), Stack(dropout=False, flash_attention=False))
    # two 1-byte masks of h per token (attention and MLP output dropout) leave the replicated part: 10h -> 8h
    assert with_dropout.act_replicated_bytes - without.act_replicated_bytes == 2 * h
    # the score matrix keeps only the 2-byte softmax output: 5as -> 2as per token
    assert without.act_score_bytes_per_key == 2 * a


def test_flash_attention_stores_no_score_matrix() -> None:
    wl = lower(gpt(), Task(seq_len=4096, global_batch=1), Stack(flash_attention=True))
    assert wl.act_score_bytes_per_key == 0
    assert wl.score_elementwise_bytes_per_key == 0


def test_gqa_and_swiglu_change_activations_as_derived() -> None:
    """Llama-2-70B per token per layer, no dropout: start from Korthikanti's MHA/GELU count and substitute."""
    h, a, g, dh, f = 8192, 64, 8, 128, 28672
    # MHA + GELU without dropout: replicated 8h (2 LN inputs 4h, QKV input 2h, MLP input 2h);
    # TP-sharded: Q 2h, K 2h, V 2h, projection input 2h, GELU input 2f and output 2f
    mha_gelu_tp = 2 * h + 2 * h + 2 * h + 2 * h + 2 * f + 2 * f
    # GQA: K and V shrink from h to g*dh = 1024 values each
    gqa = -2 * (2 * h - 2 * g * dh)
    # SwiGLU: gate and up outputs (2f each) and their product (2f) instead of GELU input and output
    swiglu = 3 * 2 * f - 2 * 2 * f
    wl = lowered("llama2-70b", 4096, Stack(flash_attention=True))
    assert wl.act_replicated_bytes == 8 * h
    assert wl.act_tp_sharded_bytes == mha_gelu_tp + gqa + swiglu == 8 * h - 4 * (h - g * dh) + 6 * f
    assert wl.act_score_bytes_per_key == 0
    # and with a x s scores stored (unfused attention): 2 bytes per score, a = 64 query heads
    unfused = lowered("llama2-70b", 4096, Stack(flash_attention=False))
    assert unfused.act_score_bytes_per_key == 2 * a


# ------------------------------------------------------------------------------------------- fine-tuning


def test_frozen_layers_and_lora_trainable_parameters() -> None:
    m = toy_model()  # 8 layers, h = 1024, f = 4096: 4 h^2 + 8 h^2 = 12,582,912 GEMM weights per layer
    frozen = lower(m, Task(kind="finetune", seq_len=1024, global_batch=8, frozen_layers=6), Stack())
    assert frozen.trainable_fraction == 2 / 8
    lora = lower(m, Task(kind="finetune", seq_len=1024, global_batch=8, lora_rank=16), Stack())
    assert lora.trainable_fraction == 0.0
    # rank-r adapters A (k x r) and B (r x n) on the four GEMMs: r (k + n) each
    h, f, r = 1024, 4096, 16
    assert lora.lora_params_per_layer == r * ((h + 3 * h) + (h + h) + (h + f) + (f + h))
    with pytest.raises(ValueError, match="frozen_layers"):
        lower(m, Task(kind="finetune", seq_len=1024, global_batch=8, frozen_layers=9), Stack())
