"""Command line: ``madmax-opt`` with one typer app (cli/app.py); each command group lives in its own module here
and imports the domain layers only when it runs, so ``madmax-opt --help`` starts in a fraction of a second."""

from __future__ import annotations

import gc
import os
import re
import sys
import warnings
from typing import Annotated, NoReturn, TextIO

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
from madmax_opt.cli.app import app, command_name, group_commands
from madmax_opt.core.errors import InputWarning, MadmaxError

group_commands()  # bench and development commands apart from the user's in --help

# The cyclic garbage collector runs after every GC_YOUNG_OBJECTS container objects net allocated (Python's default:
# 700). A solve creates ~50,000 objects that live to its end (numpy, typer, pydantic's schemas, the models), and at
# 700 the collector ran ~125 times per solve, scanning them again and again: 33-45 ms per solve (gc.callbacks, the
# serving, DLRM and mixed-pipeline examples, load ~3). main() sets 100,000 for the rest of the process (restoring 700
# at its end would start one collection of everything allocated, ~40 ms, on the way out): no collection during a
# solve, one per 100,000 allocations in a long command (sweep, fleet: unchanged time); cycles are still collected.
# Where the heap grows large it costs: validate 211-213 s against 200-205 s at 700 (two runs each, 2026-12-07), so
# the validation studies (STUDY_COMMANDS, minutes each, where 40 ms of start-up do not matter) keep Python's 700.
GC_YOUNG_OBJECTS = 100_000
STUDY_COMMANDS = ("validate", "validate-inference", "validate-online", "fit-serving", "paper", "bench-all")
NUMERIC_WARNING = re.compile(r"overflow|underflow|divide by zero|invalid value|Mean of empty|Degrees of freedom")
MAX_ERROR_CHARS = 4_000  # an error line longer than this keeps its head and tail (the file, field and "allowed")


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


OUTPUT_OPTIONS = ("--out", "-o", "--md", "--plot", "--export-model", "--cache")


def _outputs() -> str:
    """The output paths given on the command line, as the prefix of an error that came without a file name (a
    write to /dev/full fails in write(), whose error names no file; inputs are read by io/yaml_files.py, whose
    errors always name theirs)."""
    argv = sys.argv[1:]
    named = [f"{a} {argv[i + 1]}" for i, a in enumerate(argv[:-1]) if a in OUTPUT_OPTIONS]
    named += [a.replace("=", " ", 1) for a in argv if a.split("=", 1)[0] in OUTPUT_OPTIONS and "=" in a]
    return f"cannot write {', '.join(named)}: " if named else ""


def _named_command(argv: list[str]) -> list[typer.models.CommandInfo] | None:
    """The registered command the command line names first (``madmax-opt solve ...``), alone; None when it names
    none (``--help``, ``--version``, no arguments, a misspelt command: the whole app answers, listing them)."""
    if not argv or argv[0].startswith("-"):
        return None
    named = [info for info in app.registered_commands if command_name(info) == argv[0]]
    return named or None


def _one_blas_thread() -> None:
    """Load numpy's OpenBLAS with one thread (OPENBLAS_NUM_THREADS=1 while numpy is imported, then unset again, so
    that launched runs and workers get the environment as given), unless the variable is set or numpy is loaded.

    The matrices here are small: with a thread per core, OpenBLAS's extra thread spun on the second core after each
    threaded call, ~0.1 s of CPU per solve (serve-llama3-70b(-arrival): CPU 0.58-0.63 -> 0.47-0.52 s per process,
    wall 7-8 ms less at load 1.7 on 2 cores); one thread also makes a large dot product's rounding independent of
    the machine's core count. Every example's solve --json is identical with one thread."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401  (OpenBLAS reads the variable when numpy loads it)
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def main() -> None:
    """Entry point: one-line errors, exit codes 2 (input), 3 (infeasible), 4 (internal), 5 (time limit, no plan found); no tracebacks."""

    def fail(message: str, code: int) -> NoReturn:
        line = " ".join(message.split())  # always one line, and a readable one: a value of megabytes is cut
        if len(line) > MAX_ERROR_CHARS:
            line = f"{line[:MAX_ERROR_CHARS // 2]} ... ({len(line) - MAX_ERROR_CHARS:,} characters cut) ... " \
                f"{line[-MAX_ERROR_CHARS // 2:]}"
        print("error: " + line, file=sys.stderr)
        sys.exit(code)

    numeric: list[str] = []  # numpy's floating-point warnings, held back (one summary line instead)
    shown = warnings.showwarning
    said: set[str] = set()

    def hold_numeric(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, InputWarning):
            if str(message) not in said:  # a problem loaded again (sweep, sensitivity) warns once
                said.add(str(message))
                print("warning: " + " ".join(str(message).split()), file=sys.stderr)
        elif issubclass(category, RuntimeWarning) and NUMERIC_WARNING.search(str(message)) and not os.environ.get(
                "MADMAX_TRACEBACK"):
            numeric.append(f"{message} ({os.path.basename(filename)}:{lineno})")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = hold_numeric
    registered = app.registered_commands
    young, *older = gc.get_threshold()
    if not sys.argv[1:] or sys.argv[1] not in STUDY_COMMANDS:
        gc.set_threshold(max(young, GC_YOUNG_OBJECTS), *older)
    try:
        # typer builds a click command of every registered command on each run (~20 ms for the 26 here): a
        # command line that names one gets an app of that command alone (same options, help and errors)
        app.registered_commands = _named_command(sys.argv[1:]) or registered
        if app.registered_commands is not registered and "--help" not in sys.argv[2:]:
            _one_blas_thread()  # a command's run (every one imports numpy); not --help or --version
        code = app(standalone_mode=False)  # returns the code of a typer.Exit raised by a command
        if numeric:  # the command finished: say once that a number overflowed on the way, and where first
            print(f"warning: {len(numeric)} numerical warning(s) held back, first: {numeric[0]} "
                  "(MADMAX_TRACEBACK=1 shows each)", file=sys.stderr)
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
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else f"{_outputs()}{exc.strerror or exc}", 2)
    except Exception as exc:  # a bug: one line naming it (exit 4); MADMAX_TRACEBACK=1 shows the traceback
        if os.environ.get("MADMAX_TRACEBACK"):
            raise
        fail(f"internal error: {type(exc).__name__}: {exc} (a bug: please report the command and input; "
             "MADMAX_TRACEBACK=1 shows where)", 4)
    finally:
        warnings.showwarning = shown  # main() called in process (tests) leaves the hook and the app as it found them
        app.registered_commands = registered
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
