"""main() builds only the command a command line names (cli/main.py): the same output, help, errors and exit codes as
the whole app, and the app left as it was."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest

from cli_helpers import run_main
from madmax_opt.cli import main as cli
from madmax_opt.cli.app import app, command_name


def _whole_app(*args: str) -> tuple[int, str, str]:
    """main() with every command registered (what it did before it built the named one alone)."""
    out, err = io.StringIO(), io.StringIO()
    saved, sys.argv = sys.argv, ["madmax-opt", *args]
    named = cli._named_command
    cli._named_command = lambda argv: None  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0
    finally:
        cli._named_command = named  # type: ignore[method-assign]
        sys.argv = saved
    return code, out.getvalue(), err.getvalue()


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

