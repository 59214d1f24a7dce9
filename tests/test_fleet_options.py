"""Fleet option searches: identical problems are searched once per (system, size) and shared under each job's
name; a cache entry that is JSON of the wrong shape is searched again; the CSV's plan columns (ep included) come from
the plan settings registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from madmax_opt.fleet import options
from madmax_opt.fleet.spec import load_fleet

TRAIN = {"model": "vtrain-gpt-3.6b", "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64,
                                               "train_tokens": 2.0e9}, "space": {"tp": [1, 2], "recompute": "full"}}
OTHER = {**TRAIN, "space": {"tp": [1, 2, 4], "recompute": "full"}}


def _fleet(tmp: Path, jobs: dict[str, Any]) -> Path:
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump({"objective": "throughput", "jobs": jobs, "solver": {"what_if_gpus": [8]},
                                    "systems": {"h100": {"system": "dgx-h100", "gpus": 16, "sizes": [8, 16]}}}))
    return path


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []  # (job, size) searched
    real = options.search_options

    def spy(job: Any, pool: Any, sizes: list[int], limit: float) -> list[dict[str, Any]]:
        calls.extend((job.name, n) for n in sizes)
        return real(job, pool, sizes, limit)

    monkeypatch.setattr(options, "search_options", spy)
    return calls


def test_identical_problems_are_searched_once_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    jobs = {"a": {"problem": TRAIN, "weight": 1.0}, "b": {"problem": TRAIN, "weight": 2.0, "deadline_h": 50.0},
            "c": {"problem": OTHER}}
    tables = options.option_tables(load_fleet(_fleet(tmp_path, jobs)))
    assert sorted(calls) == [("a", 8), ("a", 16), ("c", 8), ("c", 16)]  # b shares a's problem: 2 + 2 searches
    a, b, c = tables
    assert [o.job for o in b.options] == ["b", "b"]
    assert [o.model_dump(exclude={"job"}) for o in a.options] == [o.model_dump(exclude={"job"}) for o in b.options]
    # c's space holds a's: its optimum is at least as fast on each size (a different search)
    assert all(oc.throughput >= oa.throughput for oa, oc in zip(a.options, c.options, strict=True))


def test_sizes_searched_together_match_each_size_alone(tmp_path: Path) -> None:
    # one search over every size keeps each size's best plan; a size with none (max_gpus 16 rules out 32) is
    # searched alone, which names the constraint; the same for a serving job
    capped = {**TRAIN, "constraints": {"max_gpus": 16}}
    serve = {"model": "llama3-8b", "task": {"kind": "inference", "prompt_len": 1024, "output_len": 256,
                                            "ttft_s": 0.5, "tpot_s": 0.03}, "constraints": {"max_gpus": 16}}
    path = tmp_path / "fleet.yaml"
    jobs = {"a": {"problem": OTHER}, "b": {"problem": capped}, "c": {"problem": serve}}
    path.write_text(yaml.safe_dump({"objective": "throughput", "jobs": jobs,
                                    "systems": {"h100": {"system": "dgx-h100", "gpus": 32, "sizes": [8, 16, 32]}}}))
    fleet = load_fleet(path)
    pool = fleet.pools[0]
    for job in fleet.jobs:
        together = options.search_options(job, pool, list(pool.sizes), 30.0)
        assert together == [options.search_option(job, pool, n, 30.0) for n in pool.sizes]
        assert "option" in together[1] and ("infeasible" in together[2]) == (job.name != "a"), job.name


def test_damaged_cache_entries_are_searched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = load_fleet(_fleet(tmp_path, {"a": {"problem": TRAIN}}))
    cache = tmp_path / "cache"
    first = options.option_tables(fleet, cache)
    files = sorted(cache.glob("*.json"))
    assert len(files) == 2
    calls = _counting(monkeypatch)
    assert options.option_tables(fleet, cache) == first and calls == []  # warm: nothing searched
    bad = ['{"option": {"job": "a"}}', "[]", '{"infeasible": 3}', '{"option": null, "infeasible": null}', "{}",
           '{"infeasible": "x", "surprise": 1}', "null", '"text"']
    for text in bad:
        files[0].write_text(text)
        assert options.option_tables(fleet, cache) == first, text
    assert len(calls) == len(bad)  # each damaged entry searched again (and rewritten whole)
    assert options._read_cache(files[0]) == json.loads(files[0].read_text())  # a valid entry again


def test_fleet_csv_plan_columns_come_from_the_plan_settings() -> None:
    from madmax_opt.model.plan_settings import settings
    from madmax_opt.report.fleet_report import PLAN_COLUMNS
    from madmax_opt.studies.sweep_results import CSV_COLUMNS

    assert "ep" in PLAN_COLUMNS
    assert set(PLAN_COLUMNS) == {s.name for s in settings() if s.name in CSV_COLUMNS} - {"system"}


@pytest.mark.slow
def test_ray_backend_gives_the_same_tables(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from madmax_opt.cli.fleet import search_runner

    fleet = load_fleet(_fleet(tmp_path, {"a": {"problem": TRAIN}, "b": {"problem": OTHER}}))
    here = options.option_tables(fleet)
    assert options.option_tables(fleet, runner=search_runner("ray", 2, None)) == here
    assert options.option_tables(fleet, runner=search_runner("local", 2, None)) == here
