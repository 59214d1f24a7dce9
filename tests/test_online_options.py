"""Online serving with several systems: each system's best comes from the one pruned search (search/online.py,
``each_system``); the reference is the same problem solved on that system alone (its own search, its own order),
and a system with no admissible plan keeps the reason its own solve gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.problem import Problem
from madmax_opt.search.online import solve_online

TASK: dict[str, Any] = {"kind": "inference", "prompt_len": 1024, "output_len": 256, "precision": ["bf16", "fp8"],
                        "arrival_rate": 20, "ttft_p99_s": 0.3, "tpot_p90_s": 0.04}
HARDWARE = [{"gpu": "h100-sxm", "gpus": [8, 16]}, {"gpu": "h200-sxm", "gpus": [8, 16]}]


def _problem(hardware: list[dict[str, Any]], **task: Any) -> Problem:
    return problem_from_dict({"model": "llama3-70b", "hardware": hardware, "task": {**TASK, **task},
                              "space": {"tp": [2, 4, 8], "pp": [1, 2]}, "objective": "throughput"})


def _alone(problem: Problem, system: str) -> dict[str, Any]:
    return solve_online(dataclasses.replace(problem, hardware=tuple(
        o for o in problem.hardware if o.system.name == system)), 1)


@pytest.mark.parametrize(("hardware", "task", "infeasible"), [
    (HARDWARE, {}, 0),
    (HARDWARE, {"arrival_rate": 5, "tpot_p90_s": 0.025}, 0),  # a tighter TPOT: another system wins
    ([*HARDWARE, {"gpu": "mi300x", "gpus": [8]}], {"ttft_p99_s": 0.2}, 1),  # one system carries nothing
    ([{"gpu": "b200", "gpus": [8]}, *HARDWARE], {}, 0),  # the others' best lie past the pruning bound of the optimum
], ids=["example", "tight-tpot", "one-infeasible", "far-apart"])
def test_each_systems_best_equals_its_own_solve(hardware: list[dict[str, Any]], task: dict[str, Any],
                                                infeasible: int) -> None:
    problem = _problem(hardware, **task)
    for top_k in (1, 3):
        both = solve_online(problem, top_k, each_system=True)
        alone_best = solve_online(problem, top_k)  # the search without the per-system part
        assert both["best"] == alone_best["best"] and both["top"] == alone_best["top"]
        assert both["solver"]["evaluated"] == alone_best["solver"]["evaluated"]
        rows = {r["system"]: r for r in both["options"]}
        assert list(rows) == sorted(rows, key=lambda s: (rows[s]["objective"] is None, rows[s]["vs_optimum"] or 0))
        assert set(rows) == {o.system.name for o in problem.hardware}
        for system, row in rows.items():
            try:
                alone = _alone(problem, system)
            except (InfeasibleError, ProblemError) as exc:
                assert row["best"] is None and row["reason"] == str(exc)
                continue
            assert row["best"] == alone["best"]
            assert row["objective"] == alone["solver"]["objective"]
            assert row["vs_optimum"] == pytest.approx(row["objective"] / both["solver"]["objective"] - 1.0)
    assert sum(r["best"] is None for r in rows.values()) == infeasible
