"""Pipeline schedule: bubble (p-1)/v micro-batch times (Narayanan et al. 2021), and a 2-stage step by hand."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from conftest import ProblemFactory, toy_model
from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.model.pipeline import bubble_time_s
from madmax_opt.model.spec import Plan


def arr(x: float) -> np.ndarray:
    return np.array([float(x)])


@pytest.mark.parametrize(
    ("p", "v", "t", "expected"),
    [(1, 1, 0.1, 0.0), (2, 1, 0.1, 0.1), (4, 1, 0.1, 0.3), (4, 2, 0.1, 0.15), (8, 3, 0.3, 0.7)],
)
def test_bubble_is_p_minus_1_over_v_stage_times(p: int, v: int, t: float, expected: float) -> None:
    assert float(bubble_time_s(arr(p), arr(v), arr(t))[0]) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (8, 1, 64), (8, 2, 16), (4, 4, 4)])
def test_balanced_pipeline_bubble_fraction(p: int, v: int, m: int) -> None:
    t = 0.01  # every stage takes the same time per micro-batch
    total = m * t + float(bubble_time_s(arr(p), arr(v), arr(t))[0])  # the step of a balanced pipeline
    assert total == pytest.approx(m * t + (p - 1) / v * t, rel=1e-14)
    # Narayanan et al. 2021: bubble time fraction (p - 1) / (v m) of the ideal time
    assert (total - m * t) / (m * t) == pytest.approx((p - 1) / (v * m), rel=1e-12)


def test_no_pipeline_no_bubble(make_problem: ProblemFactory) -> None:
    problem = make_problem(toy_model(), gpus=8, global_batch=16)
    recs = evaluate(problem, [Plan(dp=8), Plan(dp=2, tp=4), Plan(tp=8, mbs=4, recompute="full")])
    for rec in recs:
        assert rec["time_breakdown_s"]["bubble"] == 0.0


# ---------------------------------------------------------- a two-stage pipeline of the toy GPT, by hand

# toy GPT: L = 8, h = 1024, 8 heads of 128, f = 4h (GELU), vocab 1000, untied; seq 1024, mbs 1, gbs 16
# toy GPU: GEMMs at 0.5 x 1e15 FLOP/s, flash attention at 0.25 x 1e15, memory-bound ops at 0.5 x 2e12 B/s
GEMM_S = F(1, 5 * 10**14)  # seconds per GEMM FLOP
ATTN_S = F(1, 25 * 10**13)  # seconds per attention FLOP
HBM_S = F(1, 10**12)  # seconds per byte of memory-bound traffic
TOKENS = 1024
H, FFN, V, S = 1024, 4096, 1000, 1024
# one layer, one micro-batch, forward
GEMM_FWD = TOKENS * 2 * (H * 3 * H + H * H + H * FFN + FFN * H) * GEMM_S  # 25,769,803,776 FLOPs
ATTN_FWD = TOKENS * 4 * S * H * F(1, 2) * ATTN_S  # QK^T + AV, causal half skipped by the flash kernel
ELEM_FWD = TOKENS * 2 * (2 * 2 * H + 2 * 3 * H + 2 * FFN) * HBM_S  # 2 norms, 2 residual adds, GELU (bf16)
# backward: activation + weight gradients (2x the GEMMs), flash backward 2.5x forward, elementwise 2x
LAYER = GEMM_FWD + ATTN_FWD + ELEM_FWD + 2 * GEMM_FWD + F(5, 2) * ATTN_FWD + 2 * ELEM_FWD
EMB = TOKENS * H * 2 * 3 * HBM_S  # embedding lookup fwd + bwd traffic
HEAD = 3 * TOKENS * 2 * H * V * GEMM_S + TOKENS * V * 4 * 3 * HBM_S  # LM head GEMMs + fp32 softmax/loss
P2P = TOKENS * H * 2 / F(10**11) + F(1, 10**5)  # one activation over NVLink (100e9 B/s) + 10 us
LAYER_PARAMS = 12 * H * H + 4 * H
OPTIMIZER = 34 * HBM_S  # Adam: 34 bytes of HBM traffic per trainable parameter


def test_layer_time_by_hand() -> None:
    assert F(25_769_803_776, 5 * 10**14) == GEMM_FWD
    assert float(LAYER) == pytest.approx(2.97929801728e-4, rel=1e-12)
    assert float(HEAD) == pytest.approx(2.4870912e-5, rel=1e-12)


@pytest.mark.parametrize("vpp", [1, 2])
def test_two_stage_step_by_hand(make_problem: ProblemFactory, vpp: int) -> None:
    problem = make_problem(toy_model(), gpus=2, global_batch=16, seq_len=S)
    (rec,) = evaluate(problem, [Plan(pp=2, vpp=vpp, mbs=1)])
    m = 16
    pp_comm = 2 * vpp * P2P  # activation forward, gradient backward, once per virtual chunk
    first = 4 * LAYER + EMB + pp_comm
    last = 4 * LAYER + HEAD + pp_comm  # the LM head outweighs the embedding: the bottleneck
    assert last > first
    optimizer = (4 * LAYER_PARAMS + V * H) * OPTIMIZER  # each stage: 4 layers + embedding or head
    bubble = F(1, vpp) * (first + last) / 2  # (p - 1)/v x mean stage time
    expected = {
        "compute": m * (4 * LAYER + HEAD),
        "pp_comm": m * pp_comm,
        "bubble": bubble,
        "optimizer": optimizer,
        "dp_comm": 0,
        "tp_comm": 0,
        "recompute": 0,
    }
    br = rec["time_breakdown_s"]
    for k, v in expected.items():
        assert br[k] == pytest.approx(float(v), rel=1e-12, abs=1e-18), k
    step = m * last + bubble + optimizer
    assert rec["step_time_s"] == pytest.approx(float(step), rel=1e-12)
    if vpp == 1:
        assert float(step) == pytest.approx(0.023472423061504, rel=1e-12)
