"""A practitioner's first hour (issue 27): long work reports progress, every command that writes says what it wrote
with a one-line summary. Counts are checked against the written files, read independently."""

from __future__ import annotations

import re
from pathlib import Path

from cli_helpers import run_main
from madmax_opt.io.problem import load_problem
from madmax_opt.report.progress import progress_bar
from madmax_opt.studies.sensitivity import Variant, run_sensitivity

ROOT = Path(__file__).resolve().parents[1]
SMALL = Path(__file__).resolve().parent / "data" / "small.yaml"


def test_progress_on_a_terminal_counts_steps_on_stderr_only(capsys: object, monkeypatch: object) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # type: ignore[attr-defined]  # rich: treat stderr as a terminal
    with progress_bar("work", 3) as bar:
        bar.show("first")
        bar.step("second")
        bar.step()
        assert bar._progress is not None and bar._task is not None
        task = bar._progress.tasks[0]
        assert (task.completed, task.total) == (2, 3) and task.description == "work: second"
    out = capsys.readouterr()  # type: ignore[attr-defined]
    assert out.out == ""  # tables and JSON on stdout stay as they were


def test_progress_draws_nothing_off_a_terminal(capsys: object) -> None:
    with progress_bar("work", 3) as bar:  # pytest's stderr is not a terminal: no bar, no text
        bar.show("first")
        bar.step("second")
    out = capsys.readouterr()  # type: ignore[attr-defined]
    assert out.out == "" and out.err == ""


def test_pareto_summary_counts_the_written_table(tmp_path: Path) -> None:
    from madmax_opt.report.serving_pareto import _front_summary

    md = tmp_path / "front.md"
    rows = [("11.66", "yes"), ("12.01", "yes"), ("40.20", "no")]  # a table as write_pareto writes it
    md.write_text("# Throughput vs latency\n\nsome text | with a bar\n\n| TPOT ms | plan | meets targets |\n"
                  "|---|---|---|\n" + "".join(f"| {t} | dp1 tp8 | {m} |\n" for t, m in rows))
    assert _front_summary(md) == "3 plans in the table, 2 meeting the targets"


# ------------------------------------------------------------------------------------------------- --help


def _commands() -> list[str]:
    from madmax_opt.cli.app import app, command_name

    return [command_name(info) for info in app.registered_commands]


def test_help_groups_development_commands_apart_and_every_name_exists() -> None:
    from madmax_opt.cli.app import DEVELOPMENT_COMMANDS, DEVELOPMENT_PANEL

    names = _commands()
    assert set(DEVELOPMENT_COMMANDS) <= set(names)  # a renamed command would silently rejoin the user's list
    text = run_main("--help").stdout
    head, dev = text.split(DEVELOPMENT_PANEL)
    for name in names:
        shown_in = dev if name in DEVELOPMENT_COMMANDS else head
        assert re.search(rf"│ {re.escape(name)}\s", shown_in), name
    for name in ("solve", "evaluate", "calibrate", "validate", "sweep", "fleet"):
        assert not re.search(rf"│ {re.escape(name)}\s", dev), name


def test_no_flag_shows_a_bool_type_in_help() -> None:
    for name in ["", "solve", "fleet", "bench-startup"]:
        assert not name or name in _commands()
        r = run_main(*([name] if name else []), "--help")
        assert r.returncode == 0, name
        assert "<bool>" not in r.stdout, name
    assert "<int range>" in run_main("solve", "--help").stdout  # options with values keep their type


# ------------------------------------------------------------------------------------ deadline_hours


DEADLINE = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": [8, 16]},
            "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64, "train_tokens": 1.0e12}}


def test_a_deadline_in_a_problem_file_is_the_throughput_floor_it_implies() -> None:
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.search.result import solve_result

    hours = 5000.0
    floor = 1.0e12 / (hours * 3600.0)  # tokens/s to train 1e12 tokens in 5000 h, by hand
    by_deadline = solve_result(problem_from_dict(DEADLINE | {"constraints": {"deadline_hours": hours}}), 1, 30, 1)
    by_floor = solve_result(problem_from_dict(DEADLINE | {"constraints": {"min_throughput": floor}}), 1, 30, 1)
    assert by_deadline["best"]["plan"] == by_floor["best"]["plan"]
    assert by_deadline["best"]["tokens_per_s"] >= floor


def test_an_unmeetable_deadline_is_named_in_the_error() -> None:
    r = run_main_yaml(DEADLINE | {"constraints": {"deadline_hours": 10.0}})
    assert r.returncode == 3
    needs = 1.0e12 / (10.0 * 3600.0)
    assert f"deadline_hours=10 (task.train_tokens 1e+12 in 10 h needs {needs:.4g} tokens/s)" in r.stderr
    assert "min_throughput" not in r.stderr  # the user never wrote it


def test_a_deadline_without_a_token_budget_is_one_line() -> None:
    task = {k: v for k, v in DEADLINE["task"].items() if k != "train_tokens"}  # type: ignore[attr-defined]
    r = run_main_yaml(DEADLINE | {"task": task, "constraints": {"deadline_hours": 10.0}})
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "constraints.deadline_hours" in r.stderr and "train_tokens" in r.stderr


def test_a_sweeps_deadline_reaches_its_problems_so_infeasible_rows_name_it(tmp_path: Path) -> None:
    import yaml

    from madmax_opt.core.errors import InfeasibleError
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.search.result import solve_result
    from madmax_opt.studies.sweep_spec import load_sweep

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"models": ["llama2-7b"], "task": DEADLINE["task"],
                                    "hardware": [{"gpu": "h100-sxm", "gpus": 8}], "objectives": ["throughput"],
                                    "constraints": {"deadline_hours": 10.0}}))
    (combo,) = load_sweep(path).combinations
    assert combo.problem["constraints"]["deadline_hours"] == 10.0
    try:
        solve_result(problem_from_dict(combo.problem), 1, 30, 1)
        raise AssertionError("a 10-hour deadline for 1e12 tokens on 8 GPUs cannot be met")
    except InfeasibleError as exc:
        assert "deadline_hours=10" in str(exc)


def run_main_yaml(data: dict[str, object]):  # type: ignore[no-untyped-def]
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.yaml"
        path.write_text(yaml.safe_dump(data))
        return run_main("solve", path)


def test_verify_prints_the_solver_beside_brute_force(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(DEADLINE | {"hardware": {"gpu": "h100-sxm", "gpus": 8}}))
    text = run_main("verify", path).stdout
    js = __import__("json").loads(run_main("verify", path, "--json").stdout)
    assert "{'dp'" not in text and "solver" in text and "brute force" in text
    from madmax_opt.model.plan_settings import plan_text

    plan = plan_text(js["solver_plan"])
    assert re.search(rf"│ plan\s+│ {re.escape(plan)}\s+│ {re.escape(plan_text(js['brute_force_plan']))}", text)
    assert "equals brute force" in text if js["agree"] else "worse than brute force" in text


def test_timeline_says_which_plan_of_a_list_it_simulates(tmp_path: Path, capsys: object) -> None:
    import yaml

    from madmax_opt.cli.timeline import _say_which

    plans = ROOT / "problems" / "plans" / "llama2-70b-3d.yaml"
    n = len(yaml.safe_load(plans.read_text()))
    assert n > 1
    _say_which(plans)  # what `timeline` does when --index is not given
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert f"{plans} holds {n} plans; simulating plan 0 (the first); --index K (0 to {n - 1})" in err
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump([yaml.safe_load(plans.read_text())[0]]))
    _say_which(one)  # a single plan: nothing to say
    assert capsys.readouterr().err == ""  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------- 80 columns


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] in "┏┃┡│└├"]


def test_evaluate_ops_at_80_columns_keeps_op_names_and_fits(monkeypatch: object) -> None:
    import json

    monkeypatch.setenv("COLUMNS", "80")  # type: ignore[attr-defined]
    args = ("evaluate", ROOT / "problems" / "llama2-70b-h100.yaml", "--plan",
            ROOT / "problems" / "plans" / "llama2-70b-3d.yaml", "--ops")
    text = run_main(*args).stdout
    assert "…" not in text
    assert all(len(line) <= 80 for line in _table_lines(text))
    ops = {op["op"].split()[0] for rec in json.loads(run_main(*args, "--json").stdout) for op in rec["ops"]}
    cells = {cell.strip() for line in _table_lines(text) for cell in line.split("│")}
    assert ops <= {c.split()[0] for c in cells if c}  # every op's first word stands whole in its cell


def test_sensitivity_and_pareto_tables_at_80_columns_keep_their_words() -> None:
    from rich.console import Console

    from madmax_opt.analysis.serving_records import ServingHardwareRecord, ServingPlanRecord, ServingRecord
    from madmax_opt.model.plan_settings import plan_text
    from madmax_opt.report.sensitivity_report import print_study
    from madmax_opt.report.serving_tables import pareto_table

    seen: list[tuple[str, float]] = []

    def on_variant(v: Variant) -> None:  # the CLI's progress bar: the base, then each variant as it is done
        seen.append((v.param, v.factor))

    study = run_sensitivity(load_problem(SMALL), ["nvlink_bandwidth", "hbm_capacity"], [2.0], time_limit_s=30.0,
                            on_variant=on_variant)
    assert seen == [("base", 1.0)] + [(v.param, v.factor) for v in study.variants] and len(seen) == 1 + 2
    console = Console(width=80, record=True)
    print_study(study, console)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in _table_lines(text))
    assert "│ nvlink_bandwidth │" in text and "│ hbm_capacity" in text
    plan = ServingPlanRecord(dp=8, tp=1, pp=1, ep=8, batch=192, max_num_seqs=None, precision="fp4",
                             prefill_replicas=0, system="dgx-b200")
    rows = [ServingRecord.model_construct(  # only the fields the table reads
        tpot_s=0.0123, ttft_s=0.1, output_tokens_per_s_per_gpu=1234.5, output_tokens_per_s=9876.0,
        hardware=ServingHardwareRecord(system="dgx-b200", gpu="b200", gpus=8), meets_targets=True, plan=plan)]
    console = Console(width=80, record=True)
    console.print(pareto_table(rows))
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in _table_lines(text))
    words = plan_text(plan).split()
    assert all(w in text for w in words) and "precision=fp4" in text


# ------------------------------------------------------------------------------------- README calibrate line


def test_the_readme_calibrate_line_runs_on_the_shipped_example(tmp_path: Path, monkeypatch: object) -> None:
    import shlex

    import yaml

    (line,) = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("madmax-opt calibrate ")]
    args = shlex.split(line.split("#", 1)[0])[1:]
    out = tmp_path / "cluster.yaml"
    args[args.index("--out") + 1] = str(out)  # the README writes into the current directory; the test into tmp
    monkeypatch.chdir(ROOT)  # type: ignore[attr-defined]  # the README's paths are relative to the clone
    r = run_main(*args)
    assert r.returncode == 0, r.stderr
    runs = yaml.safe_load((ROOT / args[1]).read_text())["runs"]  # the example file, read independently
    pairs = {(run["hardware"]["gpu"], run["framework"]) for run in runs}
    overlay = yaml.safe_load(out.read_text())
    fitted = {(c["gpu"], c["framework"]): c for c in overlay["calibrations"]}
    assert set(fitted) == pairs
    for pair in pairs:
        n = sum((run["hardware"]["gpu"], run["framework"]) == pair for run in runs)
        assert fitted[pair]["fit"]["runs"] == n and f"{pair[0]} / {pair[1]}: {n} run(s)" in r.stdout
