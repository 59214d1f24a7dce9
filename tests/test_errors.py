"""Bad input: one line on stderr naming file, field and what is allowed, exit 2; infeasible problems exit 3.

Every case is a file in tests/data (bad/, infeasible/, plans/) run through the installed ``madmax-opt`` script.
The allowed values are taken from the catalog data files (plain YAML) and the pydantic models' field lists, or
worked out by hand (divisors, line/column positions, memory lower bounds) in the comments.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from madmax_opt.cli import main as cli
from madmax_opt.core.errors import InternalError
from madmax_opt.model.spec import Plan, Task, TransformerModel
from madmax_opt.search import result as report_module
from test_cli import CATALOG, DATA, SMALL, assert_one_line_error, catalog_names, run_cli, run_main

BAD = DATA / "bad"
PLANS = DATA / "plans"


def keys(model: Any) -> list[str]:
    return list(model.model_fields)


# (file in tests/data/bad, field named in the message or None for the whole file, fragments that must appear)
BAD_PROBLEMS: list[tuple[str, str | None, list[str]]] = [
    # unknown keys list the allowed keys
    ("unknown-top-key.yaml", "solver",
     ["unknown key", "model", "hardware", "task", "space", "stack", "objective", "constraints", "baseline"]),
    ("unknown-task-key.yaml", "task.batch_size", ["unknown key", *keys(Task)]),
    ("unknown-hardware-key.yaml", "hardware[1].nodes", ["unknown key", "gpu", "gpus", "supply", "system"]),
    ("unknown-inline-model-key.yaml", "model.n_layers", ["unknown key", *keys(TransformerModel)]),
    # wrong types name what the field takes
    ("wrong-type-gpus.yaml", "hardware.gpus",
     ["wrong type", "'eight'", "an integer > 0", "a list of integers > 0", "start, stop, step"]),
    ("wrong-type-global-batch.yaml", "task.global_batch", ["wrong type", "16.5", "an integer > 0"]),
    ("wrong-type-model.yaml", "model", ["wrong type", "got 7", "a catalog name", "hf_config", "layers"]),
    ("wrong-type-task.yaml", "task", ["wrong type", "'pretrain'", "global_batch", "seq_len"]),
    ("wrong-type-sp.yaml", "space.sp", ["wrong type", "'sometimes'", "true or false"]),
    ("unknown-recompute.yaml", "space.recompute[1]", ["'partial'", "none", "selective", "full"]),
    ("unknown-objective.yaml", "objective", ["'fastest'", "throughput", "cost", "time_to_train"]),
    # catalog names list the whole catalog
    ("unknown-model.yaml", "model", ["'llama-2-7b'", *catalog_names("models")]),
    ("unknown-system.yaml", "hardware.system", ["'dgx-h1000'", *catalog_names("systems")]),
    ("unknown-gpu.yaml", "hardware.gpu", ["'h100'", *catalog_names("gpus")]),
    ("unknown-gpu-in-inline-system.yaml", "hardware.system.gpu", ["'a100'", *catalog_names("gpus")]),
    # zero and negative sizes
    ("zero-gpus.yaml", "hardware.gpus", ["greater than 0", "got 0", "an integer > 0"]),
    ("negative-gpus-in-list.yaml", "hardware.gpus[1]", ["got -16", "an integer > 0"]),
    ("negative-seq-len.yaml", "task.seq_len", ["got -2048", "an integer > 0"]),
    ("zero-layers-inline.yaml", "model.layers", ["got 0", "an integer > 0"]),
    ("baseline-zero-stage-4.yaml", "baseline.zero", ["got 4", "an integer >= 0 and <= 3"]),
    ("reserve-fraction-one.yaml", "stack.memory_reserve_fraction", ["got 1.0", "< 1"]),
    # malformed YAML: the unclosed "{" of line 2 is noticed at the ":" after "task" (line 3, column 5)
    ("malformed.yaml", None, ["malformed YAML", "line 3, column 5"]),
    ("duplicate-key.yaml", None, ["duplicate key 'task'", "line 4, column 1"]),
    ("empty.yaml", None, ["empty", "model", "hardware", "task"]),
    ("top-level-list.yaml", None, ["wrong type", "got a list", "model", "hardware", "task"]),
    # empty lists
    ("empty-hardware-list.yaml", "hardware", ["empty list", "system", "gpus"]),
    ("empty-gpus-list.yaml", "hardware", ["gpus is an empty list", "cluster sizes"]),
    ("reversed-gpu-range.yaml", "hardware.gpus", ["stop (8) is below start (64)", "stop >= start"]),
    ("empty-space-list.yaml", "space.tp", ["empty list", "one or more values"]),
    ("space-zero-stage-5.yaml", "space.zero", ["got [0, 5]", "allowed: ZeRO stages 0, 1, 2, 3"]),
    # model shapes: the allowed head counts are the divisors, by brute force below
    ("inline-hidden-not-divisible.yaml", "model",
     ["hidden (1000) is not divisible by heads (12)",
      "allowed heads: " + ", ".join(str(d) for d in range(1, 1001) if 1000 % d == 0)]),
    ("inline-kv-heads-not-divisible.yaml", "model",
     ["heads (12) is not divisible by kv_heads (5)",
      "allowed kv_heads: " + ", ".join(str(d) for d in range(1, 13) if 12 % d == 0)]),
    # Hugging Face configs (paths relative to the problem file); line 4 of the JSON lacks its comma
    ("hf-config-missing.yaml", "model.hf_config", ["not found", "no-such-config.json"]),
    ("hf-config-malformed.yaml", "model.hf_config", ["malformed JSON", "line 5, column 3"]),
    ("hf-config-incomplete.yaml", "model.hf_config", ["lacks", "num_hidden_layers"]),
    # cross-field rules
    ("time-to-train-without-tokens.yaml", "task.train_tokens", ["time_to_train", "allowed"]),
    ("missing-task.yaml", "task", ["required key missing", "global_batch"]),
    ("llm-without-seq-len.yaml", "task.seq_len", ["required for an llm", "an integer > 0"]),
    ("frozen-layers-exceed.yaml", "task.frozen_layers", ["40 exceeds the model's 32 layers", "0 to 32"]),
    ("hardware-gpu-and-system.yaml", "hardware", ["exactly one of system", "gpu"]),
    # issue 13: sizes beyond their documented bound (io/limits.py), booleans as counts, non-finite numbers
    ("gpus-beyond-bound.yaml", "hardware.gpus", ["100,000,000,000,000,000,000", "up to 20,000,000"]),
    ("global-batch-beyond-bound.yaml", "task.global_batch", ["beyond the supported range", "up to 100,000,000"]),
    ("gpus-range-beyond-bound.yaml", "hardware.gpus.stop", ["1,000,000,000,000", "up to 20,000,000"]),
    # (16384 - 8) / 8 + 1 = 2048 sizes
    ("gpus-range-too-many-sizes.yaml", "hardware.gpus", ["2,048 cluster sizes", "at most 1,024", "raise step"]),
    ("layers-beyond-bound.yaml", "model.layers", ["1,000,000,000", "up to 20,000"]),
    ("hidden-heads-beyond-bound.yaml", "model.hidden", ["1,000,000,000,000", "up to 2,000,000"]),
    ("gpus-boolean.yaml", "hardware.gpus", ["wrong type (got true)", "an integer"]),
    ("train-tokens-infinite.yaml", "task.train_tokens", ["not a finite number (got inf)"]),
    ("train-tokens-nan-string.yaml", "task.train_tokens", ["not a finite number", "nan"]),
    ("bad-timestamp.yaml", None, ["malformed YAML", "month must be in 1..12"]),
    # knob combinations refused by name
    ("vpp-without-pipeline.yaml", "space.vpp", ["vpp=2 needs a pipeline", "pp is 1"]),
    ("mixed-stages-without-uneven.yaml", "space.mixed_stages", ["needs uneven_stages: true"]),
    # serving and DLRM spaces are checked like the training space
    ("serving-space-tp-zero.yaml", "space.tp", ["got [0, 8]", "integers >= 1"]),
    ("dlrm-space-tp-zero.yaml", "space.tp", ["got [0]", "integers >= 1"]),
    ("dlrm-table-count-beyond-bound.yaml", "model.tables[0].count", ["1,000,000,000", "up to 500,000"]),
    # 8,192 + 16,384 = 24,576 GPUs of per-GPU placement models
    ("dlrm-too-many-gpus.yaml", "hardware.gpus", ["24,576 GPUs over the hardware options", "at most 16,384"]),
]


@pytest.mark.parametrize(("name", "field", "fragments"), BAD_PROBLEMS, ids=[c[0] for c in BAD_PROBLEMS])
def test_bad_problem_gives_one_line_and_exit_2(name: str, field: str | None, fragments: list[str]) -> None:
    path = BAD / name
    assert path.exists()
    line = assert_one_line_error(run_main("solve", path), 2, f"error: {path}: ", *fragments)
    if field is not None:
        assert line.startswith(f"error: {path}: {field}: "), line


@pytest.mark.parametrize("name", ["unknown-task-key.yaml", "wrong-type-gpus.yaml", "unknown-model.yaml",
                                  "malformed.yaml", "inline-hidden-not-divisible.yaml"])
def test_bad_problem_through_the_console_script(name: str) -> None:
    """The same one line and exit code from a separate process running the installed script."""
    path = BAD / name
    in_process = run_main("solve", path)
    assert_one_line_error(run_cli("solve", path), 2, in_process.stderr.strip())


def test_every_bad_problem_file_is_tested() -> None:
    tested = {c[0] for c in BAD_PROBLEMS}
    on_disk = {p.name for p in BAD.glob("*.yaml")}
    assert on_disk == tested


def test_the_inline_model_error_lists_the_model_keys_not_the_hf_config_branch() -> None:
    line = assert_one_line_error(run_main("solve", BAD / "unknown-inline-model-key.yaml"), 2)
    assert "hf_config" not in line


@pytest.mark.parametrize("command", [["evaluate", "--plan", str(PLANS / "one-plan.yaml")], ["verify"]])
def test_other_commands_report_bad_problems_the_same_way(command: list[str]) -> None:
    path = BAD / "unknown-system.yaml"
    assert_one_line_error(run_main(command[0], path, *command[1:]), 2, f"{path}: hardware.system: ", "dgx-h100")


def test_missing_problem_file() -> None:
    path = DATA / "no-such-problem.yaml"
    assert_one_line_error(run_cli("solve", path), 2, str(path), "problem file not found")


def test_problem_path_is_a_directory() -> None:
    assert_one_line_error(run_main("solve", DATA), 2, str(DATA), "is a directory")


def test_problem_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model: caf\xe9\n".encode("latin-1"))  # é is byte 0xe9 at offset 10
    assert_one_line_error(run_main("solve", path), 2, str(path), "not UTF-8", "byte 10")


# ---------------------------------------------------------------------------------------------- plan files

BAD_PLANS: list[tuple[str, str | None, list[str]]] = [
    # small.yaml has one option, 8 GPUs of dgx-h100: 2 x 8 = 16 GPUs is a different cluster
    ("wrong-gpu-count.yaml", "dp*tp*pp*cp", ["2*8*1*1 = 16 GPUs", "allowed: 8"]),
    ("wrong-system.yaml", "system", ["'dgx-a100'", "allowed: dgx-h100"]),
    ("unknown-key.yaml", "[1].micro_batch", ["unknown key", *keys(Plan)]),
    ("wrong-type.yaml", "recompute", ["none", "selective", "full"]),
    ("empty-list.yaml", None, ["expected a plan", "allowed", "dp", "tp", "pp"]),
]


@pytest.mark.parametrize(("name", "field", "fragments"), BAD_PLANS, ids=[c[0] for c in BAD_PLANS])
def test_bad_plan_file_gives_one_line_and_exit_2(name: str, field: str | None, fragments: list[str]) -> None:
    path = PLANS / name
    line = assert_one_line_error(run_main("evaluate", SMALL, "--plan", path), 2, f"error: {path}: ", *fragments)
    if field is not None:
        assert line.startswith(f"error: {path}: {field}: "), line


def test_missing_plan_file() -> None:
    path = PLANS / "no-such-plan.yaml"
    assert_one_line_error(run_cli("evaluate", SMALL, "--plan", path), 2, str(path), "plan file not found")


def test_malformed_plan_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("dp: 8\ntp: [1, 2\n")
    assert_one_line_error(run_main("evaluate", SMALL, "--plan", path), 2, str(path), "malformed YAML", "line 3")


# ------------------------------------------------------------------------------------ infeasible: exit 3


def _gb_needed(line: str) -> float:
    match = re.search(r"needs at least ([0-9.]+) GB per GPU", line)
    assert match, line
    return float(match.group(1))


def test_405b_does_not_fit_on_eight_16gb_gpus() -> None:
    line = assert_one_line_error(
        run_cli("solve", DATA / "infeasible" / "405b-on-8-v100-16gb.yaml"), 3,
        "llama3-405b does not fit", "v100-16gb", "binding constraint: memory capacity",
    )
    # model states alone: >= 405e9 params x (2 B weights + 4 B fp32 grads + 12 B Adam) / 8 GPUs (dp = 1: no ZeRO)
    assert _gb_needed(line) >= 405e9 * 18 / 8 / 1e9


def test_70b_does_not_fit_on_one_gpu() -> None:
    line = assert_one_line_error(
        run_main("solve", DATA / "infeasible" / "70b-on-one-gpu.yaml"), 3,
        "llama2-70b does not fit", "1 x h100-sxm", "binding constraint: memory capacity",
    )
    assert _gb_needed(line) >= 68.9e9 * 18 / 1e9  # Llama-2-70B: 68.98e9 parameters, 18 B each


def test_max_gpus_below_the_smallest_cluster() -> None:
    assert_one_line_error(
        run_main("solve", DATA / "infeasible" / "max-gpus-below-smallest.yaml"), 3,
        "binding constraint: max_gpus=4", "smallest feasible cluster has 8 GPUs",
    )


def test_empty_space() -> None:
    assert_one_line_error(
        run_main("solve", DATA / "infeasible" / "empty-space.yaml"), 3, "plan space is empty", "tp=3", "8",
    )


def test_space_where_no_plan_is_valid() -> None:
    assert_one_line_error(
        run_main("solve", DATA / "infeasible" / "batch-not-divisible.yaml"), 3,
        "dp*mbs must divide global_batch", "global_batch=16", "mbs=32",
    )


def test_budget_below_the_cheapest_option() -> None:
    price = yaml.safe_load((CATALOG / "systems.yaml").read_text())["dgx-h100"]["price_per_gpu_hour"]
    assert_one_line_error(
        run_main("solve", DATA / "infeasible" / "budget-too-small.yaml"), 3,
        "binding constraint: max_cost_per_hour=1.0", f"${8 * price:.2f}/h",
    )


def test_verify_of_an_infeasible_problem_agrees_and_exits_0() -> None:
    result = run_main("verify", DATA / "infeasible" / "empty-space.yaml")
    assert result.returncode == 0, result.stderr
    assert "agree: True" in result.stdout


# ------------------------------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["solve"], ["Missing argument", "madmax-opt solve --help"]),
        (["solve", str(SMALL), "--top-k", "0"], ["--top-k", "madmax-opt solve --help"]),
        (["solve", str(SMALL), "--fastest"], ["No such option: --fastest"]),
        (["optimise", str(SMALL)], ["No such command 'optimise'", "madmax-opt --help"]),
        (["evaluate", str(SMALL)], ["Missing option '--plan'"]),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(run_main(*args), 2, *fragments)


def test_no_arguments_prints_help() -> None:
    result = run_cli()
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 2
    assert "Usage" in result.stdout and "solve" in result.stdout


# ------------------------------------------------------------------------- main(): exit codes in-process


def _main_exit(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["madmax-opt", *args])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    code = stop.value.code
    return code if isinstance(code, int) else 0


def test_main_passes_on_a_commands_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import madmax_opt.search.verify

    monkeypatch.setattr(madmax_opt.search.verify, "verify_problem", lambda problem, **kw: {"agree": False})
    assert _main_exit(monkeypatch, "verify", str(SMALL)) == 1  # typer.Exit(1) must not become 0
    assert "agree: False" in capsys.readouterr().out


def test_main_exits_0_on_success(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    assert _main_exit(monkeypatch, "schema") == 0
    assert '"properties"' in capsys.readouterr().out


def test_main_internal_error_exit_4(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise InternalError("solver/evaluator mismatch on a plan:\n  evaluator 1.0 s, solver 2.0 s")

    monkeypatch.setattr(report_module, "solve_result", broken)
    assert _main_exit(monkeypatch, "solve", str(SMALL)) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: solver/evaluator mismatch")  # newlines folded


def test_main_os_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def read_only(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", "/results/table.md")

    monkeypatch.setattr(report_module, "solve_result", read_only)
    assert _main_exit(monkeypatch, "solve", str(SMALL)) == 2
    assert capsys.readouterr().err == "error: /results/table.md: Permission denied\n"


def test_main_abort_exit_130(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def abort(*args: Any, **kwargs: Any) -> None:
        raise typer.Abort()

    monkeypatch.setattr(report_module, "solve_result", abort)
    assert _main_exit(monkeypatch, "solve", str(SMALL)) == 130
    assert capsys.readouterr().err == "error: aborted\n"


def test_main_unexpected_exception_is_one_line_exit_4(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def bug(*args: Any, **kwargs: Any) -> None:
        raise KeyError("h100-new")

    monkeypatch.delenv("MADMAX_TRACEBACK", raising=False)
    monkeypatch.setattr(report_module, "solve_result", bug)
    assert _main_exit(monkeypatch, "solve", str(SMALL)) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: internal error: KeyError: 'h100-new'")
    monkeypatch.setenv("MADMAX_TRACEBACK", "1")  # developers get the traceback back
    with pytest.raises(KeyError):
        _main_exit(monkeypatch, "solve", str(SMALL))


# ------------------------------------------------------------------ issue 13: the reproducers, one test each

B = "model: llama2-7b\nhardware: {gpu: h100-sxm, gpus: 8}\ntask: {kind: pretrain, seq_len: 2048, global_batch: 64}\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _strict_json(text: str) -> Any:
    """json.loads that refuses Infinity and NaN (Python's default accepts them; JSON does not)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_yaml_nested_20000_levels_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "deep.yaml", B.replace("llama2-7b", "[" * 20000 + "]" * 20000))
    assert_one_line_error(run_main("solve", path), 2, str(path), "nesting depth")


def test_yaml_nested_beyond_the_depth_bound_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "deep.yaml", B.replace("llama2-7b", "[" * 100 + "]" * 100))  # libyaml takes 100
    assert_one_line_error(run_main("solve", path), 2, str(path), "nested deeper than 64 levels")


def test_hf_config_nested_20000_levels_is_one_line(tmp_path: Path) -> None:
    _write(tmp_path, "config.json", '{"a": ' + "[" * 20000 + "]" * 20000 + "}")
    path = _write(tmp_path, "p.yaml", B.replace("llama2-7b", "{hf_config: config.json}"))
    assert_one_line_error(run_main("solve", path), 2, str(path), "model.hf_config", "malformed JSON")


def test_a_list_of_200000_cluster_sizes_is_refused_quickly(tmp_path: Path) -> None:
    sizes = ", ".join(str(8 * i) for i in range(1, 200_001))
    path = _write(tmp_path, "many.yaml", B.replace("gpus: 8", f"gpus: [{sizes}]"))
    t0 = time.perf_counter()
    assert_one_line_error(run_main("solve", path), 2, "hardware.gpus", "200,000 items", "at most 1,024")
    assert time.perf_counter() - t0 < 30


def test_an_integer_of_5000_digits_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.yaml", B.replace("gpus: 8", "gpus: 1" + "0" * 5000))
    assert_one_line_error(run_main("solve", path), 2, str(path))


@pytest.mark.parametrize("command", ["evaluate", "timeline"])
def test_evaluate_and_timeline_check_the_space_too(tmp_path: Path, command: str) -> None:
    path = _write(tmp_path, "p.yaml", B + "space: {tp: 0}\n")
    plan = _write(tmp_path, "plan.yaml", "{dp: 8}\n")
    args = ["--out", str(tmp_path)] if command == "timeline" else []
    assert_one_line_error(run_main(command, path, "--plan", plan, *args), 2, f"{path}: space.tp: ", ">= 1")


@pytest.mark.parametrize(
    ("model", "task", "fragment"),
    [
        ("llama2-7b", "{kind: pretrain, seq_len: 2048, global_batch: 1000000000000000}", "task.global_batch"),
        ("{layers: 1000000000, hidden: 4096, heads: 32, ffn: 11008, vocab: 32000}",
         "{kind: pretrain, seq_len: 2048, global_batch: 64}", "model.layers"),
    ],
)
def test_timeline_and_sweep_refuse_sizes_beyond_their_bound(
    tmp_path: Path, model: str, task: str, fragment: str
) -> None:
    problem = _write(tmp_path, "p.yaml", f"model: {model}\nhardware: {{gpu: h100-sxm, gpus: 8}}\ntask: {task}\n")
    plan = _write(tmp_path, "plan.yaml", "{dp: 8}\n")
    assert_one_line_error(run_main("timeline", problem, "--plan", plan, "--out", tmp_path), 2, fragment)
    sweep = _write(tmp_path, "s.yaml", f"models: [{model}]\ntask: {task}\nhardware: [{{gpu: h100-sxm, gpus: 8}}]\n")
    assert_one_line_error(run_main("sweep", sweep, "--out", tmp_path / "out"), 2, fragment.replace("model.", "models[0]."))
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_timeline_of_a_million_micro_batches_is_refused_by_name(tmp_path: Path) -> None:
    # 8,000,000 / (8 x 1) = 1,000,000 micro-batches x 32 layers = 32,000,000 layer passes > 200,000
    problem = _write(tmp_path, "p.yaml", B.replace("global_batch: 64", "global_batch: 8000000"))
    plan = _write(tmp_path, "plan.yaml", "{dp: 8}\n")
    assert_one_line_error(run_main("timeline", problem, "--plan", plan, "--out", tmp_path), 2,
                          f"{plan}: mbs: ", "1,000,000 micro-batches x 32 layers = 32,000,000", "at most 200,000")


def test_timeline_blames_the_plan_file_for_an_invalid_plan(tmp_path: Path) -> None:
    problem = _write(tmp_path, "p.yaml", B)
    plan = _write(tmp_path, "plan.yaml", "{dp: 8, mbs: 3}\n")  # 64 sequences are not 8 x 3 x m
    assert_one_line_error(run_main("timeline", problem, "--plan", plan, "--out", tmp_path), 2,
                          f"error: {plan}: ", "dp*mbs must divide global_batch")


def test_timeline_beyond_tolerance_warns_and_exits_1(tmp_path: Path) -> None:
    """results/validation/trace_vs_closed_form.md: ZeRO-3 with CP over 64 A100s simulates ~12 % faster."""
    problem = _write(tmp_path, "p.yaml", "model: llama2-7b\nhardware: {system: dgx-a100, gpus: 64}\n"
                     "task: {seq_len: 2048, global_batch: 256}\n")
    plan = _write(tmp_path, "plan.yaml", "{dp: 16, tp: 2, cp: 2, mbs: 2, zero: 3, recompute: full}\n")
    result = run_main("timeline", problem, "--plan", plan, "--out", tmp_path, "--json")
    summary = _strict_json(result.stdout)
    assert result.returncode == 1 and abs(summary["difference"]) > summary["tolerance"]
    assert (tmp_path / "plan.trace.json").exists()  # the outputs are still written
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "beyond the 3% tolerance" in lines[0]


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ("{tp: 1, dp: 48, sp: true}", {"tp": 1, "dp": 48, "sp": False}),  # Megatron turns SP off at tp 1
        ("{dp: 1, tp: 8, zero: 3}", {"dp": 1, "tp": 8, "zero": 0}),  # ZeRO over one rank shards nothing
    ],
)
def test_knobs_without_effect_are_no_ops_as_in_megatron(space: str, expected: dict[str, Any]) -> None:
    gpus = expected["dp"] * expected["tp"]
    text = B.replace("gpus: 8", f"gpus: {gpus}").replace("global_batch: 64", "global_batch: 96") + f"space: {space}\n"
    with tempfile.TemporaryDirectory() as d:
        problem = _write(Path(d), "p.yaml", text)
        result = run_main("solve", problem, "--json")
    assert result.returncode == 0, result.stderr
    plan = _strict_json(result.stdout)["best"]["plan"]
    assert {k: plan[k] for k in expected} == expected


def test_solve_json_is_strict_json() -> None:
    result = run_main("solve", SMALL, "--json")
    assert result.returncode == 0, result.stderr
    _strict_json(result.stdout)


def test_sensitivity_writes_into_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_main("sensitivity", SMALL, "--params", "nic_bandwidth", "--factors", "2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "sensitivity" / "small-sensitivity.json").exists()


def test_matplotlib_is_a_core_dependency() -> None:
    """Plots are part of the product: `pip install -e .` alone must let `timeline` draw its Gantt chart."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("matplotlib") for d in project["dependencies"])


@pytest.mark.parametrize(
    ("space", "fragment"),
    [
        ("{tp: 3}", "no allowed dp*tp*pp*cp equals the cluster size(s) 8"),  # 3 does not divide 8
        ("{tp: 8, ep: 8}", "no allowed ep (8) divides dp*cp"),  # tp 8 on 8 GPUs leaves dp x cp = 1
    ],
)
def test_the_rule_that_emptied_the_space_is_named(space: str, fragment: str) -> None:
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.search.space import empty_space_reason, enumerate_plans

    base = B.replace("llama2-7b", "mixtral-8x7b") if "ep" in space else B  # ep on a dense model: refused on load
    problem = problem_from_dict(yaml.safe_load(base + f"space: {space}\n"))
    assert len(enumerate_plans(problem)) == 0
    assert fragment in empty_space_reason(problem)


@pytest.mark.parametrize(("gpu", "precision", "fragment"), [
    ("a100-80gb", "fp8", "fp8 needs fp8 tensor cores, which a100-80gb lack"),
    ("h100-sxm", "mxfp8", "mxfp8 needs MX block-scaled FP8 tensor cores, which h100-sxm lack"),
])
def test_training_precision_the_gpu_cannot_run_is_one_line(tmp_path: Path, gpu: str, precision: str,
                                                           fragment: str) -> None:
    """fp8 on A100 was an internal error (exit 4), mxfp8 on H100 was silently priced at the FP8 peak."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"model": "llama2-7b", "hardware": {"gpu": gpu, "gpus": 8},
                                    "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64,
                                             "precision": precision}}))
    assert_one_line_error(run_main("solve", path), 2, "task.precision", fragment)


def test_expert_parallelism_in_a_dense_serving_plan_is_refused(tmp_path: Path) -> None:
    """ep: 4 on a dense model halved its TP all-reduces (a faster, impossible plan); it is refused like the space."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 4, "tp": 4, "ep": 4, "batch": 24, "precision": "fp8"}))
    problem = Path(__file__).resolve().parents[1] / "problems" / "serve-llama2-70b-mix.yaml"
    assert_one_line_error(run_main("evaluate", problem, "--plan", plan), 2, "plan.ep", "needs a mixture-of-experts")
