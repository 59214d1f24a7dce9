"""torchtitan's op-level selective AC: the recompute it runs (every second mm of the block, its elementwise ops,
the TP all-gathers), priced by hand on Llama 3.1 8B (h 4096, 32 heads, 8 KV heads of 128, ffn 14336, 32 layers)."""

from __future__ import annotations

import numpy as np
import pytest

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.ops import layer_ops
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.model.workload import lower

H, A, G, DH, F, LAYERS = 4096, 32, 8, 128, 14336, 32
SEQ, MBS = 8192, 2


def _problem(framework: str, gpus: int = 8, **task: object) -> Problem:
    return problem_from_dict({"model": "llama3-8b", "hardware": {"system": "dgx-h100", "gpus": [gpus]},
                              "task": {"seq_len": SEQ, "global_batch": 16, **task},
                              "stack": {"framework": framework}})


def test_torchtitan_selective_recomputes_wk_wo_w3_by_hand() -> None:
    """Op SAC saves the 1st, 3rd, 5th, 7th mm (wq, wv, w1, w2) and recomputes wk, wo, w3 at their own shapes."""
    p = _problem("torchtitan")
    plan = Plan(dp=8, zero=3, mbs=MBS, recompute="selective")
    plans = PlanArrays.from_plans([plan], [0])
    table = HardwareTable(p.hardware)
    ops = layer_ops(lower(p.model, p.training_task, p.stack), p.training_task, p.stack, table, plans)
    t = MBS * SEQ
    peak, eff, half = table.peak_flops("bf16")[0], table.gemm_eff[0], table.gemm_half_dim[0]
    mms = {"wk": (H, G * DH), "wo": (A * DH, H), "w3": (H, F)}
    rec = {r.name: r for r in ops.select("recompute", "recompute")}
    mm_s = 0.0
    for name, (k, n) in mms.items():
        flops = 2.0 * t * k * n
        d = min(t, k, n)
        assert rec[f"{name} (op sac)"].flops[0] == pytest.approx(flops, rel=1e-15)
        assert rec[f"{name} (op sac)"].time_s[0] == pytest.approx(flops / (peak * eff * d / (d + half)), rel=1e-12)
        mm_s += flops / (peak * eff * d / (d + half))
    (elem,) = [r for r in ops.select("compute", "fwd") if r.name == "elementwise"]
    # the attention output is saved (no attention recompute); norms, residuals, SiLU x mul run again
    assert ops.total_s("recompute", "recompute")[0] == pytest.approx(mm_s + elem.time_s[0], rel=1e-12)
    assert rec["attention"].time_s[0] == 0.0 and rec["qkv"].time_s[0] == 0.0


def test_torchtitan_selective_is_priced_between_none_and_full() -> None:
    """Step time none < selective < full; HFU - MFU is the recomputed mm FLOPs: 32 layers x 2 h (g dh + a dh + f)
    per token. Megatron-Core's selective under flash attention recomputes nothing: its price is none's."""
    p = _problem("torchtitan")
    recs = {rc: evaluate(p, [Plan(dp=8, zero=3, mbs=MBS, recompute=rc)])[0] for rc in ("none", "selective", "full")}
    assert recs["none"]["step_time_s"] < recs["selective"]["step_time_s"] < recs["full"]["step_time_s"]
    sel = recs["selective"]
    tokens = 16 * SEQ
    rc_flops = LAYERS * tokens * 2 * H * (G * DH + A * DH + F)
    peak = HardwareTable(p.hardware).peak_flops("bf16")[0]
    assert (sel["hfu"] - sel["mfu"]) * sel["step_time_s"] * 8 * peak == pytest.approx(rc_flops, rel=1e-9)
    m = _problem("megatron-core")
    none_s, sel_s = (evaluate(m, [Plan(dp=8, zero=3, mbs=MBS, recompute=rc)])[0]["step_time_s"]
                     for rc in ("none", "selective"))
    assert np.float64(sel_s) == np.float64(none_s)


def test_torchtitan_selective_reruns_the_sp_all_gathers() -> None:
    """With TP + SP op SAC keeps the reduce-scatters' outputs and runs the two all-gathers of the forward again:
    the recompute row is two all-gathers of the t x h bf16 activation (full recompute: both collectives)."""
    p = _problem("torchtitan", gpus=16, global_batch=16)
    table = HardwareTable(p.hardware)
    wl = lower(p.model, p.training_task, p.stack)
    plans = PlanArrays.from_plans([Plan(dp=2, tp=8, sp=True, zero=3, mbs=1, recompute=rc)
                                   for rc in ("selective", "full")], [0, 0])
    ops = layer_ops(wl, p.training_task, p.stack, table, plans)
    (fwd,) = ops.select("tp_comm", "fwd")
    (rc,) = ops.select("tp_comm", "recompute")
    assert rc.bytes[0] == rc.bytes[1] == fwd.bytes[0] == 2 * SEQ * H * 2
    assert rc.time_s[1] == fwd.time_s[1]
    assert 0.0 < rc.time_s[0] < fwd.time_s[0]  # the all-gathers alone
