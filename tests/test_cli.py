"""The command line, run through the installed console script: schema, catalog, evaluate, solve.

Expected names come from the catalog data files read here with plain YAML (not through ``madmax_opt.io.catalog``);
expected numbers are worked out by hand from the test problems in tests/data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_helpers import run_main

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
CATALOG = ROOT / "src" / "madmax_opt" / "data"
SMALL = DATA / "small.yaml"  # llama2-7b, one DGX H100 node (8 GPUs), seq 2048, global batch 16
SECTIONS = {"model", "hardware", "task", "space", "stack", "objective", "constraints", "baseline", "calibration"}


def _console_script() -> str:
    beside = Path(sys.executable).parent / "madmax-opt"
    found = str(beside) if beside.exists() else shutil.which("madmax-opt")
    assert found, "the madmax-opt console script is not installed (pip install -e .)"
    return found


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``madmax-opt ARGS`` in a fresh process on an 80-column, non-interactive terminal."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    return subprocess.run(
        [_console_script(), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )




def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """Exit ``code``, nothing on stdout, exactly one ``error: ...`` line on stderr holding every fragment."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def catalog_names(kind: str) -> list[str]:
    return list(yaml.safe_load((CATALOG / f"{kind}.yaml").read_text()))


def run_json(*args: str | Path, runner: Any = run_main) -> Any:
    result = runner(*args, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------------------------ schema


def test_schema_is_a_valid_json_schema_with_every_section() -> None:
    schema = run_json_schema(runner=run_cli)
    assert set(schema["properties"]) == SECTIONS
    assert {"model", "hardware", "task"} <= set(schema["required"])
    assert schema.get("additionalProperties") is False  # unknown top-level keys are errors


def run_json_schema(runner: Any = run_main) -> Any:
    result = runner("schema")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_schema_accepts_the_shipped_problems_and_rejects_an_unknown_section() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = run_json_schema()
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema)
    for path in [SMALL, DATA / "three-nodes.yaml", *sorted((ROOT / "problems").glob("*.yaml"))]:
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, (path, errors[0].message)
    bad = yaml.safe_load((DATA / "bad" / "unknown-top-key.yaml").read_text())
    assert not validator.is_valid(bad)


# ----------------------------------------------------------------------------------------------- catalog


@pytest.mark.parametrize(
    ("kind", "examples"),
    [
        ("gpus", ["v100-16gb", "a100-80gb", "h100-sxm", "mi300x"]),
        ("systems", ["dgx-h100", "zionex", "dc-a", "cloud-b-nd96amsr-a100-v4"]),
        ("models", ["llama2-70b", "gpt3-175b", "vit-h"]),
    ],
)
def test_catalog_lists_every_name_in_full(kind: str, examples: list[str]) -> None:
    names = catalog_names(kind)
    assert set(examples) <= set(names)
    table = run_cli("catalog", kind)
    assert table.returncode == 0, table.stderr
    cells = {cell.strip() for line in table.stdout.splitlines() for cell in line.split("│")}
    missing = [n for n in names if n not in cells]  # a truncated "cloud-b-nd96amsr…" would be missing
    assert not missing, missing
    assert set(run_json("catalog", kind)) == set(names)


def test_catalog_unknown_kind_lists_the_kinds() -> None:
    assert_one_line_error(run_main("catalog", "accelerators"), 2, "'accelerators'", "gpus", "systems", "models")


# ---------------------------------------------------------------------------------------------- evaluate


def test_evaluate_one_plan_gives_one_object() -> None:
    rec = run_json("evaluate", SMALL, "--plan", DATA / "plans" / "one-plan.yaml")
    assert isinstance(rec, dict)
    plan = rec["plan"]
    assert (plan["dp"], plan["tp"], plan["mbs"], plan["zero"], plan["recompute"], plan["sp"]) == (
        4, 2, 2, 1, "full", True,
    )
    assert rec["feasible"] is True and rec["infeasible_reason"] is None
    # by hand: 16 sequences x 2048 tokens per step; 8 GPUs at the dgx-h100 catalog price
    assert rec["tokens_per_s"] == pytest.approx(16 * 2048 / rec["step_time_s"], rel=1e-12)
    assert rec["samples_per_s"] == pytest.approx(16 / rec["step_time_s"], rel=1e-12)
    price = yaml.safe_load((CATALOG / "systems.yaml").read_text())["dgx-h100"]["price_per_gpu_hour"]
    assert rec["cost_per_hour_usd"] == pytest.approx(8 * price, rel=1e-12)
    assert rec["hardware"] == {"system": "dgx-h100", "gpu": "h100-sxm", "gpus": 8}


def test_evaluate_a_list_gives_a_list_in_order() -> None:
    recs = run_json("evaluate", SMALL, "--plan", DATA / "plans" / "two-plans.yaml")
    assert isinstance(recs, list) and len(recs) == 2
    given = yaml.safe_load((DATA / "plans" / "two-plans.yaml").read_text())
    for rec, plan in zip(recs, given, strict=True):
        assert {k: rec["plan"][k] for k in plan} == plan


def test_evaluate_reports_invalid_degrees_with_the_reason() -> None:
    # three-nodes.yaml: 24 GPUs, Llama-2 7B (32 heads, 32 layers), global batch 48
    recs = run_json("evaluate", DATA / "three-nodes.yaml", "--plan", DATA / "plans" / "invalid-degrees.yaml")
    assert [r["feasible"] for r in recs] == [False, False, False, True]
    assert 32 % 3 != 0 and "tp must divide heads" in recs[0]["infeasible_reason"]  # tp = 3
    assert "pp*vpp must divide the number of layers" in recs[1]["infeasible_reason"]  # pp = 3
    assert 48 % (24 * 4) != 0 and "dp*mbs must divide global_batch" in recs[2]["infeasible_reason"]
    assert recs[3]["infeasible_reason"] is None


def test_evaluate_table_output() -> None:
    result = run_main("evaluate", SMALL, "--plan", DATA / "plans" / "two-plans.yaml")
    assert result.returncode == 0, result.stderr
    assert "evaluated plans" in result.stdout and "step time (ms)" in result.stdout


# ------------------------------------------------------------------------------------------------- solve


def _without_wall_times(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "solver": {k: v for k, v in result["solver"].items() if "wall" not in k}}


def test_solve_json_keys_and_baseline() -> None:
    result = run_json("solve", SMALL, "--top-k", "3")
    assert {"status", "best", "top", "solver", "baseline", "speedup_vs_baseline"} <= set(result)
    assert result["status"] == "optimal"
    assert result["best"] == result["top"][0] and len(result["top"]) == 3
    steps = [r["step_time_s"] for r in result["top"]]
    assert steps == sorted(steps)
    assert all(r["feasible"] for r in result["top"])
    base = result["baseline"]
    assert {k: base["plan"][k] for k in ("dp", "tp", "pp", "zero", "mbs", "recompute")} == {
        "dp": 8, "tp": 1, "pp": 1, "zero": 1, "mbs": 2, "recompute": "full",
    }
    assert result["speedup_vs_baseline"] == pytest.approx(
        result["best"]["tokens_per_s"] / base["tokens_per_s"], rel=1e-12
    )
    # the baseline lies inside the searched space, so the optimum is at least as fast (up to 1 us rounding per term)
    assert result["best"]["step_time_s"] <= base["step_time_s"] + 1e-5


def test_solve_is_deterministic() -> None:
    # two separate processes: nothing carried over in memory
    first = _without_wall_times(run_json("solve", SMALL, "--top-k", "3", runner=run_cli))
    second = _without_wall_times(run_json("solve", SMALL, "--top-k", "3", runner=run_cli))
    assert first == second


def test_verify_agrees_with_brute_force() -> None:
    report = run_json("verify", SMALL)
    assert report["agree"] is True
    assert report["solver_objective"] == report["brute_force_objective"]


def test_solve_table_output() -> None:
    result = run_main("solve", SMALL)
    assert result.returncode == 0, result.stderr
    assert "best plan" in result.stdout and "baseline" in result.stdout


@pytest.mark.parametrize("command", ["solve", "evaluate", "verify", "schema", "catalog"])
def test_every_command_has_help(command: str) -> None:
    result = run_main(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout
