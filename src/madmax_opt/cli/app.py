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


# ------------------------------------------------------------------------------------------------- help


def _flag_without_type(self: typer.core.TyperOption, ctx: typer.Context) -> str | None:
    """--help shows no '<bool>' beside a flag (it takes no value); every other option keeps its type."""
    if self.is_flag and not self.count:
        return None
    return _typed(self, ctx)


_typed = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign, assignment]

# commands for developers of madmax-opt (benchmarks, paper reproductions, refits of the shipped calibration):
# listed in their own --help panel, apart from the user's commands
DEVELOPMENT_COMMANDS = (
    "paper", "bench-all", "bench-solver", "bench-fleet", "bench-evaluator", "bench-sensitivity", "bench-trace", "bench-startup",
    "trace-check", "validate-inference", "validate-online", "fit-serving",
)
DEVELOPMENT_PANEL = "Benchmarks and development"


def command_name(info: typer.models.CommandInfo) -> str:
    """The name a registered command is called by (typer's rule: the function's name with '-' for '_')."""
    assert info.callback is not None
    return info.name or info.callback.__name__.lower().replace("_", "-")


def group_commands() -> None:
    """Put the development commands in their own --help panel (called once every command is registered)."""
    for info in app.registered_commands:
        if command_name(info) in DEVELOPMENT_COMMANDS:
            info.rich_help_panel = DEVELOPMENT_PANEL
