"""Memory against measured runs (issue 24): every measured training run of the shipped validation data
(data/validation/modern/training.yaml), posed with the plan it ran, must not be refused as out of memory (it ran).
The runs still refused are listed with the cause as strict xfails: fixing one makes its test fail until it is
removed from the list. (Refusals that are not about memory, e.g. torchtitan's uneven 405B stages, are not tested.)"""

from __future__ import annotations

import pytest

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.studies.validation_modern import modern_cases

CASES = {c.run.name: c for c in modern_cases()}
UNSTATED_RECOMPUTE = "recompute not stated in the source, read as none"
KNOWN_REFUSED = {
    "dgxc-h100-llama31-405b-bf16-576gpu": "81.6 GB predicted vs 81.6 GB usable: at the 5 % reserve",
    "dgxc-h100-nemotron4-340b-bf16-128gpu": "96.8 GB predicted (dp 2: 32 GiB of optimizer states per GPU)",
    "dgxc-h100-nemotron4-340b-fp8-128gpu": "91.9 GB predicted (dp 2: 32 GiB of optimizer states per GPU)",
    "dgxc-h100-maxtext-llama3-70b-bf16-128gpu": f"MaxText, {UNSTATED_RECOMPUTE}: 343 GiB of activations",
    "dgxc-h100-maxtext-llama3-70b-fp8-128gpu": f"MaxText, {UNSTATED_RECOMPUTE}: 343 GiB of activations",
    "nemo-longseq-h100-llama2-7b-fp8-4k": "NeMo 24.03 (1.0): 89.9 GB predicted, FP8 weight copies held",
    "mb2511-h100-gptoss-120b-bf16-64gpu": f"{UNSTATED_RECOMPUTE}: 70 GiB of activations at mbs 4",
    "mb2511-gb200-llama3-70b-fp8cs-64gpu": f"Megatron-FSDP, {UNSTATED_RECOMPUTE}: 298 GiB of activations",
    "mbarch2602-gb200-llama3-70b-mxfp8-64gpu": "190.3 GB predicted vs 189.7 GB usable: at the 5 % reserve",
    "automodel-h100-llama3-70b-bf16-64gpu": f"FSDP2, {UNSTATED_RECOMPUTE}: 86 GiB of activations",
}


def params() -> list[object]:
    out: list[object] = []
    for name in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_REFUSED[name])] if name in KNOWN_REFUSED else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", params())
def test_a_measured_run_is_not_refused_for_memory(name: str) -> None:
    run = CASES[name].run
    (rec,) = evaluate(run.problem, [run.plan])
    assert "exceeds usable capacity" not in str(rec.get("infeasible_reason") or "")


def test_known_refusals_name_measured_runs() -> None:
    assert set(KNOWN_REFUSED) <= set(CASES)


def test_nemo_2_fp8_recipes_hold_fp8_primary_weights() -> None:
    """NeMo 2.0's bf16_with_fp8_mixed sets fp8_params (recipes/precision/mixed_precision.py @1dd5fa11): the DGX Cloud
    v25.03 FP8 runs (NeMo 24.12) are read with it; a bf16 run or another source is not."""
    assert CASES["dgxc-h100-llama31-8b-fp8-8gpu"].run.problem.stack.fp8_params
    assert not CASES["dgxc-h100-llama31-8b-bf16-8gpu"].run.problem.stack.fp8_params
    assert not CASES["mb2511-h100-llama3-8b-fp8cs-8gpu"].run.problem.stack.fp8_params
