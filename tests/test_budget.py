"""constraints.budget_usd (issue 27): the US$ of the whole run, train_tokens / (tokens/s) / 3600 h x the plan's $/h,
in problem files and passed on by sweeps, so an infeasible problem or sweep row names budget_usd. The bounds are
computed here by hand from the records of solves without a budget."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_helpers import run_main
from madmax_opt.core.errors import InfeasibleError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.result import solve_result
from madmax_opt.studies.sweep_spec import load_sweep

TOKENS = 1.0e12
TASK = {"kind": "pretrain", "seq_len": 2048, "global_batch": 64, "train_tokens": TOKENS}
PROBLEM: dict[str, Any] = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": [8, 16]}, "task": TASK}


def run_usd(best: dict[str, Any]) -> float:
    """$ of the run by hand: hours = tokens / (tokens/s) / 3600 s/h, times the plan's $/h."""
    return TOKENS / best["tokens_per_s"] / 3600.0 * best["cost_per_hour_usd"]


def solve(data: dict[str, Any]) -> dict[str, Any]:
    return solve_result(problem_from_dict(data), 1, 30, 1)["best"]  # type: ignore[no-any-return]


def solve_cli(data: dict[str, Any]):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.yaml"
        path.write_text(yaml.safe_dump(data))
        return run_main("solve", path)


def test_an_unmeetable_budget_is_named_in_one_line() -> None:
    cheapest = run_usd(solve(PROBLEM | {"objective": "cost"}))  # the least $ any plan spends on the run
    r = solve_cli(PROBLEM | {"constraints": {"budget_usd": 0.99 * cheapest}})
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert f"budget_usd={0.99 * cheapest:g}" in r.stderr
    assert "min_throughput" not in r.stderr  # the user never wrote it
    shown = re.search(r"run costs \$([0-9.e+]+)", r.stderr)
    assert shown is not None and float(shown.group(1)) == pytest.approx(cheapest, rel=1e-3)


def test_a_budget_that_can_be_met_keeps_the_plan_and_one_that_binds_moves_it() -> None:
    wide = PROBLEM | {"hardware": {"gpu": "h100-sxm", "gpus": [8, 64]}}  # 64 GPUs: faster, dearer per token
    free = solve(wide)  # objective throughput
    cost, cheapest = run_usd(free), run_usd(solve(wide | {"objective": "cost"}))
    assert solve(wide | {"constraints": {"budget_usd": 1.001 * cost}})["plan"] == free["plan"]
    assert cost > 1.001 * cheapest  # the fastest plan is not the cheapest: a budget between them binds
    budget = (cost + cheapest) / 2
    bound = solve(wide | {"constraints": {"budget_usd": budget}})
    assert bound["plan"] != free["plan"] and run_usd(bound) <= budget
    assert bound["tokens_per_s"] <= free["tokens_per_s"]
    assert bound["time_to_train"]["cost_usd"] == pytest.approx(run_usd(bound))  # the record's $, same formula


def test_a_budget_without_a_token_budget_is_one_line() -> None:
    task = {k: v for k, v in TASK.items() if k != "train_tokens"}
    r = solve_cli(PROBLEM | {"task": task, "constraints": {"budget_usd": 1000.0}})
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "constraints.budget_usd" in r.stderr and "train_tokens" in r.stderr


def test_a_sweeps_budget_reaches_its_problems_so_infeasible_rows_name_it(tmp_path: Path) -> None:
    sweep: dict[str, Any] = {"models": ["llama2-7b"], "task": TASK, "hardware": [{"gpu": "h100-sxm", "gpus": 8}],
                             "objectives": ["cost"]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep))
    (free,) = load_sweep(path).combinations
    cheapest = run_usd(solve_result(problem_from_dict(free.problem), 1, 30, 1)["best"])
    path.write_text(yaml.safe_dump(sweep | {"constraints": {"budget_usd": 0.99 * cheapest}}))
    (combo,) = load_sweep(path).combinations
    assert combo.problem["constraints"] == {"budget_usd": 0.99 * cheapest}  # passed on, not folded
    with pytest.raises(InfeasibleError, match=f"budget_usd={0.99 * cheapest:g}"):
        solve_result(problem_from_dict(combo.problem), 1, 30, 1)
