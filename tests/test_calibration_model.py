"""Issue 11 model effects, each recomputed by hand from the catalog numbers: FP8 / MXFP8 GEMMs and casts, FP8
weight copies, FSDP's exposed first all-gather and float8 all-gather, the (GPU, framework) calibration choice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import calibration, catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.collectives import all_gather_s, reduce_scatter_s
from madmax_opt.model.compute import CAST_BYTES_PER_ELEMENT, cast_time_s
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import layer_costs, stage_costs
from madmax_opt.model.workload import lower

H, HEADS, FFN, SEQ = 1024, 8, 4096, 2048
MODEL: dict[str, Any] = {"name": "toy", "layers": 4, "hidden": H, "heads": HEADS, "ffn": FFN, "vocab": 32000}


def _problem(precision: str, framework: str = "megatron-core", gpu: str = "h100-sxm", gpus: int = 8) -> Problem:
    return problem_from_dict({"model": MODEL, "hardware": {"gpu": gpu, "gpus": gpus},
                              "task": {"seq_len": SEQ, "global_batch": 8, "precision": precision},
                              "stack": {"framework": framework}})


def _layer(problem: Problem, plan: Plan) -> Any:
    table = HardwareTable(problem.hardware)
    wl = lower(problem.model, problem.training_task, problem.stack)
    return layer_costs(wl, problem.training_task, problem.stack, table, PlanArrays.from_plans([plan], [0])), table


def _gemm_s(flops: float, dim: float, peak: float, eff: float, half: float) -> float:
    return flops / (peak * eff * dim / (dim + half))


# (k, n) of the toy layer's GEMMs at tp = 1: QKV, projection, MLP up, MLP down (GELU)
GEMMS = ((H, 3 * H), (H, H), (H, FFN), (FFN, H))


def test_cast_bytes_per_element() -> None:
    # per-tensor current scaling: amax read 2 B + cast-transpose read 2 B, write 1 + 1 B; MXFP8: 2 + 2 x (1 + 1/32)
    assert CAST_BYTES_PER_ELEMENT == {"fp8": 6.0, "mxfp8": 4.0625}
    assert cast_time_s(np.array([1e9]), "fp8", np.array([2e12]))[0] == pytest.approx(3e-3)
    assert cast_time_s(np.array([1e9]), "bf16", np.array([2e12]))[0] == 0.0


COLUMN_PARALLEL = (True, False, True, False)  # QKV and MLP up shard n over TP; projection and MLP down shard k


@pytest.mark.parametrize(("precision", "tp", "gpu"), [("fp8", 1, "h100-sxm"), ("mxfp8", 1, "b200"),
                                                      ("fp8", 2, "h100-sxm")])
def test_fp8_gemms_at_the_fp8_peak_attention_stays_bf16(precision: str, tp: int, gpu: str) -> None:
    plan = Plan(dp=8 // tp, tp=tp, sp=tp > 1, mbs=1)
    low, table = _layer(_problem(precision, gpu=gpu), plan)  # MXFP8 needs Blackwell
    bf, _ = _layer(_problem("bf16", gpu=gpu), plan)
    cal = table.options[0].gpu.calibration
    peaks = table.options[0].gpu.peak_flops
    fp8_eff = (cal.fp8_gemm_eff or cal.gemm_eff) * (cal.mxfp8_gemm_ratio if precision == "mxfp8" else 1.0)
    tokens = float(SEQ)
    # per-GPU GEMM: FLOPs / tp; smallest dimension of tokens, the TP-sharded one and the other
    dims = [min(tokens, n / tp, k) if col else min(tokens, k / tp, n) for (k, n), col in zip(GEMMS, COLUMN_PARALLEL, strict=True)]
    gemm_fp8 = sum(_gemm_s(tokens * 2 * k * n / tp, d, peaks["fp8"], fp8_eff, cal.gemm_half_dim)
                   for (k, n), d in zip(GEMMS, dims, strict=True))
    gemm_bf16 = sum(_gemm_s(tokens * 2 * k * n / tp, d, peaks["bf16"], cal.gemm_eff, cal.gemm_half_dim)
                    for (k, n), d in zip(GEMMS, dims, strict=True))
    assert low.wgrad_s[0] == pytest.approx(gemm_fp8, rel=1e-12)
    assert bf.wgrad_s[0] == pytest.approx(gemm_bf16, rel=1e-12)
    # casts: x (tokens x k) forward, dy (tokens x n) backward, memory-bound at hbm_bw x hbm_eff; the TP-sharded
    # operand is 1/tp, and with SP the other one is cast on its sequence shard (1/tp) before the FP8 all-gather
    cast = sum(tokens * (k + n) / tp for k, n in GEMMS) * CAST_BYTES_PER_ELEMENT[precision] / table.hbm_bw[0]
    # compute = fwd + bwd: the GEMMs twice (fwd + activation-grad) plus casts; attention and elementwise unchanged
    delta = low.time["compute"][0] - bf.time["compute"][0]
    assert delta == pytest.approx(2.0 * (gemm_fp8 - gemm_bf16) + cast, rel=1e-9)


def test_mxfp8_gemm_ratio_scales_the_gemm_time() -> None:
    problem = _problem("mxfp8", gpu="gb200")
    cal = problem.hardware[0].gpu.calibration
    fp8, _ = _layer(_problem("fp8", gpu="gb200"), Plan(dp=8))
    mx, _ = _layer(problem, Plan(dp=8))
    assert mx.wgrad_s[0] == pytest.approx(fp8.wgrad_s[0] / cal.mxfp8_gemm_ratio, rel=1e-12)


@pytest.mark.parametrize(("framework", "copy_bytes"), [("megatron-core", 2.0), ("torchtitan", 0.0)])
def test_fp8_weight_copies_in_memory(framework: str, copy_bytes: float) -> None:
    plan = PlanArrays.from_plans([Plan(dp=8)], [0])
    out = {}
    for precision in ("bf16", "fp8"):
        p = _problem(precision, framework)
        lc, table = _layer(p, Plan(dp=8))
        one = np.ones(1)
        st = stage_costs(lc, p.stack, table.hbm_bw[plan.hw], 4.0 * one, one, one, one)
        out[precision] = float(st.memory.weights[0])
    params = 4 * (4 * H * H + 2 * H * FFN + 2 * 2 * H) + 2 * 32000 * H  # layers + embedding and untied head
    assert out["fp8"] - out["bf16"] == pytest.approx(copy_bytes * params, rel=1e-12)


@pytest.mark.parametrize(("framework", "precision", "gather_bytes"),
                         [("pytorch-fsdp", "bf16", 2.0), ("torchtitan", "fp8", 1.0), ("torchtitan", "bf16", 2.0)])
def test_fsdp_first_gather_and_last_reduce_scatter_stay_exposed(framework: str, precision: str,
                                                                 gather_bytes: float) -> None:
    # 8 GPUs, ZeRO-3: the compute of a micro-batch hides all but the first layer's gather of each pass (fwd, bwd)
    # and the last reduce-scatter; torchtitan gathers FP8 weights for Float8 linears
    p = _problem(precision, framework)
    lc, table = _layer(p, Plan(dp=8, zero=3, mbs=1))
    one = np.ones(1)
    st = stage_costs(lc, p.stack, table.hbm_bw[:1], 4.0 * one, 0.0 * one, 0.0 * one, one)
    tiers, g, tp = lc.tiers, np.array([8.0]), np.array([1.0])
    layer_params = 4 * H * H + 2 * H * FFN + 2 * 2 * H
    first = 2.0 * all_gather_s(layer_params * gather_bytes, g, tp, tiers) + reduce_scatter_s(layer_params * 4.0, g,
                                                                                            tp, tiers)
    assert st.time["zero3_comm"][0] == pytest.approx(float(first[0]), rel=1e-12)
    total = 2.0 * all_gather_s(4 * layer_params * gather_bytes, g, tp, tiers) + reduce_scatter_s(
        4 * layer_params * 4.0, g, tp, tiers)
    assert st.hidden["zero3_comm"][0] == pytest.approx(float(total[0] - first[0]), rel=1e-12)


def test_framework_selects_its_calibration_and_flags_uncalibrated_pairs() -> None:
    h100 = catalog.gpus()["h100-sxm"]
    for framework, fitted in h100.frameworks.items():
        gpu = _problem("bf16", framework).hardware[0].gpu
        assert gpu.calibration.gemm_eff == fitted.gemm_eff or fitted.gemm_eff is None
        rec = calibration.record(gpu, framework)
        assert rec.status == "calibrated" and rec.runs == fitted.fit.runs
    # MI300X has no fit: its datasheet prior moved by the Megatron family's pooled factors, flagged uncalibrated
    mi = _problem("bf16", gpu="mi300x").hardware[0].gpu
    prior, family = catalog.gpus()["mi300x"].calibration, catalog.families()["megatron"]
    assert mi.calibration.gemm_eff == pytest.approx(min(1.0, prior.gemm_eff * family.factors["gemm_eff"]), rel=1e-12)
    assert mi.calibration.attn_eff == pytest.approx(min(1.0, prior.attn_eff * family.factors["attn_eff"]), rel=1e-12)
    rec = calibration.record(mi, "megatron-core")
    assert (rec.status, rec.level, rec.runs) == ("uncalibrated", "family:megatron", family.fit.runs)


def test_scaled_calibration_by_hand() -> None:
    # h100 prior: gemm_eff 0.70, attn_eff 0.35, layer_overhead_s 0, fp8_gemm_eff unset (= gemm_eff)
    prior = catalog.gpus()["h100-sxm"].calibration
    moved = prior.scaled({"gemm_eff": 0.5, "attn_eff": 4.0, "layer_overhead_s": 2e-4})
    assert moved.gemm_eff == pytest.approx(0.35, rel=1e-12)
    assert moved.attn_eff == 1.0  # capped at the peak
    assert moved.layer_overhead_s == pytest.approx(2e-4, rel=1e-12)
    assert moved.fp8_gemm_eff is None and moved.value("fp8_gemm_eff") == pytest.approx(0.35)  # unset: follows gemm
    assert prior.scaled({"gemm_eff": 0.5, "fp8_gemm_eff": 1.0}).fp8_gemm_eff == pytest.approx(0.70)  # own factor


def test_a_fitted_prior_is_never_moved_by_a_family() -> None:
    # the A100 prior is the 2022 Megatron fit (prior_kind fitted): a framework without a pair fit keeps it
    gpu = _problem("bf16", "torchtitan", gpu="a100-80gb").hardware[0].gpu
    assert gpu.calibration == catalog.gpus()["a100-80gb"].calibration
    rec = calibration.record(gpu, "torchtitan")
    assert (rec.status, rec.level) == ("uncalibrated", "prior")


def test_every_modern_gpu_resolves() -> None:
    for system, gpu in (("dgx-h100", "h100-sxm"), ("grand-teton-h100-hbm2e", "h100-hbm2e-96gb"),
                        ("dgx-b200", "b200"), ("gb200-nvl72", "gb200"), ("dgx-h200", "h200-sxm"),
                        ("mi300x-platform", "mi300x")):
        assert catalog.systems()[system].gpu == gpu
    assert catalog.gpus()["h100-hbm2e-96gb"].standard_system == "grand-teton-h100-hbm2e"


@pytest.mark.parametrize(("section", "value", "message"), [
    ("task", {"seq_len": SEQ, "global_batch": 8, "precision": "fp6"}, "task.precision: unknown value 'fp6'"),
    ("stack", {"framework": "deepspeed"}, "stack.framework: unknown value 'deepspeed'"),
])
def test_bad_precision_or_framework_is_one_line(section: str, value: dict[str, Any], message: str) -> None:
    data: dict[str, Any] = {"model": MODEL, "hardware": {"gpu": "h100-sxm", "gpus": 8},
                            "task": {"seq_len": SEQ, "global_batch": 8}}
    data[section] = value
    with pytest.raises(ProblemError) as exc:
        problem_from_dict(data, source="p.yaml")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_uncalibrated_text_names_the_family_that_priced_it() -> None:
    from madmax_opt.report.report import calibration_text

    gpu = _problem("bf16", gpu="h200-sxm").hardware[0].gpu
    runs = catalog.families()["megatron"].fit.runs
    text = calibration_text({"calibration": calibration.record_dict(gpu, "megatron-core")})  # type: ignore[typeddict-item]
    assert text == f"[yellow]uncalibrated[/yellow] (h200-sxm / megatron-core: family:megatron, pooled fit on {runs} runs)"


def test_the_training_order_does_not_depend_on_the_catalog_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training hardware order is hardware_spec.hardware_order's two passes: every catalog GPU under every
    training framework gets the same calibration whichever order the catalog lists the GPUs in (the one-pass order
    it replaced moved a calibration GPU by GPU, in catalog order)."""
    from madmax_opt.model.spec import FRAMEWORKS

    gpus = catalog.gpus()
    forward = {(g, f): calibration.with_framework(gpu, f).calibration for g, gpu in gpus.items() for f in FRAMEWORKS}
    monkeypatch.setattr(catalog, "gpus", lambda: dict(reversed(list(gpus.items()))))
    backward = {(g, f): calibration.with_framework(gpu, f).calibration for g, gpu in gpus.items() for f in FRAMEWORKS}
    assert forward == backward
