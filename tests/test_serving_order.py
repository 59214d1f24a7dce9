"""Serving calibration's hardware order (issue 24, model/serving_calibration.ordered): a GPU at least as good as
another on every datasheet figure, on the same software platform (CUDA / ROCm), is priced at rates no worse, under every framework and every calibration level
(pair fit, pooled / family fit, prior); the pair resting on fewer runs moves; the user's own fit never does.

Rates are computed here from the fields and the datasheet (data/gpus.yaml): GEMM rate = gemm_eff x the GEMM peak of
a precision, attention = attn_eff x the 16-bit peak, HBM = hbm_eff x bandwidth; overheads no higher."""

from __future__ import annotations

from typing import Any

import pytest

from madmax_opt.io import calibration, catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model import hardware_spec
from madmax_opt.model.serving_calibration import (
    SERVING_FRAMEWORKS,
    SERVING_PEAKS,
    ServingCatalog,
    ServingParams,
)
from madmax_opt.search.serving_space import ServingModel

REL = 1e-9


def rates(p: ServingParams, gpu: str) -> dict[str, float]:
    """Higher is faster for every entry (overheads negated). GEMM at every native peak the GPU lists among bf16,
    fp8, fp4 (weight-only fp4 runs at the bf16 peak where the GPU has no fp4 tensor cores)."""
    g = catalog.gpus()[gpu]
    out = {f"gemm {k}": p.gemm_eff * g.peak_flops[k] for k in ("bf16", "fp8", "fp4") if k in g.peak_flops}
    if "fp4" not in g.peak_flops:
        out["gemm fp4"] = p.gemm_eff * g.peak_flops["bf16"]
    out["grouped gemm bf16"] = p.gemm_eff * p.grouped_gemm_ratio * g.peak_flops["bf16"]
    return {**out, "attention": p.attn_eff * g.peak_flops["bf16"], "hbm": p.hbm_eff * g.hbm_bw,
            "comm": p.comm_eff, "acceptance": p.spec_acceptance, "-layer overhead": -p.layer_overhead_s,
            "-prefill overhead": -p.prefill_overhead_s}


def no_worse(better: dict[str, float], worse: dict[str, float]) -> list[str]:
    return [k for k in worse if k in better and better[k] < worse[k] - REL * abs(worse[k])]


def test_one_definition_of_dominance_and_of_the_order() -> None:
    """Training's and serving's hardware orders are one function over one dominance (each with its own field
    bounds and peaks)."""
    from madmax_opt.model import serving_calibration

    assert calibration.hardware_order is hardware_spec.hardware_order
    assert serving_calibration.hardware_order is hardware_spec.hardware_order


def test_every_dominating_catalog_pair_is_priced_no_worse_under_every_framework() -> None:
    cat, gpus = serving_catalog(), catalog.gpus()
    levels: set[str] = set()
    checked = 0
    for better in gpus:
        for worse in gpus:
            if better == worse or not hardware_spec.dominates(gpus[better], gpus[worse], SERVING_PEAKS):
                continue
            for fw in SERVING_FRAMEWORKS:
                pb, level_b, _ = cat.resolve(better, fw)
                pw, level_w, _ = cat.resolve(worse, fw)
                levels |= {level_b.split(":")[0], level_w.split(":")[0]}
                assert not no_worse(rates(pb, better), rates(pw, worse)), (better, worse, fw)
                checked += 1
    assert checked > 100
    assert {"calibrated", "composed", "family"} <= levels  # pair fits, pooled fits composed, a family's fit


def datasheet_at_least(x: Any, y: Any) -> bool:
    """Every figure a serving plan is priced with, read from the catalog here: each of y's bf16 / fp16 / fp8 / fp4
    peaks, HBM capacity and bandwidth no lower on x."""
    return (all(x.peak_flops.get(p, 0.0) >= v for p, v in y.peak_flops.items() if p in ("bf16", "fp16", "fp8", "fp4"))
            and x.hbm_bytes >= y.hbm_bytes and x.hbm_bw >= y.hbm_bw)


def test_dominance_is_the_datasheet_within_one_platform_and_never_across() -> None:
    """Brute force over the catalog: ordered exactly when the datasheet is at least as good and both GPUs run the
    same platform; the datasheet alone would order across vendors both ways (MI300X over H100 / H200, MI355X over
    B200; B300 over MI300X)."""
    gpus = catalog.gpus()
    assert {g.platform for g in gpus.values()} == {"cuda", "rocm"}
    assert {n for n, g in gpus.items() if g.platform == "rocm"} == {"mi300x", "mi325x", "mi355x"}
    same, across = 0, []
    for a, x in gpus.items():
        for b, y in gpus.items():
            if a == b:
                continue
            want = datasheet_at_least(x, y) and x.platform == y.platform
            assert hardware_spec.dominates(x, y, SERVING_PEAKS) == want, (a, b)
            same += want
            if datasheet_at_least(x, y) and x.platform != y.platform:
                across.append((a, b))
    assert same > 50
    assert {("mi300x", "h100-sxm"), ("mi300x", "h200-sxm"), ("mi355x", "b200"), ("b300", "mi300x")} <= set(across)


def test_a_cross_platform_pair_is_not_ordered() -> None:
    """MI300X (a vLLM fit at gemm_eff 0.3) beside H100 (a vLLM fit at 0.95): the MI300X datasheet is ahead on every
    figure, yet neither moves (the rule of 973e21a would have raised MI300X to 0.95 x 989 / 1,307 = 0.72); within
    ROCm the order holds: MI355X (prior) is raised to the MI300X fit it dominates, and names no NVIDIA GPU."""
    gpus = catalog.gpus()
    assert datasheet_at_least(gpus["mi300x"], gpus["h100-sxm"])
    cat = catalog_with([("mi300x", "vllm", {"gemm_eff": 0.3}), ("h100-sxm", "vllm", {"gemm_eff": 0.95})])
    mi, _, _, mi_moves = cat.resolve_ordered("mi300x", "vllm")
    h100, _, _, h100_moves = cat.resolve_ordered("h100-sxm", "vllm")
    assert (mi.gemm_eff, mi_moves) == (0.3, [])
    assert (h100.gemm_eff, h100_moves) == (0.95, [])
    mi355, level, _, moves = cat.resolve_ordered("mi355x", "vllm")
    assert level == "prior"
    assert any(m.startswith("raised to mi300x/vllm") for m in moves)
    assert not any("h100" in m or "h200" in m for m in moves)
    assert not no_worse(rates(mi355, "mi355x"), rates(mi, "mi300x"))


def catalog_with(entries: list[tuple[str, str, dict[str, float]]], user: list[tuple[str, str]] | None = None,
                 flagged: tuple[str, str] | None = None) -> ServingCatalog:
    """The package catalog with only these (gpu, framework) fits: every other pair of the framework resolves to
    the prior (no pooled fit left); ``flagged``: the pair whose own fit errs above 30 %, the others' do not."""
    cat = serving_catalog()
    by_key = {(e.gpu, e.framework): e for e in cat.entries}
    kept = []
    for gpu, fw, changes in entries:
        e = by_key[(gpu, fw)]
        fit = e.fit.model_copy(update={"own_fit_uncalibrated": (gpu, fw) == flagged, "priced_by": "pair"})
        kept.append(e.model_copy(update={"params": e.params.model_copy(update=changes), "fit": fit}))
    return cat.model_copy(update={"entries": kept, "user_pairs": user or []})


def test_a_gpu_on_the_prior_is_raised_to_the_fit_of_a_gpu_it_dominates() -> None:
    """H200 (no fit: prior) against H100 (a pair fit at gemm_eff 0.9): same compute (989 / 1,979 TFLOP/s), so its
    GEMM and attention efficiencies are raised to H100's; HBM efficiency to H100's rate over H200's 4.8 TB/s."""
    cat = catalog_with([("h100-sxm", "vllm", {"gemm_eff": 0.9, "layer_overhead_s": 1e-6})])
    prior, h100 = cat.prior, cat.resolve("h100-sxm", "vllm")[0]
    got, level, _, moves = cat.resolve_ordered("h200-sxm", "vllm")
    assert level == "prior"
    assert got.gemm_eff == pytest.approx(max(prior.gemm_eff, 0.9), rel=REL)
    assert got.attn_eff == pytest.approx(max(prior.attn_eff, h100.attn_eff), rel=REL)
    assert got.hbm_eff == pytest.approx(max(prior.hbm_eff, h100.hbm_eff * 3.35e12 / 4.8e12), rel=REL)
    assert got.layer_overhead_s == pytest.approx(min(prior.layer_overhead_s, 1e-6), rel=REL)
    assert any(m.startswith("raised to h100-sxm/vllm") for m in moves)
    assert not no_worse(rates(got, "h200-sxm"), rates(h100, "h100-sxm"))


def test_a_gpu_on_the_prior_is_lowered_to_the_fit_of_a_gpu_that_dominates_it() -> None:
    """H100 (prior) under H200 (a pair fit at gemm_eff 0.3): the less trusted one moves, H100 down; H200 stays."""
    cat = catalog_with([("h200-sxm", "vllm", {"gemm_eff": 0.3, "hbm_eff": 0.4})])
    prior = cat.prior
    h200, _, _, h200_moves = cat.resolve_ordered("h200-sxm", "vllm")
    assert (h200.gemm_eff, h200.hbm_eff, h200_moves) == (0.3, 0.4, [])
    got, level, _, moves = cat.resolve_ordered("h100-sxm", "vllm")
    assert level == "prior"
    assert got.gemm_eff == pytest.approx(min(prior.gemm_eff, 0.3), rel=REL)
    assert got.hbm_eff == pytest.approx(min(prior.hbm_eff, 0.4 * 4.8e12 / 3.35e12), rel=REL)
    assert any(m.startswith("lowered to h200-sxm/vllm") for m in moves)


def test_two_pair_fits_the_dominating_one_is_raised_and_the_users_fit_never_moves() -> None:
    fits = [("h100-sxm", "vllm", {"gemm_eff": 0.8}), ("h200-sxm", "vllm", {"gemm_eff": 0.6})]
    tie = catalog_with(fits)
    assert tie.resolve("h200-sxm", "vllm")[0].gemm_eff == pytest.approx(0.8, rel=REL)
    assert tie.resolve("h100-sxm", "vllm")[0].gemm_eff == pytest.approx(0.8, rel=REL)
    user = catalog_with(fits, user=[("h200-sxm", "vllm")])  # an overlay's fit: H100's catalog fit moves instead
    assert user.resolve("h200-sxm", "vllm")[0].gemm_eff == pytest.approx(0.6, rel=REL)
    assert user.resolve("h100-sxm", "vllm")[0].gemm_eff == pytest.approx(0.6, rel=REL)
    poor = catalog_with(fits, flagged=("h100-sxm", "vllm"))  # H100's own fit errs above 30 %: it moves, down
    assert poor.resolve("h200-sxm", "vllm")[0].gemm_eff == pytest.approx(0.6, rel=REL)
    assert poor.resolve("h100-sxm", "vllm")[0].gemm_eff == pytest.approx(0.6, rel=REL)


def serving_labels(gpu: str, framework: str) -> list[dict[str, Any]]:
    return ServingModel(problem_from_dict({
        "model": "llama3-8b", "hardware": {"gpu": gpu, "gpus": [1]},
        "task": {"kind": "inference", "prompt_len": 128, "output_len": 128},
        "stack": {"framework": framework}})).calibration


def test_the_record_names_what_the_calibration_was_moved_to() -> None:
    cat = serving_catalog()
    moved = 0
    for gpu in ("h200-sxm", "b300", "mi300x", "gb200"):
        for fw in SERVING_FRAMEWORKS:
            own = cat.resolve_own(gpu, fw)[0]
            got, _, _, moves = cat.resolve_ordered(gpu, fw)
            (label,) = serving_labels(gpu, fw)
            assert label["ordered"] == moves
            assert bool(moves) == (got != own)
            moved += bool(moves)
    assert moved > 0
