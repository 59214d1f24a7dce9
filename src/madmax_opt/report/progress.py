"""Progress on standard error for work that takes more than a few seconds (validate, sensitivity, fleet): a rich
bar with a count and the elapsed time, drawn only on a terminal and cleared when done, so that standard output
(tables, JSON) and redirected runs stay exactly as they were."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported only where standard error may be a terminal (a --json solve imports none)
    from rich.progress import Progress


class Bar:
    """One task of a progress display; a no-op when standard error is not a terminal."""

    def __init__(self, description: str, progress: Progress | None, total: int | None) -> None:
        self.description = description
        self._progress = progress
        self._task = progress.add_task(description, total=total) if progress is not None else None

    def show(self, what: str | None) -> None:
        """Say what is under way (without advancing)."""
        if self._progress is not None and self._task is not None:
            text = f"{self.description}: {what}" if what else self.description
            self._progress.update(self._task, description=text)

    def step(self, what: str | None = None) -> None:
        """One step done; ``what`` (if given) is shown as what comes next or what was just done."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)
            if what is not None:
                self.show(what)


@contextmanager
def progress_bar(description: str, total: int | None, *, count: bool = True) -> Iterator[Bar]:
    """A bar of ``total`` steps (None: a counter without an end; ``count=False``: a spinner and the elapsed time,
    for one long step such as a CP-SAT search)."""
    if _not_a_terminal():
        yield Bar(description, None, total)
        return
    from rich.console import Console

    err = Console(stderr=True)
    if not err.is_terminal:
        yield Bar(description, None, total)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    if not count:
        columns: tuple[Any, ...] = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    elif total is None:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed} done"),
                   TimeElapsedColumn())
    else:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        yield Bar(description, progress, total)


def _not_a_terminal() -> bool:
    """Standard error is surely no terminal for rich (``Console.is_terminal``, rich 13-15), decided without importing
    it: TTY_COMPATIBLE=0, or FORCE_COLOR set empty, or neither TTY_COMPATIBLE=1 nor FORCE_COLOR set and not a tty.
    False means: ask rich (which may still say no, e.g. in Jupyter)."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "0"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force == ""
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return isatty is None or not isatty()
    except ValueError:  # a closed stream (rich says no too)
        return True
