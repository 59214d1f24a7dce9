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
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*e.files, "launch.sh"])
    assert {"job.toml", "madmax_flavor.py"} <= set(e.files)
    assert (tmp_path / "job.toml").read_text() == e.files["job.toml"]


def test_emit_command_writes_one_folder_per_plan(tmp_path: Path) -> None:
    plans = ROOT / "problems" / "plans" / "llama2-70b-3d.yaml"
    r = run_main("emit", LLAMA, "nemo", "--plan", plans, "--out", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert len(records) == 2 and {p.name for p in tmp_path.iterdir()} == {"plan-0", "plan-1"}
    assert parse_emitted(Emitted.model_validate(records[0])).vpp == 4  # the plan file's first plan: vpp 4
    both = json.loads(run_main("emit", LLAMA, "megatron", "--plan", plans, "--json").stdout)
    assert [(e["gpus"], e["nodes"], e["gpus_per_node"]) for e in both] == [(1024, 128, 8)] * 2  # 128 x 8 GPUs each


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
    ("[{dp: 128, tp: 8, pp: 1, mbs: 1, zero: 2, sp: true, recompute: full, system: dgx-h100},"
     " {dp: 128, tp: 8, pp: 1, mbs: 1, zero: 1, sp: true, recompute: full, system: dgx-h100}]", "torchtitan", LLAMA,
     "{plan}: [1].zero: "),
    ("{dp: 128, tp: 8, pp: 1, mbs: 1, zero: 1, sp: true, recompute: full, system: dgx-h100}", "torchtitan", LLAMA,
     "{plan}: zero: "),
    ("{dp: 1, tp: 8, pp: 1, batch: 8, precision: fp4}", "trtllm", ROOT / "problems/serve-deepseek-v3.yaml",
     "{plan}: precision: "),
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


SERVE = ROOT / "problems" / "serve-llama3-70b.yaml"  # llama3-70b: 80 layers, 64 heads, 8 KV heads; 1-64 GPUs
SERVE_128 = ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml"  # exactly 128 GPUs
DISAGG = ROOT / "problems" / "serve-llama2-70b-disaggregated.yaml"


@pytest.mark.parametrize(("problem", "plan", "fmt", "rule"), [
    # global batch 1024, dp 256 x mbs 3 = 768 does not divide it
    (LLAMA, "{dp: 256, tp: 1, pp: 1, mbs: 3, zero: 1}", "megatron", "dp*mbs must divide global_batch"),
    (LLAMA, "{dp: 256, tp: 1, pp: 1, mbs: 64, zero: 1}", "torchtitan", "dp*mbs must divide global_batch"),
    (LLAMA, "{dp: 128, tp: 2, pp: 1, ep: 2, mbs: 1, zero: 1}", "megatron", "ep = 1 for dense models"),
    # llama2-70b has 80 layers; 40 + 41 = 81
    (LLAMA, "{dp: 32, tp: 8, pp: 2, mbs: 1, zero: 1, stage_layers: [40, 41], stage_recompute: [full, full]}",
     "nemo", "stage_layers must sum to the model's layers"),
    # ... and also far over memory (ZeRO-0, tp 1: ~35 B parameters x 16 B of state per GPU): still invalid, so
    # --force cannot emit it
    (LLAMA, "{dp: 256, tp: 1, pp: 2, mbs: 1, zero: 0, recompute: none, stage_layers: [40, 41], "
     "stage_recompute: [none, none]}", "megatron", "stage_layers must sum to the model's layers"),
    (SERVE_128, "{dp: 3, tp: 4, batch: 8}", "vllm", "dp*tp*pp must equal the number of GPUs"),  # 12 of 128
    (SERVE, "{dp: 4, tp: 3, batch: 8}", "sglang", "tp must divide heads"),  # 64 heads, 8 KV heads; tp 3
    (DISAGG, "{dp: 2, tp: 8, batch: 8, prefill_replicas: 5}", "vllm", "below dp"),
])
def test_emit_refuses_a_plan_the_evaluator_calls_invalid(tmp_path: Path, problem: Path, plan: str, fmt: str,
                                                         rule: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan + "\n")
    for force in ([], ["--force"]):  # --force overrides infeasibility only
        r = run_main("emit", problem, fmt, "--plan", path, "--out", tmp_path / "out", *force)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: {path}: ") and rule in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_emit_refuses_a_plan_that_does_not_fit_unless_forced(tmp_path: Path) -> None:
    """70B parameters in bf16 on one GPU: 2 bytes x 70.6e9 = 141 GB of weights alone, above an 80 GB H100."""
    path = tmp_path / "plans.yaml"
    path.write_text("[{dp: 1, tp: 8, batch: 8}, {dp: 1, tp: 1, batch: 1, precision: bf16}]\n")
    r = run_main("emit", SERVE, "vllm", "--plan", path, "--out", tmp_path / "out")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert f"{path}: [1]: infeasible plan" in r.stderr and "GB per GPU" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing written: every plan is checked first
    r = run_main("emit", SERVE, "vllm", "--plan", path, "--out", tmp_path / "out", "--force")
    assert r.returncode == 0, r.stderr
    written = sorted(p for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert sorted(line.removeprefix("wrote ") for line in r.stderr.splitlines()) == sorted(map(str, written))
    assert len(written) == 2  # plan-0/launch.sh, plan-1/launch.sh


def test_emit_names_the_plan_file_for_a_plan_the_evaluator_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "plans.yaml"
    path.write_text("[{dp: 1, tp: 8, batch: 8}, {dp: 2, tp: 4, batch: 8, ep: 2}]\n")
    r = run_main("emit", SERVE, "sglang", "--plan", path)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {path}: [1].ep: ") and "dense" in r.stderr, r.stderr


def test_solve_emit_out_says_what_it_wrote(tmp_path: Path) -> None:
    r = run_main("solve", SERVE_128, "--emit", "vllm", "--out", tmp_path, "--time-limit", "3", "--json")
    assert r.returncode == 0, r.stderr
    written = sorted(str(p) for p in tmp_path.iterdir())
    assert sorted(x.removeprefix("wrote ") for x in r.stderr.splitlines() if x.startswith("wrote ")) == written
    json.loads(r.stdout)  # stdout stays JSON


# ------------------------------------------------------------------------------------- registering a new format

DUMMY_FLAGS = """format: dummy
kind: serving
module: dummy_launch_format
listed: 8
framework: Dummy
version: "0"
repository: example/dummy
commit: "0000000000000000000000000000000000000000"
files: [serve.py]
program: dummy-serve
flags: [--tp, --replicas, --cap]
"""


@pytest.fixture
def dummy_format(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A new serving format as a maintainer would add it: a module defining the Format and its flag file; nothing
    else is touched (the registry reads the flag file, emit imports the module it names)."""
    import sys
    import types

    from madmax_opt.launch import flagsets, registry
    from madmax_opt.launch.common import Command, Context, flag_args, integer, parse_flags
    from madmax_opt.launch.serve import serving_format
    from madmax_opt.search.serving_space import ServingPlan

    def emit(ctx: Context) -> Emitted:
        p = ctx.plan
        assert isinstance(p, ServingPlan)
        args = flag_args([("--tp", p.tp), ("--replicas", p.dp), ("--cap", p.batch)])
        return Emitted(format="dummy", framework="Dummy", version="0", kind="serving", system=ctx.option.system.name,
                       gpus=p.gpus, nodes=1, gpus_per_node=p.gpus, commands=[Command(program=["dummy-serve"],
                                                                                    args=args)])

    def parse(e: Emitted) -> ServingPlan:
        f = parse_flags(e.commands[0].args)
        return ServingPlan(dp=integer(f, "--replicas"), tp=integer(f, "--tp"), batch=integer(f, "--cap"))

    module = types.ModuleType("dummy_launch_format")
    module.DUMMY = serving_format("dummy", emit, parse, maps={  # type: ignore[attr-defined]
        "dp": ("--replicas",), "tp": ("--tp",), "batch": ("--cap",)}, refuses={})
    monkeypatch.setitem(sys.modules, "dummy_launch_format", module)
    files = registry.flag_files()
    monkeypatch.setattr(registry, "flag_files", lambda: {**files, "dummy.yaml": DUMMY_FLAGS})
    monkeypatch.setattr(flagsets, "flag_files", registry.flag_files)
    for cached in (registry.registered, flagsets.flagset):
        cached.cache_clear()
    yield
    monkeypatch.undo()
    for cached in (registry.registered, flagsets.flagset):
        cached.cache_clear()


def test_a_new_format_registers_once_and_is_seen_by_emit_and_the_cli(dummy_format: Any, tmp_path: Path) -> None:
    from madmax_opt.launch.registry import format_names, formats_help
    from madmax_opt.search.serving_space import ServingPlan

    problem = load_problem(SERVE)
    assert format_names() == ["megatron", "nemo", "torchtitan", "deepspeed", "vllm", "sglang", "trtllm", "dummy"]
    assert formats_for(problem) == ["vllm", "sglang", "trtllm", "dummy"]
    assert formats_help().endswith("vllm, sglang, trtllm, dummy (serving)")
    plan = ServingPlan(dp=2, tp=4, batch=16, precision="fp8")
    e = emit_plan(problem, plan, "dummy")
    assert e.commands[0].argv == ["dummy-serve", "--tp", "4", "--replicas", "2", "--cap", "16"]
    assert parse_emitted(e) == ServingPlan(dp=2, tp=4, batch=16)
    path = tmp_path / "plan.yaml"
    path.write_text("{dp: 2, tp: 4, batch: 16, precision: fp8}\n")
    r = run_main("emit", SERVE, "dummy", "--plan", path)
    assert r.returncode == 0 and "dummy-serve --tp 4 --replicas 2 --cap 16" in r.stdout, r.stderr
    r = run_main("emit", SERVE, "nosuch", "--plan", path)  # the CLI's allowed names come from the registry
    assert r.returncode == 2 and "allowed: megatron, nemo, torchtitan, deepspeed, vllm, sglang, trtllm, dummy" in \
        r.stderr, r.stderr


def test_the_registry_reads_what_the_flag_files_say() -> None:
    """The registry reads four keys of each flag file by pattern (fast, for the CLI's help); the full, validated
    flag set agrees, and the module it names defines the format with that kind."""
    from madmax_opt.launch.emit import get_format
    from madmax_opt.launch.flagsets import flagset
    from madmax_opt.launch.registry import registered

    assert len(registered()) == 7
    for name, entry in registered().items():
        fs = flagset(name)
        assert (fs.format, fs.kind, fs.module, fs.listed) == (name, entry.kind, entry.module, entry.listed)
        assert get_format(name).kind == entry.kind
