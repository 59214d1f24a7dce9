"""The one typer app, its consoles and the argument types every command shares (imports stay light: the
domain layers are imported inside each command, so ``--help`` starts fast)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    help="Optimal, memory-feasible plans and hardware for training, serving and recommender models "
    "(CP-SAT search over an exact performance model).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ProblemArg = Annotated[Path, typer.Argument(help="problem file (YAML)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]


def console() -> Console:
    """The standard-output console (rich is imported on first use, not at start-up)."""
    from rich.console import Console

    return Console()
