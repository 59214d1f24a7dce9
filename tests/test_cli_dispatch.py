"""main() builds only the command a command line names (cli/main.py): the same output, help, errors and exit codes as
the whole app, and the app left as it was."""

from __future__ import annotations

import pytest

from cli_helpers import run_main
from madmax_opt.cli import main as cli
from madmax_opt.cli.app import app, command_name


def _whole_app(*args: str) -> tuple[int, str, str]:
    """main() with every command registered (what it did before it built the named one alone)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_named_command", lambda argv: None)
        got = run_main(*args)
    return got.returncode, got.stdout, got.stderr


def test_a_command_line_names_one_command() -> None:
    assert [command_name(i) for i in cli._named_command(["solve", "p.yaml"]) or []] == ["solve"]
    assert [command_name(i) for i in cli._named_command(["bench-startup"]) or []] == ["bench-startup"]
    for argv in ([], ["--help"], ["--version"], ["solv", "p.yaml"], ["-x"]):
        assert cli._named_command(argv) is None


@pytest.mark.parametrize("args", [
    ("solve",), ("solve", "--help"), ("solve", "missing.yaml", "--bogus"), ("solve", "--top-k", "0", "x.yaml"),
    ("catalog", "--help"), ("schema", "--help"), ("evaluate",), ("bogus",), ("solv", "x.yaml"), ("--help",),
])
def test_output_and_exit_code_are_those_of_the_whole_app(args: tuple[str, ...]) -> None:
    before = list(app.registered_commands)
    got = run_main(*args)
    assert (got.returncode, got.stdout, got.stderr) == _whole_app(*args)
    assert app.registered_commands == before  # restored, also after an error



@pytest.mark.parametrize(("args", "raised"), [
    (("solve", "--help"), True), (("fleet", "--help"), True), (("--help",), True),
    *(((name, "--help"), False) for name in cli.STUDY_COMMANDS),
])
def test_gc_threshold_raised_for_bounded_commands_only(args: tuple[str, ...], raised: bool) -> None:
    """A run raises the collector's young threshold (cli/main.py: ~40 ms per solve), except the validation studies,
    whose large heaps ran ~5 % slower with it (the autouse fixture in conftest.py restores the threshold)."""
    import gc

    before = gc.get_threshold()[0]
    run_main(*args)
    assert gc.get_threshold()[0] == (max(before, cli.GC_YOUNG_OBJECTS) if raised else before)
