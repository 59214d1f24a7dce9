"""The CP-SAT factory: deterministic defaults, user parameters, model export, honest statuses and exit codes,
integer range; every `solve --json` has a status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

from cli_helpers import run_main
from madmax_opt.core.errors import InternalError, ProblemError, TimeLimitError
from madmax_opt.io.problem import load_problem
from madmax_opt.search import stage_split_bound
from madmax_opt.search.assemble import IntObjective, Limit, pick_best
from madmax_opt.search.cpsat import INT_LIMIT, MAX_WORKERS, CpSatOptions, new_solver, run, to_int
from madmax_opt.search.solver import solve_records

ROOT = Path(__file__).resolve().parents[1]
LLAMA = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": [8, 16]},
         "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64}}
# 32 layers on 3 stages: no uniform plan, so the uneven-stage search finds the plan (the uniform search sorts)
UNEVEN = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": 24},
          "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64}, "space": {"pp": 3, "uneven_stages": True}}


def _write(tmp_path: Path, data: dict[str, Any], name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _one_line_error(out: Any, code: int, *fragments: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    for f in fragments:
        assert f in out.stderr, out.stderr


def test_defaults_are_deterministic_and_user_parameters_apply_last() -> None:
    prm = new_solver(CpSatOptions()).parameters
    assert (prm.num_workers, prm.random_seed, prm.max_time_in_seconds) == (1, 0, 60.0)
    prm = new_solver(CpSatOptions(time_limit_s=5, params="random_seed: 7 num_workers: 2"), linearization_level=2)
    assert (prm.parameters.random_seed, prm.parameters.num_workers, prm.parameters.linearization_level) == (7, 2, 2)


@pytest.mark.parametrize("workers", [0, MAX_WORKERS + 1, 10001, True])
def test_workers_are_bounded(workers: int) -> None:
    with pytest.raises(ProblemError, match=f"--workers: .*allowed: 1 to {MAX_WORKERS}"):
        CpSatOptions(workers=workers)


def test_cli_option_errors_are_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA)
    _one_line_error(run_main("solve", path, "--workers", "10001"), 2, "--workers", "allowed: 1 to 64")
    _one_line_error(run_main("solve", path, "--solver-params", "max_time_in_seconds: abc"), 2, "--solver-params",
                    "text format")
    _one_line_error(run_main("solve", path, "--solver-params", "no_such_parameter: 1"), 2, "--solver-params")
    # accepted by the text parser, rejected by CP-SAT's own parameter check: still the user's input
    _one_line_error(run_main("solve", _write(tmp_path, UNEVEN), "--solver-params", "num_workers: 10001"), 2,
                    "--solver-params", "num_workers")


def test_model_invalid_is_an_internal_error_with_the_validation_message() -> None:
    m = cp_model.CpModel()
    x = m.new_int_var(0, 2**62, "x")
    y = m.new_int_var(0, 2**62, "y")
    m.add(x + y <= 2**62)  # the sum of the variables' ranges overflows int64: CP-SAT refuses the model
    problem = m.validate()
    assert problem
    with pytest.raises(InternalError) as err:
        run(m, CpSatOptions(), "test")
    assert err.value.exit_code == 4 and problem in str(err.value) and "\n" not in str(err.value)


def test_time_out_without_a_plan_is_its_own_exit_code(tmp_path: Path) -> None:
    # no deterministic time at all: CP-SAT stops before any solution (UNKNOWN), which proves nothing
    n = 50
    obj = IntObjective(np.arange(n, dtype=np.int64) + 1, "x", None)
    with pytest.raises(TimeLimitError, match=r"no plan proven within 60 s .*raise --time-limit") as err:
        pick_best(obj, np.ones(n, bool), np.arange(n), [Limit(np.arange(n), n // 2)],
                  cpsat=CpSatOptions(params="max_deterministic_time: 0"))
    assert err.value.exit_code == 5


def _solve_undecided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, opts: CpSatOptions) -> Any:
    """UNEVEN solved in process with the split bound's exact maxima off (stage_split_bound.EXACT_COMBOS 0), so that
    the bases its means leave undecided go to CP-SAT models."""
    monkeypatch.setattr(stage_split_bound, "EXACT_COMBOS", 0)
    outcome, _ = solve_records(load_problem(_write(tmp_path, UNEVEN)), cpsat=opts)
    return outcome


def test_uneven_split_without_cp_sat_time_is_feasible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The uneven search's first pass runs no CP-SAT (search/stages.py): its dynamic programme's split is a plan, so
    with no CP-SAT time at all the solve returns it as feasible, its gap against the proven bound; with time, CP-SAT
    proves it optimal; by default (exact maxima) no CP-SAT model is needed for it."""
    short = _solve_undecided(monkeypatch, tmp_path, CpSatOptions(params="max_deterministic_time: 0"))
    s = short.summary()
    assert short.status == "feasible" and s["search"] == "uneven" and s["uneven"]["models_solved"] >= 1
    assert s["best_bound"] < s["objective"] and s["gap"] == pytest.approx((s["objective"] - s["best_bound"]) /
                                                                          s["objective"])
    full = _solve_undecided(monkeypatch, tmp_path, CpSatOptions())
    assert full.status == "optimal" and full.objective == short.objective and full.uneven.models >= 1
    monkeypatch.undo()  # the default: exact maxima (run_main runs the CLI in this process)
    out = run_main("solve", _write(tmp_path, UNEVEN), "--json", "--export-model", tmp_path / "m.pbtxt")
    assert out.returncode == 0 and out.stderr.startswith("warning: --export-model: no CP-SAT model was built")
    res = json.loads(out.stdout)
    assert res["status"] == "optimal" and res["solver"]["objective"] == short.objective
    assert (res["solver"]["method"], res["solver"]["uneven"]["models_solved"]) == ("dynamic-programme", 0)


def test_feasible_is_reported_with_its_gap() -> None:
    """The mixed-pipeline example with a budget too short to finish the stage search: status feasible, and the
    summary's gap is the returned objective's distance to the proven bound."""
    out = run_main("solve", ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml", "--time-limit", "0.5", "--json")
    assert out.returncode in (0, 5), out.stderr  # 5: the budget ended before the first stage split (slow machine)
    if out.returncode == 5:
        return
    res = json.loads(out.stdout)
    s = res["solver"]
    if res["status"] == "feasible":
        assert s["best_bound"] <= s["objective"]
        assert s["gap"] == pytest.approx((s["objective"] - s["best_bound"]) / s["objective"])
    else:
        assert res["status"] == "optimal" and s["gap"] == 0.0


def test_export_model_writes_named_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_file = tmp_path / "model.pbtxt"
    outcome = _solve_undecided(monkeypatch, tmp_path, CpSatOptions(export_model=model_file))
    s = outcome.summary()
    assert (s["search"], s["method"]) == ("uneven", "cp-sat")
    written = sorted(tmp_path.glob("model*.pbtxt"))
    assert len(written) == s["uneven"]["models_solved"] >= 1  # FILE, FILE-2, ...: one per stage model solved
    sizes = []
    for f in written:
        proto = text_format.Parse(f.read_text(), cp_model_pb2.CpModelProto())
        booleans = [v.name for v in proto.variables if list(v.domain) == [0, 1]]
        assert booleans and all(n.startswith("stage") for n in booleans)  # named: stage, layers, recompute, option
        sizes.append(len(booleans))
    assert max(sizes) == s["booleans"]  # the summary reports the largest model built


def test_enumeration_builds_no_model_and_says_so(tmp_path: Path) -> None:
    """The uniform and serving searches select by an exact sort: no CP-SAT model, no file, one warning line."""
    for problem in (_write(tmp_path, LLAMA), ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml"):
        model_file = tmp_path / "model.pbtxt"
        out = run_main("solve", problem, "--json", "--export-model", model_file, "--solver-params", "num_workers: 2")
        assert out.returncode == 0, out.stderr
        s = json.loads(out.stdout)["solver"]
        assert s["method"] == "enumeration" and s["booleans"] == 0 and 1 <= s["admissible"] <= s["candidates"]
        assert not model_file.exists()
        assert out.stderr.count("\n") == 1 and "--export-model and --solver-params: no CP-SAT model" in out.stderr


def test_same_answer_twice() -> None:
    path = ROOT / "problems" / "llama2-70b-h100.yaml"
    a, b = (json.loads(run_main("solve", path, "--json", "--top-k", "3").stdout) for _ in range(2))
    for r in (a, b):
        r["solver"] = {k: v for k, v in r["solver"].items() if "wall" not in k}
    assert a == b


def test_integers_saturate_instead_of_wrapping() -> None:
    x = to_int(np.array([1.4, 2.6, 1e25, np.inf, np.nan, -1e30]))
    assert x.tolist() == [1, 3, INT_LIMIT, INT_LIMIT, INT_LIMIT, -INT_LIMIT]


def test_step_time_beyond_the_integer_range_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Reproducer (issue 13): a step time beyond the integer range wrapped around and reported "the constraints
    together exclude every feasible plan" on a problem with no constraints (then global_batch 1e15; within today's
    input bounds: Llama-3 405B at 128 k tokens x 1e8 sequences per step, ~20 years per step)."""
    data = {"model": "llama3-405b", "hardware": {"gpu": "h100-sxm", "gpus": 256},
            "task": {"kind": "pretrain", "seq_len": 131072, "global_batch": 100000000}}
    _one_line_error(run_main("solve", _write(tmp_path, data)), 2, "task.global_batch", "step time",
                    "integer range", "allowed: a smaller task.global_batch")
    data = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": 8}, "objective": "time_to_train",
            "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64, "train_tokens": 1e17}}
    _one_line_error(run_main("solve", _write(tmp_path, data)), 2, "task.train_tokens", "training time",
                    "integer range")


@pytest.mark.parametrize("problem", [
    "llama2-70b-h100.yaml", "mixtral-8x7b-h100.yaml", "serve-llama2-70b-dgx-h100.yaml", "dlrm/dlrm-i-zionex.yaml",
])
def test_every_solve_json_has_a_status(problem: str) -> None:
    out = run_main("solve", ROOT / "problems" / problem, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] in ("optimal", "feasible")


@pytest.mark.parametrize("command", ["verify", "sensitivity"])
def test_verify_and_sensitivity_refuse_recommenders_in_one_line(command: str) -> None:
    out = run_main(command, ROOT / "problems" / "dlrm" / "dlrm-a-cloud.yaml")
    _one_line_error(out, 2, f"`{command}` does not apply to recommender problems")
    assert "train_samples" not in out.stderr


def test_verify_takes_the_solver_options_and_covers_serving(tmp_path: Path) -> None:
    out = run_main("verify", ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml", "--json", "--time-limit", "30")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["agree"] and res["solver_objective"] == res["brute_force_objective"]
    _one_line_error(run_main("verify", _write(tmp_path, LLAMA), "--workers", "65"), 2, "--workers")


def test_status_codes_are_cp_models() -> None:
    """search/cpsat.py writes CpSolverStatus out (no OR-Tools import where no model is built): the proto's values."""
    from madmax_opt.search import cpsat

    assert (cpsat.UNKNOWN, cpsat.MODEL_INVALID, cpsat.FEASIBLE, cpsat.INFEASIBLE, cpsat.OPTIMAL) == (
        cp_model_pb2.UNKNOWN, cp_model_pb2.MODEL_INVALID, cp_model_pb2.FEASIBLE, cp_model_pb2.INFEASIBLE,
        cp_model_pb2.OPTIMAL)
    assert cpsat.has_solution(cp_model.OPTIMAL) and not cpsat.has_solution(cp_model.INFEASIBLE)
