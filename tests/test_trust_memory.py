"""Memory against measured runs (issue 24): every measured training run of the shipped validation data
(data/validation/modern/training.yaml), posed with the plan it ran, must not be refused as out of memory (it ran).
Where a source does not state activation recompute, the reader takes the least mode (none < selective < full) that
fits (studies/validation_modern.py); these tests check that rule against the evaluator's own refusals, that a stated
mode is never overridden, and that a case read so is kept out of the fits. (Refusals that are not about memory, e.g.
torchtitan's uneven 405B stages, are not tested.)"""

from __future__ import annotations

import pytest

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.model.spec import RECOMPUTE_MODES
from madmax_opt.studies.validation_modern import modern_cases, training_data

CASES = {c.run.name: c for c in modern_cases()}
ROWS = {c["id"]: c for c in training_data()["cases"]}
OOM = "exceeds usable capacity"


def _row(name: str) -> dict[str, object]:
    return ROWS[name.removesuffix("-mx")]


def _refused_for_memory(name: str, mode: str) -> bool:
    """evaluate's record with ``mode``: refused for memory, or (where an earlier rule refuses it first, e.g. the
    uneven 405B stages) its memory per GPU above the usable capacity it reports."""
    run = CASES[name].run
    (rec,) = evaluate(run.problem, [run.plan.model_copy(update={"recompute": mode})])
    mem = rec["memory_bytes_per_gpu"]
    return OOM in str(rec.get("infeasible_reason") or "") or mem["total"] > mem["capacity"]


@pytest.mark.parametrize("name", list(CASES))
def test_a_measured_run_is_not_refused_for_memory(name: str) -> None:
    """Nor over the usable memory where another rule refuses the uniform plan first (uneven 405B stages)."""
    assert not _refused_for_memory(name, CASES[name].run.plan.recompute)


INFERRED = [n for n, c in CASES.items() if c.recompute_inferred and c.run.plan.recompute != "none"]


@pytest.mark.parametrize("name", INFERRED)
def test_an_unstated_recompute_is_the_least_mode_that_fits(name: str) -> None:
    """Every mode before the chosen one is refused for memory by evaluate; the case says so and is not fitted."""
    case = CASES[name]
    chosen = RECOMPUTE_MODES.index(case.run.plan.recompute)
    assert all(_refused_for_memory(name, m) for m in RECOMPUTE_MODES[:chosen])
    assert not _refused_for_memory(name, RECOMPUTE_MODES[chosen])
    assert f"recompute {case.run.plan.recompute} inferred (least that fits)" in case.note
    assert not case.fitted and "recompute is inferred" in case.unfitted_why


def test_the_issue_examples_are_read_with_recompute() -> None:
    """The five runs refused before the rule for their activations (70-343 GiB with recompute none)."""
    for name in ("dgxc-h100-maxtext-llama3-70b-bf16-128gpu", "dgxc-h100-maxtext-llama3-70b-fp8-128gpu",
                 "mb2511-gb200-llama3-70b-fp8cs-64gpu", "automodel-h100-llama3-70b-bf16-64gpu",
                 "mb2511-h100-gptoss-120b-bf16-64gpu"):
        assert name in INFERRED and _refused_for_memory(name, "none"), name


def test_a_stated_recompute_is_never_overridden() -> None:
    """Rows that state a mode (torchtitan 'selective AC' / 'full AC', llm-foundry 'full activation checkpointing' /
    'none') keep it, and rows that state none keep none."""
    stated = {n: str(_row(n)["parallelism"]["recompute"]) for n in CASES  # type: ignore[index]
              if _row(n)["parallelism"]["recompute"] is not None}  # type: ignore[index]
    assert len(stated) == 30
    expected = {"selective AC": "selective", "full AC": "full", "full activation checkpointing": "full", "none": "none"}
    for name, text in stated.items():
        assert CASES[name].run.plan.recompute == expected[text], name
        assert not CASES[name].recompute_inferred


def test_a_run_that_fits_without_recompute_is_read_as_none() -> None:
    unstated = [n for n, c in CASES.items() if c.recompute_inferred]
    assert len(unstated) == len(CASES) - 30
    for name in unstated:
        if CASES[name].run.plan.recompute == "none":
            # read as none, the run is fitted: the inferred-recompute exclusion is for runs that needed a mode
            assert "recompute" not in CASES[name].note and "recompute" not in CASES[name].unfitted_why


def test_nemo_2_fp8_recipes_hold_fp8_primary_weights() -> None:
    """NeMo 2.0's bf16_with_fp8_mixed sets fp8_params (recipes/precision/mixed_precision.py @1dd5fa11): the DGX Cloud
    v25.03 FP8 runs (NeMo 24.12) are read with it; a bf16 run or another source is not."""
    assert CASES["dgxc-h100-llama31-8b-fp8-8gpu"].run.problem.stack.fp8_params
    assert not CASES["dgxc-h100-llama31-8b-bf16-8gpu"].run.problem.stack.fp8_params
    assert not CASES["mb2511-h100-llama3-8b-fp8cs-8gpu"].run.problem.stack.fp8_params
