"""Physical invariants, step 2: hardware dominance across calibration levels and monotonicity (hypothesis).

A GPU at least as good as another on every datasheet figure (model/hardware_spec.dominates), in the same system (same
network, price and power), prices every plan no slower and every optimum no worse, whatever level calibrates each
(a pair fit, a framework family's pooled fit, a prior): the pairs below cross all three. More HBM, more bandwidth
and more GPU options never worsen the optimum; longer sequences and deeper models never make a plan faster.
Optima are brute force over the whole enumerated space (the solver equals brute force: test_solver.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import Model, metrics
from madmax_opt.io import calibration, catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.hardware_spec import dominates
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import FRAMEWORKS
from madmax_opt.search.space import enumerate_plans
from strategies import small_models

# (better, worse, system): the worse GPU's own system, the better GPU swapped in
PAIRS = [("h200-sxm", "h100-sxm", "dgx-h100"), ("a100-80gb", "a100-40gb", "dgx-a100-40gb"),
         ("b200", "h100-sxm", "dgx-h100"), ("h100-sxm", "a100-80gb", "dgx-a100"),
         ("h200-sxm", "h100-hbm2e-96gb", "dgx-h100")]
TASKS = [{"kind": "pretrain"}, {"kind": "finetune", "lora_rank": 16}, {"kind": "finetune", "frozen_layers": 2}]
PROPERTY = settings(max_examples=4, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-12


def system(name: str, gpu: str, **changes: Any) -> dict[str, Any]:
    d = catalog.systems()[name].model_dump()
    return {**d, "name": f"{name}-{gpu}", "gpu": gpu, **changes}


def build(model: dict[str, Any], hw: list[dict[str, Any]], task: dict[str, Any], framework: str,
          **extra: Any) -> Problem:
    return problem_from_dict({"model": model, "hardware": hw, "task": task, "stack": {"framework": framework},
                              **extra})


def priced(problem: Problem) -> tuple[PlanArrays, NDArray[np.float64], NDArray[np.bool_]]:
    plans = enumerate_plans(problem)
    met = metrics(Model(problem), plans)
    return plans, met.step_time_s, met.feasible


def best_step(problem: Problem) -> float:
    _, step, ok = priced(problem)
    return float(np.min(step[ok])) if ok.any() else float("inf")


tasks = st.builds(lambda t, s, b, p: {**t, "seq_len": s, "global_batch": b, "precision": p},
                  st.sampled_from(TASKS), st.sampled_from([512, 2048]), st.sampled_from([16, 64]),
                  st.sampled_from(["bf16", "fp8"]))


def test_calibration_levels_cross_in_the_pairs() -> None:
    """The pairs price their GPUs at different levels (else the test would not test the levels)."""
    levels = {calibration.record(catalog.gpus()[g], fw).level for pair in PAIRS for g in pair[:2] for fw in FRAMEWORKS}
    assert {"calibrated", "prior"} <= levels and any(lv and lv.startswith("family:") for lv in levels)


@PROPERTY
@given(model=small_models(layers=[4, 8]), task=tasks, pair=st.sampled_from(PAIRS),
       framework=st.sampled_from(FRAMEWORKS), gpus=st.sampled_from([8, 16]))
def test_a_dominating_gpu_is_never_slower(model: dict[str, Any], task: dict[str, Any], pair: tuple[str, str, str],
                                          framework: str, gpus: int) -> None:
    better, worse, sys_name = pair
    if task["precision"] == "fp8" and "fp8" not in catalog.gpus()[worse].peak_flops:
        task = {**task, "precision": "bf16"}
    assert dominates(catalog.gpus()[better], catalog.gpus()[worse])
    runs = [priced(build(model, [{"system": system(sys_name, g), "gpus": [gpus]}], task, framework))
            for g in (better, worse)]
    (_, step_b, ok_b), (_, step_w, ok_w) = runs
    assert np.all(ok_b | ~ok_w)  # feasible on the worse GPU: feasible on the better one
    both = ok_b & ok_w
    assert np.all(step_b[both] <= step_w[both] * (1 + TOL))
    if ok_w.any():  # the optimum (every objective: same tokens per step, price and power)
        assert step_b[ok_b].min() <= step_w[ok_w].min() * (1 + TOL)


@PROPERTY
@given(model=small_models(layers=[4, 8]), task=tasks, framework=st.sampled_from(FRAMEWORKS),
       scale=st.sampled_from([1.25, 2.0]))
def test_more_memory_bandwidth_or_gpus_never_worsen_the_optimum(model: dict[str, Any], task: dict[str, Any],
                                                                 framework: str, scale: float) -> None:
    base = best_step(build(model, [{"system": "dgx-h100", "gpus": [8]}], task, framework))
    derived = [
        [{"derive": {"from": "dgx-h100", "scale": {name: scale}}, "gpus": [8]}]
        for name in ("hbm_capacity", "hbm_bandwidth", "nvlink_bandwidth", "nic_bandwidth")
    ] + [
        [{"system": "dgx-h100", "gpus": [8, 16]}],
    ]
    for hw in derived:
        assert best_step(build(model, hw, task, framework)) <= base * (1 + TOL), hw


@PROPERTY
@given(model=small_models(layers=[4]), task=tasks, framework=st.sampled_from(FRAMEWORKS))
def test_longer_sequences_and_deeper_models_are_never_faster(model: dict[str, Any], task: dict[str, Any],
                                                             framework: str) -> None:
    hw = [{"system": "dgx-h100", "gpus": [8]}]
    plans, step, ok = priced(build(model, hw, task, framework))
    for bigger_model, bigger_task in (({**model, "layers": 8}, task), (model, {**task, "seq_len": 2 * task["seq_len"]})):
        problem = build(bigger_model, hw, bigger_task, framework)
        # the same plans (a plan valid for the smaller problem keeps its layout)
        big = metrics(Model(problem), plans)
        assert np.all(big.step_time_s[ok] >= step[ok] * (1 - TOL))
