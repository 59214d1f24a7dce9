"""`madmax-opt fleet` end to end: every option is the plan search's answer for that (system, GPU count) (checked
against `madmax-opt solve` on the same problem), the allocation is the brute-force best over the printed option
tables, the cache gives the same answer; bad fleet files are one-line errors (exit 2), impossible ones exit 3."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cli_helpers import run_main

TRAIN = {
    "model": "vtrain-gpt-3.6b",
    "hardware": {"system": "dgx-a100", "gpus": 8},  # ignored by the fleet: its systems are the hardware
    "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64, "train_tokens": 2.0e9},
    "space": {"tp": [1, 2, 4, 8], "recompute": ["none", "full"]},
}
SERVE = {
    "model": "llama3-8b",
    "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "precision": "bf16", "ttft_s": 1.0,
             "tpot_s": 0.05},
}
ARRIVAL_RPS = 10.0


def write_fleet(tmp: Path, **changes: Any) -> Path:
    (tmp / "train.yaml").write_text(yaml.safe_dump(TRAIN))
    fleet: dict[str, Any] = {
        "objective": "throughput",
        "systems": {"h100": {"system": "dgx-h100", "gpus": 16, "sizes": [8, 16]},
                    "a100": {"system": "dgx-a100", "gpus": 16, "sizes": [8, 16]}},
        "jobs": {"train": {"problem": "train.yaml", "weight": 1.0, "deadline_h": 10.0},
                 "serve": {"problem": SERVE, "arrival_rate_rps": ARRIVAL_RPS, "weight": 4.0, "required": True}},
        "solver": {"what_if_gpus": [8]},
    }
    fleet.update(changes)
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("fleet")
    path = write_fleet(tmp)
    res = run_main("fleet", path, "--json", "--cache", tmp / "cache")
    assert res.returncode == 0, res.stderr
    return tmp, json.loads(res.stdout), path


def test_every_option_is_the_plan_search_answer(solved: tuple[Path, dict[str, Any], Path]) -> None:
    tmp, result, _ = solved
    catalog = {"h100": "dgx-h100", "a100": "dgx-a100"}
    checked = 0
    for table in result["options"]:
        for o in table["options"][:2]:  # the two smallest sizes of the first system: enough, each a full search
            problem = dict(TRAIN if table["job"] == "train" else SERVE,
                           hardware={"system": catalog[o["system"]], "gpus": o["gpus"]}, objective="throughput")
            p = tmp / f"check-{table['job']}-{o['system']}-{o['gpus']}.yaml"
            p.write_text(yaml.safe_dump(problem))
            res = run_main("solve", p, "--json")
            assert res.returncode == 0, res.stderr
            best = json.loads(res.stdout)["best"]
            expected = best["tokens_per_s"] if table["job"] == "train" else best["output_tokens_per_s"]
            assert o["throughput"] == pytest.approx(expected, rel=1e-12)
            checked += 1
    assert checked == 4


def test_allocation_is_the_brute_force_best(solved: tuple[Path, dict[str, Any], Path]) -> None:
    _, result, _ = solved
    demand = ARRIVAL_RPS * SERVE["task"]["output_len"]  # output tokens/s that arrive
    weights = {"train": 1.0, "serve": 4.0}
    per_job = []
    for table in result["options"]:
        ok = [o for o in table["options"]
              if table["job"] != "train" or TRAIN["task"]["train_tokens"] / o["throughput"] / 3600 <= 10.0]
        ok = [o for o in ok if table["job"] != "serve" or o["throughput"] >= demand]
        per_job.append(ok if table["job"] == "serve" else [None, *ok])
    best = None
    for combo in itertools.product(*per_job):
        chosen = [o for o in combo if o is not None]
        if any(sum(o["gpus"] for o in chosen if o["system"] == s) > 16 for s in ("h100", "a100")):
            continue
        value = sum(weights[o["job"]] * (min(o["throughput"], demand) if o["job"] == "serve" else o["throughput"])
                    for o in chosen)
        best = value if best is None else max(best, value)
    assert best is not None
    assert result["solver"]["status"] == "optimal"
    assert result["value"] == pytest.approx(best, rel=1e-6)
    placed = {j["job"]: j for j in result["jobs"] if j["placed"]}
    assert "serve" in placed  # required
    assert all(p["used_gpus"] <= p["gpus"] for p in result["pools"])
    assert result["greedy"]["value"] <= result["value"] + 1e-6
    assert {w["system"] for w in result["what_if"]} == {"h100", "a100"}


def test_cached_rerun_gives_the_same_allocation(solved: tuple[Path, dict[str, Any], Path]) -> None:
    tmp, result, path = solved
    again = run_main("fleet", path, "--json", "--cache", tmp / "cache")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["jobs"] == result["jobs"] and second["options"] == result["options"]


def test_report_files(solved: tuple[Path, dict[str, Any], Path]) -> None:
    tmp, _, path = solved
    res = run_main("fleet", path, "--out", tmp / "out", "--cache", tmp / "cache", "--no-what-if")
    assert res.returncode == 0, res.stderr
    assert (tmp / "out" / "fleet-gantt.png").read_bytes()[:4] == b"\x89PNG"
    rows = (tmp / "out" / "fleet-rows.csv").read_text().splitlines()
    assert rows[0].startswith("key,model,task,system,gpu,gpus,objective,status") and len(rows) == 3
    assert "Greedy baseline" in (tmp / "out" / "fleet.md").read_text()


def test_schema_validates_the_example() -> None:
    res = run_main("fleet", "--schema")
    assert res.returncode == 0
    example = yaml.safe_load((Path(__file__).parent.parent / "problems" / "fleet" / "example.yaml").read_text())
    jsonschema.validate(example, json.loads(res.stdout))


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"objectve": "cost"}, "objectve", "allowed: budget, horizon_h, jobs, objective, solver, systems"),
        ({"objective": "speed"}, "objective", "throughput, cost, energy, deadlines"),
        ({"systems": {"h100": {"system": "dgx-h100", "gpus": 16, "sizes": [12]}}}, "systems.h100.sizes",
         "multiples of 8"),
        ({"systems": {"h100": {"system": "dgx-h999", "gpus": 16}}}, "systems.h100.system", "dgx-h100"),
        ({"systems": {"h100": {"system": "dgx-h100", "gpus": 4}}}, "systems.h100.gpus", ">= 8"),
        ({"jobs": {"t": {"problem": "missing.yaml"}}}, "jobs.t", "not found"),
        ({"jobs": {"t": {"problem": "train.yaml", "systems": ["tpu"]}}}, "jobs.t.systems", "h100, a100"),
        ({"jobs": {"t": {"problem": "train.yaml", "arrival_rate_rps": 3}}}, "jobs.t.arrival_rate_rps",
         "deadline_h, train_tokens, train_samples"),
        ({"jobs": {"t": {"problem": SERVE, "deadline_h": 3}}}, "jobs.t.deadline_h", "arrival_rate_rps, duration_h"),
        ({"jobs": {"s": {"problem": SERVE}}, "objective": "cost"}, "jobs.s.duration_h", "horizon_h"),
        ({"jobs": {"t": {"problem": "train.yaml", "weight": -1}}}, "jobs.t.weight", "> 0"),
        ({"jobs": {}}, "jobs", "at least 1"),
        ({"jobs": 5}, "jobs", "a mapping"),  # an internal TypeError before
        ({"systems": 5}, "systems", "a mapping"),
        ({"jobs": {"my job": {"problem": "train.yaml"}}}, "jobs.my job", "letters, digits"),
        ({"jobs": {"s": {"problem": dict(SERVE, task=dict(SERVE["task"], arrival_rate=5.0))}}},
         "task.arrival_rate", "arrival_rate_rps"),
        ({"jobs": {"t": {"problem": {"model": "llama2-7b", "task": {"kind": "pretrain", "global_batch": 8},
                                     "hardware": {"gpu": "b200", "gpus": 8}}}}}, "hardware", "allowed"),
    ],
)
def test_bad_fleet_is_one_line_exit_2(tmp_path: Path, changes: dict[str, Any], field: str, allowed: str) -> None:
    path = write_fleet(tmp_path, **changes)
    res = run_main("fleet", path, "--no-cache", "--no-what-if")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = res.stderr.strip()
    assert "\n" not in line and str(path) in line and field in line and allowed in line, line


def test_required_job_that_cannot_meet_its_deadline_exits_3(tmp_path: Path) -> None:
    jobs = {"train": {"problem": "train.yaml", "deadline_h": 0.001, "required": True}}
    res = run_main("fleet", write_fleet(tmp_path, jobs=jobs), "--no-cache", "--no-what-if")
    assert res.returncode == 3, res.stderr
    assert "binding constraint" in res.stderr and "deadline_h" in res.stderr and "\n" not in res.stderr.strip()


def test_parallel_plan_searches_give_the_same_tables(solved: tuple[Path, dict[str, Any], Path]) -> None:
    _, result, path = solved
    res = run_main("fleet", path, "--json", "--no-cache", "--no-what-if", "--search-workers", "2")
    assert res.returncode == 0, res.stderr
    parallel = json.loads(res.stdout)
    assert parallel["options"] == result["options"] and parallel["jobs"] == result["jobs"]


def test_job_without_a_feasible_plan_is_left_out_with_the_reason(tmp_path: Path) -> None:
    jobs = {"huge": {"problem": {"model": "llama3-405b", "task": {"kind": "pretrain", "seq_len": 8192,
                                                                  "global_batch": 16}}}}
    res = run_main("fleet", write_fleet(tmp_path, jobs=jobs), "--json", "--no-cache", "--no-what-if")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    (job,) = out["jobs"]
    assert not job["placed"] and "no feasible plan on any fleet system" in job["note"]
    assert "does not fit" in job["note"] or "no plan" in job["note"]
    assert out["value"] == 0 and out["options"][0]["options"] == [] and len(out["options"][0]["infeasible"]) == 4
