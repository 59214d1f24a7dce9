"""The op table of one layer (model/ops.py): rows that sum to the LayerCosts terms, FLOPs and bytes of a small layer derived by hand, one row per new effect, and `evaluate --ops`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli_helpers import run_main
from layer_sample import cases, costs
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model import layer_costs
from madmax_opt.model import ops as ops_module
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.ops import LayerOps, Op, layer_ops
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import COMM_INTERFERENCE
from madmax_opt.model.workload import lower

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-12  # plain sums vs the table's bracketed ones: rounding only


@pytest.fixture(scope="module")
def sample() -> list[tuple[str, Problem, PlanArrays]]:
    return cases()


def _ops(problem: Problem, plans: PlanArrays) -> LayerOps:
    wl = lower(problem.model, problem.training_task, problem.stack)
    return layer_ops(wl, problem.training_task, problem.stack, HardwareTable(problem.hardware), plans)


def _sum(rows: list[Op], n: int) -> np.ndarray:
    return np.sum([r.time_s for r in rows], axis=0) if rows else np.zeros(n)


def test_rows_sum_to_the_layer_terms(sample: list[tuple[str, Problem, PlanArrays]]) -> None:
    for name, problem, plans in sample:
        ops, lc, n = _ops(problem, plans), costs(problem, plans), len(plans)
        fwd, bwd = _sum(ops.select("compute", "fwd"), n), _sum(ops.select("compute", "bwd-input"), n)
        np.testing.assert_allclose(fwd + bwd, lc.time["compute"], rtol=RTOL, err_msg=name)
        np.testing.assert_allclose(bwd, lc.bwd_s, rtol=RTOL, err_msg=name)
        np.testing.assert_allclose(_sum(ops.select("compute", "bwd-weight"), n), lc.wgrad_s, rtol=RTOL, err_msg=name)
        np.testing.assert_allclose(_sum(ops.select("recompute"), n), lc.time["recompute"], rtol=RTOL, atol=0,
                                   err_msg=name)
        # collectives: the rows hold the whole traffic; the term holds its exposed part (+ the interference of the
        # hidden part, TP only) and ``hidden`` the rest
        tp = lc.time["tp_comm"] + (1.0 - COMM_INTERFERENCE) * lc.hidden["tp_comm"]
        np.testing.assert_allclose(_sum(ops.select("tp_comm"), n), tp, rtol=1e-9, atol=1e-15, err_msg=name)
        for term in ("cp_comm", "ep_comm"):
            np.testing.assert_allclose(_sum(ops.select(term), n), lc.time[term] + lc.hidden[term], rtol=RTOL,
                                       atol=1e-18, err_msg=f"{name} {term}")
        assert {r.pass_ for r in ops.rows} <= set(ops_module.PASSES)
        assert {r.roofline for r in ops.rows} <= set(ops_module.ROOFLINES)


def test_dense_flops_are_three_times_the_forward_model_flops(sample: list[tuple[str, Problem, PlanArrays]]) -> None:
    """fwd + bwd-input + bwd-weight = 3 x forward FLOPs of a layer (model FLOPs: full s^2 attention)."""
    for name, problem, plans in sample:
        if problem.model.moe is not None:
            continue
        ops = _ops(problem, plans)
        flops = np.sum([r.flops for r in ops.rows if r.pass_ != "recompute"], axis=0)
        wl = lower(problem.model, problem.training_task, problem.stack)
        expected = 3.0 * ops.tokens * wl.layer_flops_per_token / plans.tp
        np.testing.assert_allclose(flops, expected, rtol=RTOL, err_msg=name)


def test_hbm_rows_are_priced_at_hbm_bandwidth(sample: list[tuple[str, Problem, PlanArrays]]) -> None:
    for name, problem, plans in sample:
        ops = _ops(problem, plans)
        for r in ops.rows:
            if r.roofline == "hbm":
                np.testing.assert_allclose(r.time_s, r.bytes / ops.hbm_bw, rtol=RTOL, err_msg=f"{name} {r.name}")


# ---- a small layer by hand: h = 1024, 8 heads (no GQA), ffn 4096 GELU, s = 2048, mbs 2, tp 2 with SP ------------
H, A, F, S = 1024, 8, 4096, 2048
TOY: dict[str, Any] = {"name": "toy", "layers": 4, "hidden": H, "heads": A, "ffn": F, "vocab": 32000}


def _toy(precision: str) -> tuple[Problem, LayerOps]:
    problem = problem_from_dict({"model": TOY, "hardware": {"gpu": "h100-sxm", "gpus": 8},
                                 "task": {"seq_len": S, "global_batch": 16, "precision": precision}})
    plan = PlanArrays.from_plans([Plan(dp=4, tp=2, sp=True, mbs=2, recompute="full")], [0])
    return problem, _ops(problem, plan)


def _row(ops: LayerOps, name: str, pass_: str) -> Op:
    (row,) = [r for r in ops.rows if r.name == name and r.pass_ == pass_]
    return row


def test_small_layer_flops_and_bytes_by_hand() -> None:
    problem, ops = _toy("bf16")
    t, tp = 2 * S, 2  # tokens of the micro-batch on one GPU (cp = 1)
    by_hand = {
        "qkv": 2 * t * H * 3 * H / tp,  # Q, K, V projections: 2 FLOPs per MAC, n = (a + 2 kv) dh = 3h
        "proj": 2 * t * H * H / tp,
        "mlp_up": 2 * t * H * F / tp,
        "mlp_down": 2 * t * F * H / tp,
        "attention": 2 * (2 * t * S * H) / tp,  # QK^T and AV over the full s x s scores
    }
    for name, flops in by_hand.items():
        assert _row(ops, name, "fwd").flops[0] == pytest.approx(flops, rel=1e-15)
        assert _row(ops, name, "recompute").flops[0] == pytest.approx(flops, rel=1e-15)  # full recompute
    for name in ("qkv", "proj", "mlp_up", "mlp_down"):
        assert _row(ops, name, "bwd-input").flops[0] == _row(ops, name, "bwd-weight").flops[0] == by_hand[name]
    assert _row(ops, "attention", "bwd-input").flops[0] == pytest.approx(2 * by_hand["attention"], rel=1e-15)
    # 24 h^2 (1 + s / 6h) per token per layer forward (Korthikanti et al. 2022), three passes
    total = sum(float(r.flops[0]) for r in ops.rows if r.pass_ != "recompute")
    assert total == pytest.approx(3 * t * 24 * H * H * (1 + S / (6 * H)) / tp, rel=1e-12)
    # elementwise, forward: 2 LayerNorms (read + write 2h B) + 2 residual adds (read 2 x 2h, write 2h B) on the
    # sequence shard, GELU (read + write 2f B) on the TP shard
    elem = t * (2 * (2 * 2 * H) + 2 * (3 * 2 * H)) / tp + t * 2 * 2 * F / tp
    assert _row(ops, "elementwise", "fwd").bytes[0] == pytest.approx(elem, rel=1e-15)
    assert _row(ops, "elementwise", "bwd-input").bytes[0] == pytest.approx(2 * elem, rel=1e-15)
    # TP: two all-reduces of the t x h bf16 activation in forward and again in the full recompute
    assert _row(ops, "tp all-reduce x2 (sp: ag + rs)", "fwd").bytes[0] == 2 * t * H * 2
    # the QKV GEMM on the GEMM roofline: d = min(t, 3h / tp, h) = h
    table = HardwareTable(problem.hardware)
    eff = table.gemm_eff[0] * H / (H + table.gemm_half_dim[0])
    assert _row(ops, "qkv", "fwd").time_s[0] == pytest.approx(by_hand["qkv"] / (table.peak_flops("bf16")[0] * eff))
    assert not [r for r in ops.rows if r.name in ("fp8 cast", "softmax", "experts")]  # bf16, flash, dense


def test_small_layer_fp8_casts_by_hand() -> None:
    _, ops = _toy("fp8")
    t, tp, cast = 2 * S, 2, 6.0  # TE current scaling: amax read 2 B + cast-transpose read 2 B, write 1 + 1 B
    # forward: the input x of every GEMM (column-parallel: on the sequence shard, h / tp; row-parallel: k / tp)
    fwd = t * cast * (H / tp + H / tp + H / tp + F / tp)
    # backward: the output gradient dy (column-parallel: n / tp; row-parallel: on the sequence shard, h / tp)
    bwd = t * cast * (3 * H / tp + H / tp + F / tp + H / tp)
    assert _row(ops, "fp8 cast", "fwd").bytes[0] == pytest.approx(fwd, rel=1e-15)
    assert _row(ops, "fp8 cast", "bwd-input").bytes[0] == pytest.approx(bwd, rel=1e-15)


def test_a_new_effect_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row added to the table reaches the LayerCosts term of its pass with nothing else changed."""
    problem, _ = _toy("bf16")
    plans = PlanArrays.from_plans([Plan(dp=4, tp=2, sp=True, mbs=2, recompute="full")], [0])
    before = costs(problem, plans)
    extra = np.array([1e-4])

    def with_row(*args: Any) -> LayerOps:
        base = layer_ops(*args)
        row = Op("new kernel", "fwd", "compute", "hbm", "new", lambda: extra * 0.0, lambda: extra * base.hbm_bw, extra)
        return replace(base, rows=(*base.rows, row))

    monkeypatch.setattr(layer_costs, "layer_ops", with_row)  # the op table layer_costs reads
    after = costs(problem, plans)
    assert after.time["compute"][0] == pytest.approx(before.time["compute"][0] + 1e-4, rel=1e-12)
    assert after.time["recompute"][0] == before.time["recompute"][0]  # a fwd row; recompute rows are their own
    assert after.bwd_s[0] == before.bwd_s[0]


# ---- the command -------------------------------------------------------------------------------------------------


def test_evaluate_ops_json_sums_to_the_terms(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("{dp: 16, tp: 2, pp: 2, ep: 8, mbs: 1, recompute: full, sp: true}\n")
    out = run_main("evaluate", ROOT / "problems/mixtral-8x7b-h100.yaml", "--plan", plan, "--ops", "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    rows = rec["ops"]
    compute = sum(r["time_s"] for r in rows if r["term"] == "compute" and r["pass"] != "bwd-weight")
    assert compute == pytest.approx(rec["terms_s"]["compute"], rel=1e-12)
    wgrad = sum(r["time_s"] for r in rows if r["pass"] == "bwd-weight")
    assert wgrad == pytest.approx(rec["wgrad_s"], rel=1e-12)
    assert {"experts", "ep dispatch + combine", "attention"} <= {r["op"] for r in rows}
    assert any(r["roofline"].startswith("collective ep @ ") for r in rows)


def test_evaluate_ops_table() -> None:
    out = run_main("evaluate", ROOT / "problems/llama2-70b-h100.yaml", "--plan",
                   ROOT / "problems/plans/llama2-70b-3d.yaml", "--ops")
    assert out.returncode == 0, out.stderr
    assert "mlp_up" in out.stdout and "bwd-weight" in out.stdout and "layer terms" in out.stdout


@pytest.mark.parametrize("problem", ["serve-llama3-70b.yaml", "dlrm/dlrm-a-cloud.yaml"])
def test_evaluate_ops_refused_outside_training(problem: str) -> None:
    out = run_main("evaluate", ROOT / "problems" / problem, "--plan", ROOT / "problems/plans/llama2-70b-3d.yaml",
                   "--ops")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "`ops` does not apply" in lines[0] and "training" in lines[0]


def test_evaluate_ops_refuses_plot(tmp_path: Path) -> None:
    out = run_main("evaluate", ROOT / "problems/llama2-70b-h100.yaml", "--plan",
                   ROOT / "problems/plans/llama2-70b-3d.yaml", "--ops", "--plot", tmp_path)
    assert out.returncode == 2 and "--plot" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_evaluate_ops_uneven_mixed_pipeline_one_table_per_stage_kind(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("{dp: 4, tp: 8, pp: 8, mbs: 1, zero: 1, recompute: selective, sp: true, system: dgx-h100, "
                    "stage_layers: [14, 14, 14, 14, 10, 10, 10, 10], "
                    "stage_recompute: [full, full, none, none, full, full, none, none], "
                    "stage_systems: [dgx-h100, dgx-h100, dgx-h100, dgx-h100, dgx-a100, dgx-a100, dgx-a100, dgx-a100]}\n")
    out = run_main("evaluate", ROOT / "problems/gpt3-175b-mixed-pipeline.yaml", "--plan", plan, "--ops", "--json")
    assert out.returncode == 0, out.stderr
    recs = json.loads(out.stdout)
    kinds = [(r["stages"], r["plan"]["system"], r["plan"]["recompute"]) for r in recs]
    assert kinds == [([0, 1], "dgx-h100", "full"), ([2, 3], "dgx-h100", "none"), ([4, 5], "dgx-a100", "full"),
                     ([6, 7], "dgx-a100", "none")]
    h100, a100 = recs[0]["terms_s"], recs[2]["terms_s"]
    assert a100["compute"] > 2.0 * h100["compute"]  # bf16 dense peak: 312 vs 989 TFLOP/s
    assert recs[1]["terms_s"]["recompute"] == 0.0 < h100["recompute"]




def test_misspelled_term_or_pass_fails_loudly(sample: list[tuple[str, Problem, PlanArrays]]) -> None:
    """A typo in a term or pass name raises, never prices the cost at zero (issue 22)."""
    _, problem, plans = sample[0]
    ops = _ops(problem, plans)
    assert float(np.max(ops.total_s("compute", "fwd"))) > 0.0
    with pytest.raises(ValueError, match="unknown op term"):
        ops.total_s("compte", "fwd")
    with pytest.raises(ValueError, match="unknown op term"):
        ops.total_s("compute", "forward")
    r = ops.rows[0]
    with pytest.raises(ValueError, match="is not one of"):
        Op("x", "fwd", "tp-comm", "gemm", "g", r.flops_of, r.bytes_of, r.time_s)
