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


def test_sensitivity_reports_the_base_and_every_variant_as_it_is_done() -> None:
    seen: list[tuple[str, float]] = []

    def on_variant(v: Variant) -> None:
        seen.append((v.param, v.factor))

    study = run_sensitivity(load_problem(SMALL), ["hbm_bandwidth", "price"], [0.5, 2.0], time_limit_s=30.0,
                            on_variant=on_variant)
    assert seen == [("base", 1.0)] + [(v.param, v.factor) for v in study.variants]
    assert len(seen) == 1 + 2 * 2


def test_progress_draws_nothing_off_a_terminal(capsys: object) -> None:
    with progress_bar("work", 3) as bar:  # pytest's stderr is not a terminal: no bar, no text
        bar.show("first")
        bar.step("second")
    out = capsys.readouterr()  # type: ignore[attr-defined]
    assert out.out == "" and out.err == ""


def test_pareto_says_what_it_wrote_and_what_the_table_holds(tmp_path: Path) -> None:
    r = run_main("pareto", ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml", "--out", tmp_path / "front")
    assert r.returncode == 0, r.stderr
    md = tmp_path / "front.md"
    assert f"wrote {md} and {md.with_suffix('.png')}" in r.stdout
    table = [line for line in md.read_text().splitlines() if re.match(r"\| [0-9]", line)]  # data rows
    met = [line for line in table if line.rstrip().endswith("| yes |")]
    assert f"pareto: {len(table)} plans in the table, {len(met)} meeting the targets" in r.stdout
    assert 0 < len(met) <= len(table)


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
    for name in ["", "solve", "evaluate", "validate", "fleet", "sweep", "sensitivity", "emit", "bench-startup"]:
        assert not name or name in _commands()
        r = run_main(*([name] if name else []), "--help")
        assert r.returncode == 0, name
        assert "<bool>" not in r.stdout, name
    assert "<int range>" in run_main("solve", "--help").stdout  # options with values keep their type
