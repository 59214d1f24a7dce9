"""solve --robust's best-worst-case text comes from the objective registry (model/objectives.py), one per objective;
values below worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from madmax_opt.model import objectives as registry
from madmax_opt.model.objectives import OBJECTIVES
from madmax_opt.report.report import robust_text


def test_each_objective_reads_its_worst_case_by_hand() -> None:
    assert OBJECTIVES["throughput"].worst_case(2e-6) == "at worst 500,000 tokens/s"  # 1 / 2 us per token
    assert OBJECTIVES["cost"].worst_case(2.5e-9) == "at worst $0.0025 per million tokens"  # x 1e6 tokens
    assert OBJECTIVES["time_to_train"].worst_case(9000.0) == "at worst 2.5 h to train"  # 9000 s / 3600 s/h
    assert OBJECTIVES["energy"].worst_case(0.25) == "at worst 0.25 J per token"


def test_robust_text_reads_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    robust = {"robust_choice": 1, "indistinguishable_from_best": [0, 1], "best_chosen_by": "robust worst case",
              "value": [1.0, 1.1, 2.0], "worst_case": [3.0, 2.0, 4.0], "objective": "energy"}
    assert robust_text(robust) == ("within the error bars of the best: candidate(s) 1, 2 of 3; best worst case: "
                                   "candidate 2 (at worst 2 J per token) (chosen: --robust)")
    # an objective registered without its own text reads its value in its unit
    carbon = dataclasses.replace(OBJECTIVES["energy"], name="carbon", unit="g")  # type: ignore[arg-type]
    monkeypatch.setitem(registry.OBJECTIVES, "carbon", carbon)
    assert "(at worst 2 g per token)" in robust_text({**robust, "objective": "carbon"})
