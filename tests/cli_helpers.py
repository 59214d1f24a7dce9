"""Helpers shared by the CLI tests (imported as a plain module: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

from madmax_opt.cli import main as cli


def run_main(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``madmax_opt.cli.main.main()`` (what the console script calls) in this process: same output, no start-up."""
    argv = ["madmax-opt", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    saved, sys.argv = sys.argv, argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0
    finally:
        sys.argv = saved
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
