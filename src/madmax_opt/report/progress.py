"""Progress on standard error for work that takes more than a few seconds (validate, sensitivity, fleet): a rich
bar with a count and the elapsed time, drawn only on a terminal and cleared when done, so that standard output
(tables, JSON) and redirected runs stay exactly as they were."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # rich.progress is imported only when a bar is drawn (on a terminal)
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
