"""Co-design solves show the best plan on every system of the problem and how far each is from the optimum
(issue 27): checked against solving each system alone, and the gap against the two records' own numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from madmax_opt.io.problem import load_problem
from madmax_opt.search.result import solve_result

TRAIN = {"model": "llama2-7b", "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64},
         "objective": "cost"}
SERVE = {"model": "llama2-7b", "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "tpot_s": 0.05},
         "objective": "cost"}


def _solve(tmp_path: Path, name: str, data: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return solve_result(load_problem(path), 1, 60.0, 1)


@pytest.mark.parametrize(("base", "sizes"), [(TRAIN, [8, 16]), (SERVE, [1, 2])], ids=["training", "serving"])
def test_each_systems_best_is_the_best_of_that_system_alone(tmp_path: Path, base: dict[str, Any],
                                                            sizes: list[int]) -> None:
    hardware = [{"gpu": "h100-sxm", "gpus": sizes}, {"gpu": "a100-80gb", "gpus": sizes}]
    both = _solve(tmp_path, "both", base | {"hardware": hardware})
    rows = {r["system"]: r for r in both["options"]}
    assert set(rows) == {"dgx-h100", "dgx-a100"}
    for entry in hardware:  # the reference: the same problem with one system only
        alone = _solve(tmp_path, entry["gpu"], base | {"hardware": [entry]})
        assert "options" not in alone  # one system: nothing to compare
        row = rows[alone["best"]["hardware"]["system"]]
        assert row["best"]["plan"] == alone["best"]["plan"]
        assert row["objective"] == alone["solver"]["objective"]
    # cost objective: the gap is the ratio of $ per million tokens (each record's own number) less one
    usd = {name: r["best"]["usd_per_million_tokens"] for name, r in rows.items()}
    for name, r in rows.items():
        assert r["vs_optimum"] == pytest.approx(usd[name] / min(usd.values()) - 1, rel=1e-4, abs=1e-5)
    assert both["options"][0]["vs_optimum"] == 0.0 and both["best"]["plan"] == both["options"][0]["best"]["plan"]


def test_a_system_without_a_plan_says_why_and_the_table_shows_both(tmp_path: Path) -> None:
    hardware = [{"gpu": "h100-sxm", "gpus": [8]}, {"system": "cloud-a-p3-16xlarge", "gpus": [1]}]
    result = _solve(tmp_path, "p", TRAIN | {"hardware": hardware})
    none = [r for r in result["options"] if r["best"] is None]
    assert [r["system"] for r in none] == ["cloud-a-p3-16xlarge"]
    assert "does not fit" in none[0]["reason"] and "memory" in none[0]["reason"]
    from madmax_opt.report.report import print_solution

    console = Console(width=80, record=True)
    print_solution(result, console)
    text = console.export_text()
    assert "best plan per system" in text and "optimum" in text and "cloud-a-p3-16xlarge" in text
    assert "no admissible plan" in text


def test_online_serving_compares_systems_by_requests_per_gpu_second(tmp_path: Path) -> None:
    task = {"kind": "inference", "prompt_len": 512, "output_len": 128, "arrival_rate": 2.0, "ttft_p99_s": 1.0,
            "tpot_p99_s": 0.05}
    hardware = [{"gpu": "h100-sxm", "gpus": 1}, {"gpu": "a100-80gb", "gpus": 1}]
    result = _solve(tmp_path, "online", {"model": "llama2-7b", "hardware": hardware, "task": task})
    rows = result["options"]
    assert rows[0]["vs_optimum"] == 0.0 and rows[0]["best"]["plan"] == result["best"]["plan"]
    # the objective is GPU-seconds per request = 1 / (max requests/s per GPU): the gap is the inverse rate ratio
    best_rate = rows[0]["best"]["max_rate_per_gpu"]
    for r in rows[1:]:
        assert r["vs_optimum"] == pytest.approx(best_rate / r["best"]["max_rate_per_gpu"] - 1, rel=1e-3)
    console = Console(width=80, record=True)
    from madmax_opt.report.online_reports import print_online

    print_online(result, console)
    assert "best plan per system" in console.export_text()
