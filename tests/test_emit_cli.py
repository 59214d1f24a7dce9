"""Every example problem's optimum emitted in every format of its kind; `solve --emit`, `emit`, one-line errors."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import run_main
from madmax_opt.cli.emit import emit_best
from madmax_opt.io.problem import load_problem
from madmax_opt.launch.common import Emitted
from madmax_opt.launch.emit import emit_plan, formats_for, parse_emitted, plan_of_record
from test_emit import check_emitted

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = sorted((ROOT / "problems").glob("*.yaml"))
MIXED = ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml"
LLAMA = ROOT / "problems" / "llama2-70b-h100.yaml"


@cache
def solved(path: Path) -> dict[str, Any]:
    r = run_main("solve", path, "--json", "--time-limit", "3", "--top-k", "10")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_examples_cover_both_kinds() -> None:
    kinds = {tuple(formats_for(load_problem(p))) for p in PROBLEMS}
    assert kinds == {("megatron", "nemo", "torchtitan", "deepspeed"), ("vllm", "sglang", "trtllm")}


SLOW_SOLVES = {"serve-llama3-70b-arrival"}  # the online (arrival-rate) search takes ~20 s on 2 cores


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW_SOLVES else p
                                  for p in PROBLEMS], ids=lambda p: p.stem)
def test_every_example_optimum_emits_every_format_of_its_kind(path: Path) -> None:
    """The optimum and the rest of the top 10, in every format of the problem's kind: emits and round-trips, or
    (for the settings a framework lacks, stated in test_emit) is refused in one line."""
    problem = load_problem(path)
    for record in solved(path)["top"]:
        for fmt in formats_for(problem):
            check_emitted(fmt, problem, plan_of_record(problem, record["plan"]))


def test_mixed_pipeline_is_refused_and_its_one_system_variant_emits_an_uneven_layout() -> None:
    problem = load_problem(MIXED)
    plan = plan_of_record(problem, solved(MIXED)["best"]["plan"])
    assert plan.stage_systems is not None and len(set(plan.stage_systems)) == 2
    r = run_main("solve", MIXED, "--emit", "megatron", "--time-limit", "3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "mixed GPU types" in r.stderr
    emitted = emit_best(MIXED, solved(MIXED), "megatron", None)  # what solve --emit megatron --top-k 10 adds
    assert emitted["rank"] >= 1 and "mixed GPU types" in emitted["refused"][0]
    one = plan.model_copy(update={"stage_systems": None, "system": "dgx-h100"})
    e = emit_plan(problem, one, "megatron")
    assert "--pipeline-model-parallel-layout" in e.commands[0].args
    assert parse_emitted(e).stage_layers == plan.stage_layers


def test_solve_json_carries_the_emitted_configuration(tmp_path: Path) -> None:
    r = run_main("solve", LLAMA, "--json", "--emit", "torchtitan", "--out", tmp_path, "--time-limit", "3",
                 "--top-k", "10")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rank, refused = result["emitted"]["rank"], result["emitted"]["refused"]
    assert len(refused) == rank  # every better plan was refused, with its reason
    e = Emitted.model_validate({k: v for k, v in result["emitted"].items() if k not in ("rank", "refused")})
    plan = result["top"][rank]["plan"]
    assert e.format == "torchtitan" and e.gpus == plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml", "launch.sh", "madmax_flavor.py"]
    assert (tmp_path / "job.toml").read_text() == e.files["job.toml"]


def test_emit_command_writes_one_folder_per_plan(tmp_path: Path) -> None:
    plans = ROOT / "problems" / "plans" / "llama2-70b-3d.yaml"
    r = run_main("emit", LLAMA, "nemo", "--plan", plans, "--out", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert len(records) == 2 and {p.name for p in tmp_path.iterdir()} == {"plan-0", "plan-1"}
    assert "model.virtual_pipeline_model_parallel_size=4" in records[0]["commands"][0]["args"]
    text = run_main("emit", LLAMA, "megatron", "--plan", plans).stdout
    assert text.count("torchrun --nnodes 128 --nproc-per-node 8 pretrain_gpt.py") == 2


@pytest.mark.parametrize(("args", "message"), [
    (["emit", LLAMA, "vllm", "--plan", ROOT / "problems/plans/llama2-70b-3d.yaml"], "vllm is a serving format"),
    (["emit", LLAMA, "deepspeed", "--plan", ROOT / "problems/plans/llama2-70b-3d.yaml"], "cannot express vpp=4"),
    (["emit", LLAMA, "slurm", "--plan", ROOT / "problems/plans/llama2-70b-3d.yaml"], "unknown format 'slurm'"),
    (["solve", ROOT / "problems/dlrm/dlrm-a-cloud.yaml", "--emit", "vllm"], "no launch formats"),
    (["solve", LLAMA, "--emit", "sglang"], "allowed for this problem: megatron, nemo, torchtitan, deepspeed"),
])
def test_bad_emit_requests_are_one_line_errors(args: list[Any], message: str) -> None:
    r = run_main(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


@pytest.mark.parametrize(("plan", "fmt", "problem", "where"), [
    ("[{dp: 1024, tp: 1, pp: 1, mbs: 1, zero: 2, system: dgx-h100},"
     " {dp: 1024, tp: 1, pp: 1, mbs: 1, zero: 1, system: dgx-h100}]", "torchtitan", LLAMA, "{plan}: [1].zero: "),
    ("{dp: 1024, tp: 1, pp: 1, mbs: 1, zero: 1, system: dgx-h100}", "torchtitan", LLAMA, "{plan}: zero: "),
    ("{dp: 1, tp: 8, pp: 1, batch: 8}", "trtllm", ROOT / "problems/serve-deepseek-v3.yaml", "{problem}: model.moe: "),
])
def test_emit_refusals_name_the_file_and_field(tmp_path: Path, plan: str, fmt: str, problem: Path,
                                               where: str) -> None:
    """A plan setting is located in the plan file ([i] of a list), a model or task setting in the problem file."""
    path = tmp_path / "plans.yaml"
    path.write_text(plan + "\n")
    r = run_main("emit", problem, fmt, "--plan", path)
    expected = where.format(plan=path, problem=problem)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"error: {expected}{fmt} cannot express" in r.stderr, \
        r.stderr
