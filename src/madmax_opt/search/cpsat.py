"""The one CP-SAT factory: parameters, determinism, user parameters, model export and honest statuses.

Every search that builds a CP-SAT model (uneven and mixed stages, DLRM table placement, fleet allocation; the
uniform and serving searches select by an exact sort, search/selection.py) builds its ``CpSolver`` here and runs
it through :func:`run`, so that:
- the defaults are deterministic: one worker, a fixed seed (``CpSatOptions``);
- ``--solver-params`` (CP-SAT's text format, e.g. ``"linearization_level: 2 log_search_progress: true"``) is
  applied last, over the search's own settings;
- ``--export-model FILE`` writes each model solved as a text proto (the second one to FILE-2, and so on);
- statuses are reported as what they are: MODEL_INVALID is an internal error (exit 4, CP-SAT's validation message),
  UNKNOWN with no solution is "no plan proven within N s" (exit 5, :class:`TimeLimitError`), INFEASIBLE is a proof
  (the caller names the binding constraint, exit 3), FEASIBLE carries its gap to the proven bound;
- integers stay in CP-SAT's range: :func:`to_int` saturates at ``INT_LIMIT`` and :func:`check_range` refuses a
  quantity beyond it in one line that names it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.errors import InputWarning, InternalError, ProblemError, TimeLimitError
from madmax_opt.core.numeric import IntArr
from madmax_opt.search.ortools_import import load_cp_model

if TYPE_CHECKING:  # OR-Tools (cp_model 0.4 s with pandas, the protos 0.05 s) is imported where a model is built
    from ortools.sat import sat_parameters_pb2
    from ortools.sat.python import cp_model

    Status = cp_model.CpSolverStatus  # compares and hashes as the proto enum's integer (cp_model_pb2)

MAX_WORKERS = 64  # CP-SAT accepts up to 10,000; beyond the cores of any machine a search runs on
INT_LIMIT = 2**50  # every coefficient and objective CP-SAT sees stays below this (CP-SAT's own limit is 2^62)
# CpSolverStatus (ortools/sat/cp_model.proto: UNKNOWN 0, MODEL_INVALID 1, FEASIBLE 2, INFEASIBLE 3, OPTIMAL 4),
# written out so that a search that builds no model imports no OR-Tools (tests/test_cpsat.py checks them)
UNKNOWN, MODEL_INVALID, FEASIBLE, INFEASIBLE, OPTIMAL = range(5)
# the uneven search's stage models (stages._solve_base): less presolve, no symmetry detection; measured on the
# mixed-pipeline example: its one model (a proof of infeasibility) 36.7 -> 19.4 ms best of 5, hinted models -26 %
STAGE_RUN: dict[str, Any] = {"max_presolve_iterations": 1, "symmetry_level": 0}
STATUS: dict[int, str] = {OPTIMAL: "optimal", FEASIBLE: "feasible", INFEASIBLE: "infeasible", UNKNOWN: "unknown",
                          MODEL_INVALID: "model-invalid"}


def parse_params(text: str) -> sat_parameters_pb2.SatParameters:
    """CP-SAT parameters in protobuf text format, checked by CP-SAT itself (``_check_params``); an error is one line
    naming the option."""
    from google.protobuf import text_format
    from ortools.sat import sat_parameters_pb2

    params = sat_parameters_pb2.SatParameters()
    try:
        text_format.Parse(text, params)
    except text_format.ParseError as exc:
        raise ProblemError(f"not CP-SAT parameters ({exc}); allowed: SatParameters text format, e.g. "
                           "'linearization_level: 2 max_deterministic_time: 10'", field="--solver-params") from None
    _check_params(text)
    return params


@cache
def _check_params(text: str) -> None:
    """CP-SAT's own parameter check (e.g. num_workers at most 10000), by an empty model solved with them, so that it
    runs whether or not a search builds a model later; once per text (options are copied per time limit)."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.merge_text_format(text)
    if solver.solve(cp_model.CpModel()) == MODEL_INVALID:
        raise ProblemError(f"CP-SAT rejected the parameters: {solver.solution_info()}", field="--solver-params")


@dataclass(frozen=True)
class CpSatOptions:
    """How every CP-SAT run of one command is configured (the CLI's --time-limit, --workers, --solver-params,
    --export-model)."""

    time_limit_s: float = 60.0
    workers: int = 1  # 1 = deterministic
    seed: int = 0
    params: str | None = None
    export_model: Path | None = None
    exported: list[Path] = field(default_factory=list, compare=False)  # files written so far
    solved: list[str] = field(default_factory=list, compare=False)  # the models run so far, by what they choose

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not 1 <= self.workers <= MAX_WORKERS:
            raise ProblemError(f"{self.workers} workers; allowed: 1 to {MAX_WORKERS}", field="--workers")
        if not (self.time_limit_s > 0 and np.isfinite(self.time_limit_s)):
            raise ProblemError(f"{self.time_limit_s} s; allowed: a finite number of seconds > 0",
                               field="--time-limit")
        if self.params:
            parse_params(self.params)

    def with_time_limit(self, time_limit_s: float) -> CpSatOptions:
        """The same options with another time limit (e.g. what is left of a search's budget); exports shared."""
        return CpSatOptions(max(time_limit_s, 0.01), self.workers, self.seed, self.params, self.export_model,
                            self.exported, self.solved)


def options(cpsat: CpSatOptions | None = None, **kwargs: Any) -> CpSatOptions:
    """``cpsat`` itself, or options from the keyword arguments (time_limit_s, workers, seed, params, ...)."""
    return cpsat if cpsat is not None else CpSatOptions(**kwargs)


def new_solver(opts: CpSatOptions, **overrides: Any) -> cp_model.CpSolver:
    """A solver with the deterministic defaults, the search's own ``overrides``, then the user's parameters."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = opts.workers
    prm.random_seed = opts.seed
    prm.max_time_in_seconds = opts.time_limit_s
    for name, value in overrides.items():
        setattr(prm, name, value)
    if opts.params:
        prm.merge_text_format(opts.params)
    return solver


def export(model: cp_model.CpModel, opts: CpSatOptions) -> None:
    """Write ``model`` as a text proto to --export-model (FILE, then FILE-2, FILE-3, ... for later models)."""
    if opts.export_model is None:
        return
    path = opts.export_model
    n = len(opts.exported) + 1
    if n > 1:
        path = path.with_name(f"{path.stem}-{n}{path.suffix}")
    path.write_text(str(model.proto))
    opts.exported.append(path)


def run(model: cp_model.CpModel, opts: CpSatOptions, what: str, **overrides: Any) -> tuple[Status, cp_model.CpSolver]:
    """Solve ``model`` (``what`` names it in messages); MODEL_INVALID raises, every other status is returned."""
    export(model, opts)
    opts.solved.append(what)
    solver = new_solver(opts, **overrides)
    status = solver.solve(model)
    if status == MODEL_INVALID:
        problem = model.validate()
        if problem:
            raise InternalError(f"CP-SAT rejected the {what} model: {problem}")
        raise ProblemError(f"CP-SAT rejected the parameters: {solver.solution_info()}", field="--solver-params")
    return status, solver


def warn_if_unused(opts: CpSatOptions, search: str) -> None:
    """--export-model or --solver-params given to a command whose searches built no CP-SAT model (``search`` says
    which search ran instead): one warning line, since nothing was written and nothing was tuned."""
    given = [name for name, value in (("--export-model", opts.export_model), ("--solver-params", opts.params))
             if value]
    if given and not opts.solved:
        warnings.warn(f"{' and '.join(given)}: no CP-SAT model was built ({search}), so nothing was written or "
                      "tuned; CP-SAT models are built by uneven or mixed stages, DLRM placement and fleet",
                      InputWarning, stacklevel=2)


def has_solution(status: Status) -> bool:
    return status in (OPTIMAL, FEASIBLE)


def time_limit_error(opts: CpSatOptions, what: str) -> TimeLimitError:
    """UNKNOWN: the time limit ran out before any plan was found (not a proof that none exists)."""
    extra = " (or the limits set in --solver-params)" if opts.params else ""
    return TimeLimitError(f"no plan proven within {opts.time_limit_s:g} s ({what}); raise --time-limit{extra}")


def gap(objective: float, bound: float) -> float:
    """Relative gap of a solution to CP-SAT's proven bound: (objective - bound) / |objective| (0 when optimal)."""
    return (objective - bound) / max(abs(objective), 1.0)


def to_int(x: NDArray[np.float64]) -> IntArr:
    """Rounded to integers, saturating at INT_LIMIT (NaN, inf and anything larger) instead of wrapping around."""
    y = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=float(INT_LIMIT), posinf=float(INT_LIMIT),
                      neginf=-float(INT_LIMIT))
    return np.rint(np.clip(y, -float(INT_LIMIT), float(INT_LIMIT))).astype(np.int64)


def check_range(largest: float, limit: float, quantity: str, *, field: str | None, file: str | None = None,
                unit: str = "", scale: float = 1.0) -> None:
    """Refuse in one line when ``largest`` (integer units) reaches ``limit``: names the quantity and its maximum.

    ``scale`` converts integer units back to ``unit`` for the message (e.g. 1e6 for microseconds -> s)."""
    if largest >= limit:
        value = "" if largest >= INT_LIMIT else f" ({largest / scale:.3g} {unit})"  # saturated: value unknown
        raise ProblemError(
            f"{quantity}{value} is beyond the solver's integer range (at most {limit / scale:.3g} {unit}); "
            f"allowed: a smaller {field or 'problem'}", file=file, field=field)


__all__ = ["INT_LIMIT", "MAX_WORKERS", "CpSatOptions", "check_range", "export", "gap", "has_solution",
           "new_solver", "options", "parse_params", "run", "time_limit_error", "to_int", "warn_if_unused"]
