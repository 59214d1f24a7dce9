"""Command line: ``madmax-opt`` with one typer app (cli/app.py); each command group lives in its own module here
and imports the domain layers only when it runs, so ``madmax-opt --help`` starts in a fraction of a second."""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer

from madmax_opt.cli import (  # noqa: F401  (each module registers its commands on the app)
    calibrate,
    core,
    emit,
    fleet,
    sensitivity,
    serving,
    serving_fit,
    studies,
    sweep,
    timeline,
)
from madmax_opt.cli.app import app, group_commands
from madmax_opt.core.errors import MadmaxError

group_commands()  # bench and development commands apart from the user's in --help


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version  # 0.1 s of imports: only when asked

        try:
            print(f"madmax-opt {version('madmax-opt')}")
        except PackageNotFoundError:  # running from a source tree that was never installed
            print("madmax-opt (not installed)")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Optimal, memory-feasible plans and hardware for training, serving and recommender models."""


def main() -> None:
    """Entry point: one-line errors, exit codes 2 (input), 3 (infeasible), 4 (internal), 5 (time limit, no plan found); no tracebacks."""

    def fail(message: str, code: int) -> NoReturn:
        print("error: " + " ".join(message.split()), file=sys.stderr)  # always one line
        sys.exit(code)

    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit raised by a command
    except MadmaxError as exc:
        fail(str(exc), exc.exit_code)
    except typer.TyperException as exc:  # usage: unknown command or option, missing argument, bad value
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare command: its help is the answer
            print(exc.format_message() if ctx is None else ctx.get_help())
            sys.exit(2)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        fail(exc.format_message() + hint, 2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        fail("aborted", 130)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.exit(0)
    except OSError as exc:  # e.g. an output directory that cannot be written
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc), 2)
    except Exception as exc:  # a bug: one line naming it (exit 4); MADMAX_TRACEBACK=1 shows the traceback
        if os.environ.get("MADMAX_TRACEBACK"):
            raise
        fail(f"internal error: {type(exc).__name__}: {exc} (a bug: please report the command and input; "
             "MADMAX_TRACEBACK=1 shows where)", 4)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
