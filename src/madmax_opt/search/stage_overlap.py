"""Work of the uneven-stage search (``stages.py``) overlapped with its CP-SAT runs (issue 26).

CP-SAT's solve releases the GIL (OR-Tools' C++ solver), so on a machine with a free core other Python / numpy work
can run while a model is solved:

- :class:`Lookahead`: while the search waits for a CP-SAT run, a helper thread does work the search will need next,
  chosen from the state before the run (``stages.solve_uneven``: the strong bounds of the bases ahead, the candidate
  rows of the next bases). Each result depends on its base only, so it is the value the search would compute itself,
  and the search waits for the helper (which stops between tasks once the run is over) before it goes on: the two
  never touch the search's state at the same time, and what the search decides is unchanged.
- :class:`Deferred`: a computation whose result is needed later (the unhinted re-solve of the best base so far,
  ``stages.solve_uneven``) runs on its own thread from now on; its result is taken when needed, or dropped (a
  CP-SAT run through :class:`StoppableRun` is then stopped).

Neither changes a result: with one CP-SAT worker and a fixed seed a model's solution does not depend on when or on
which thread it is solved. ``solve_uneven`` uses them only where no model is exported (``--export-model`` numbers
the files in the order the models are solved) and no CP-SAT parameters are given (their logs would interleave).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from madmax_opt.search.cpsat import UNKNOWN, CpSatOptions, new_solver

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

T = TypeVar("T")

# how stages.solve_uneven overlaps its CP-SAT runs
OVERLAP = True  # CP-SAT runs overlapped with the search's own work (stage_overlap.py); False: one thread
OVERLAP_CHUNKS = (8, 24, 4)  # strong bounds first for this many bases (one pp: ~8 ms), then in the background
# in chunks of this many (one pp each), at most this many chunks per CP-SAT run (about as long as a run)
NEXT_ROWS = 2  # bases ahead whose candidate rows are built in the background
# the unhinted re-solve of the best plan starts once this many models after it did not improve it
# (earlier, the re-solves of plans soon beaten cost more CPU than they save; measured on the mixed-pipeline example)
RESOLVE_AFTER = 4
# CP-SAT parameters of a hinted run: its split is not returned (the model is solved again without the hint when it is
# the best, ``solve_uneven``), only its optimum is used, which any parameters prove; less presolve and no symmetry
# detection: measured -26 % of CP-SAT time on the mixed-pipeline example's hinted models
HINTED_RUN: dict[str, Any] = {"max_presolve_iterations": 1, "symmetry_level": 0}
Task = Callable[[], None]


class Lookahead:
    """Tasks planned by ``plan`` (from the search's state at the start of each CP-SAT run), run on a helper thread
    during the run; ``plan`` None: nothing is overlapped."""

    def __init__(self, plan: Callable[[], list[Task]] | None) -> None:
        self._plan = plan

    @contextmanager
    def during(self) -> Iterator[None]:
        """Around one CP-SAT solve: the planned tasks run meanwhile, in order, until the solve is over (the task
        under way is finished, the rest dropped); returns once the helper has stopped."""
        tasks = self._plan() if self._plan is not None else []
        if not tasks:
            yield
            return
        stop = threading.Event()

        def work() -> None:
            for task in tasks:
                if stop.is_set():
                    return
                try:
                    task()
                except Exception:  # the search computes it again itself and meets the same error
                    return

        thread = threading.Thread(target=work, name="uneven-lookahead", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


class Deferred(Generic[T]):
    """``fn()`` started now on its own thread; :meth:`result` waits for it (re-raising its error)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: list[T] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._value.append(fn())
            except BaseException as exc:  # handed to the caller of result()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, name="uneven-deferred", daemon=True)
        self._thread.start()

    def result(self) -> T:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._value[0]


class StoppableRun:
    """``cpsat.run`` for a model that was already solved once with a hint (so valid: no MODEL_INVALID), as a run
    that another thread may stop (:meth:`stop`; it then reports UNKNOWN and its result is not used)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solver: cp_model.CpSolver | None = None
        self._stopped = False

    def __call__(self, model: cp_model.CpModel, opts: CpSatOptions, what: str, **overrides: Any) -> tuple[Any, Any]:
        opts.solved.append(what)  # as cpsat.run (models are not exported where runs are overlapped)
        solver = new_solver(opts, **overrides)
        with self._lock:
            if self._stopped:
                return UNKNOWN, solver
            self._solver = solver
        return solver.solve(model), solver

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._solver is not None:
                self._solver.stop_search()
