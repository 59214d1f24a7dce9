"""User-facing errors: one line that names the file, the field and what is allowed."""

from __future__ import annotations


class MadmaxError(Exception):
    """Base class of every error the CLI turns into a one-line message (exit code 2)."""

    exit_code = 2


class ProblemError(MadmaxError):
    """Invalid input: a problem, plan or catalog file, or a field inside one."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        self.message = message  # without the location
        self.file = file
        self.field = field
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class InfeasibleError(MadmaxError):
    """No plan satisfies the problem's constraints; the message names the binding constraint."""

    exit_code = 3


class InternalError(MadmaxError):
    """The solver and the exact evaluator disagree: a bug, never a silent answer."""

    exit_code = 4


class TimeLimitError(MadmaxError):
    """The solver's time limit ran out before it found any plan (CP-SAT UNKNOWN): not a proof of infeasibility."""

    exit_code = 5


class InputWarning(UserWarning):
    """Input that is valid but partly unused (e.g. overlay entries for GPUs a problem does not run): the CLI prints
    it as one ``warning:`` line on stderr, once per message."""
