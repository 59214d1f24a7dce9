"""Batch optimisation: a sweep file -> one problem per combination -> OUTDIR/results.jsonl + results.csv.

A sweep names models, task(s), hardware entries (catalog systems, globs such as ``cloud-*`` or ``all``,
GPU names, inline systems) with cluster sizes, objectives and shared constraints. Every (model, task, system,
size, objective) is one single-option problem solved by the CP-SAT solver (one CP-SAT worker: deterministic).
With one hardware option per problem the plan that minimises the step time also minimises $ per token and time
to train, so the union of the per-problem optima holds the exact time-versus-cost Pareto front of the sweep.

Safety: the whole sweep is validated before any work starts; every finished problem is appended as one JSON
line (write + flush + fsync), so an interrupt loses only problems in flight; a rerun skips keys already in the
file (a truncated last line from a crash is dropped); a failing problem is recorded with its error and the
sweep goes on."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import (
    Task as ProgressTask,
)
from rich.text import Text

from madmax_opt.core.errors import ProblemError
from madmax_opt.studies.sweep_results import (
    ResultsLog,
    _one_line,
    read_rows,
    rewrite_rows,
    solve_one,
    write_json,
    write_table,
)
from madmax_opt.studies.sweep_spec import MANIFEST_FILE, RESULTS_FILE, TABLE_FILE, Sweep

# ------------------------------------------------------------------------------------------ execution


Job = tuple[str, dict[str, Any], dict[str, Any]]  # key, label, problem
OnRow = Callable[[dict[str, Any]], None]
SolveFn = Callable[[str, dict[str, Any], dict[str, Any], str, dict[str, Any]], dict[str, Any]]


def error_row(job: Job, kind: str, message: str) -> dict[str, Any]:
    """The row of a problem that could not be solved because its worker failed (not the problem itself)."""
    key, label, _ = job
    return {
        "key": key,
        "combination": label,
        "status": "error",
        "result": None,
        "wall_s": 0.0,
        "error": {"type": kind, "message": message},
    }


PARENT_POLL_S = 0.5  # how often a worker checks that the sweep process is still alive
PR_SET_PDEATHSIG = 1  # linux/prctl.h: signal this process when its parent dies


def _worker_init(parent_pid: int) -> None:
    """Pool workers leave Ctrl-C to the parent, which stops them and records what finished; and they exit when
    the sweep process dies however it dies (SIGKILL included): on Linux the kernel sends them SIGKILL
    (PR_SET_PDEATHSIG), everywhere a daemon thread polls the parent pid. With the workers gone, the
    multiprocessing resource tracker (whose pipe they held) sees end-of-file and exits too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no libc prctl: the polling thread below still applies
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # the sweep is gone: nobody will read this worker's result


def run_local(
    todo: list[Job],
    source: str,
    solver: dict[str, Any],
    workers: int,
    on_row: OnRow,
    fn: SolveFn | None = None,
) -> None:
    """A pool of spawned processes, at most 4 queued problems per worker (an interrupt loses little).

    A worker that dies (killed for memory, a crash in native code) breaks the pool: the problems that were in
    flight are then run one by one in a fresh one-worker pool, so the one that kills its worker is recorded as
    an error and the others are solved normally.
    """
    fn = fn or solve_one
    if workers == 1:
        for key, label, problem in todo:
            on_row(fn(key, label, problem, source, solver))
        return
    queue = deque(todo)
    while queue:
        suspects = _run_pool(queue, source, solver, workers, on_row, fn)
        for t in suspects:
            on_row(_isolated(t, source, solver, fn))


def _new_pool(workers: int) -> ProcessPoolExecutor:
    import multiprocessing

    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
        initargs=(os.getpid(),),
    )


def _run_pool(
    queue: deque[Job], source: str, solver: dict[str, Any], workers: int, on_row: OnRow, fn: SolveFn
) -> list[Job]:
    """Run the queue on one pool until it is empty or the pool breaks; returns the problems then in flight."""
    pool = _new_pool(workers)
    pending: dict[Future[dict[str, Any]], Job] = {}
    _INTERRUPT.pool_running = True
    try:
        while queue or pending:
            _INTERRUPT.check()
            while queue and len(pending) < 4 * workers:
                t = queue.popleft()
                try:
                    pending[pool.submit(fn, t[0], t[1], t[2], source, solver)] = t
                except BrokenProcessPool:
                    queue.appendleft(t)
                    return list(pending.values())
            done, _ = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                exc = fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    broken = True  # stays pending: it is rerun alone
                    continue
                job = pending.pop(fut)
                on_row(fut.result() if exc is None else error_row(job, type(exc).__name__, _one_line(exc)))
            if broken:
                return list(pending.values())
        return []
    finally:
        _INTERRUPT.pool_running = False
        _stop(pool)


def _isolated(t: Job, source: str, solver: dict[str, Any], fn: SolveFn) -> dict[str, Any]:
    """One problem alone in a one-worker pool: if the worker dies, the row records that."""
    pool = _new_pool(1)
    _INTERRUPT.pool_running = True
    try:
        fut = pool.submit(fn, t[0], t[1], t[2], source, solver)
        while True:
            try:
                return fut.result(timeout=POLL_S)
            except TimeoutError:
                _INTERRUPT.check()
    except BrokenProcessPool:
        return error_row(t, "WorkerDied", "the worker process died while solving this problem")
    finally:
        _INTERRUPT.pool_running = False
        _stop(pool)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down now: cancel queued work and terminate the worker processes this pool started."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=5)


def run_ray(
    todo: list[Job],
    source: str,
    solver: dict[str, Any],
    workers: int | None,
    address: str | None,
    on_row: OnRow,
    fn: SolveFn | None = None,
) -> None:
    """The same problems as Ray tasks on an existing cluster (``address``; a running ray.init is reused); ``fn``
    as in ``run_local`` (default: solve one sweep problem)."""
    try:
        import ray
    except ImportError:
        raise ProblemError(
            "the ray backend needs ray: pip install 'madmax-opt[ray]'", field="--backend"
        ) from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        window = 4 * (workers or max(int(ray.cluster_resources().get("CPU", 1)), 1))
        remote = ray.remote(num_cpus=1, max_retries=1)(fn or solve_one)
        queue = list(reversed(todo))
        pending: dict[Any, Job] = {}
        try:
            while queue or pending:
                while queue and len(pending) < window:
                    t = queue.pop()
                    pending[remote.remote(t[0], t[1], t[2], source, solver)] = t
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    t = pending.pop(ref)
                    try:
                        on_row(ray.get(ref))
                    except ray.exceptions.RayError as exc:
                        on_row(error_row(t, type(exc).__name__, _one_line(exc)[:500]))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()


class _Rate(ProgressColumn):
    def render(self, task: ProgressTask) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.1f}/s" if speed else "-/s", style="progress.data.speed")


@dataclass
class Counts:
    ok: int = 0
    infeasible: int = 0
    error: int = 0

    def add(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    def text(self) -> str:
        return f"ok {self.ok}  infeasible {self.infeasible}  error {self.error}"


@dataclass
class SweepRun:
    """What one invocation did (also stored in the manifest for the report)."""

    total: int
    skipped: int
    solved: int = 0
    counts: Counts = field(default_factory=Counts)
    wall_s: float = 0.0
    interrupted: str | None = None  # "SIGINT" or "SIGTERM"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so that the sweep stops the same way as on Ctrl-C."""


@dataclass
class _Interrupt:
    """SIGINT / SIGTERM while a process pool runs: the handler only records it, and the pool loop raises it between
    two waits. Raised inside the handler, it could land while the main thread holds a future's lock (inside
    concurrent.futures.wait), and the pool's shutdown then waited on that lock forever (seen: a sweep that printed
    'interrupted (SIGTERM)' and never exited)."""

    pool_running: bool = False
    caught: KeyboardInterrupt | None = None

    def check(self) -> None:
        """Raise the recorded interrupt, if any (a safe point: no lock held)."""
        exc, self.caught = self.caught, None
        if exc is not None:
            raise exc


_INTERRUPT = _Interrupt()
POLL_S = 0.1  # the pool loop's longest wait between two looks at a recorded interrupt


def _on_signal(signum: int, frame: Any) -> None:
    exc = _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    if _INTERRUPT.pool_running:
        _INTERRUPT.caught = exc
        return
    raise exc


def run_sweep(
    sweep: Sweep,
    outdir: Path,
    *,
    workers: int | None = None,
    backend: Literal["local", "ray"] = "local",
    address: str | None = None,
    restart: bool = False,
    retry_errors: bool = False,
    command: str | None = None,
    console: Console | None = None,
) -> SweepRun:
    """Solve every combination not yet in ``outdir/results.jsonl``; safe to interrupt and rerun."""
    console = console or Console(stderr=True)
    outdir.mkdir(parents=True, exist_ok=True)
    lock = os.open(
        outdir, os.O_RDONLY
    )  # an exclusive lock on the directory itself: one sweep writes at a time
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise ProblemError(
            "another sweep is writing to this directory", file=str(outdir), field="--out"
        ) from None
    try:
        return _run_locked(sweep, outdir, workers, backend, address, restart, retry_errors, command, console)
    finally:
        os.close(lock)


def _run_locked(
    sweep: Sweep,
    outdir: Path,
    workers: int | None,
    backend: str,
    address: str | None,
    restart: bool,
    retry_errors: bool,
    command: str | None,
    console: Console,
) -> SweepRun:
    results = outdir / RESULTS_FILE
    if restart and results.exists():
        results.unlink()
    rows = read_rows(results, repair=True)
    if retry_errors and any(r["status"] == "error" for r in rows.values()):
        rows = {k: r for k, r in rows.items() if r["status"] != "error"}
        rewrite_rows(results, rows.values())
    wanted = {c.key for c in sweep.combinations}
    todo = [(c.key, c.label, c.problem) for c in sweep.combinations if c.key not in rows]
    run = SweepRun(total=len(sweep.combinations), skipped=len(wanted & rows.keys()))
    n_workers = workers or os.cpu_count() or 1
    manifest: dict[str, Any] = {
        "sweep_file": sweep.path,
        "title": sweep.spec.title,
        "description": sweep.spec.description,
        "command": command,
        "objectives": list(sweep.spec.objectives),
        "keys": [c.key for c in sweep.combinations],
        "run": None,
    }
    write_json(outdir / MANIFEST_FILE, manifest)
    solver = sweep.spec.solver.model_dump(mode="json")
    log = ResultsLog(results)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main_thread \
        else {}
    progress = Progress(
        TextColumn("[bold]sweep[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        _Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )
    t0 = time.perf_counter()

    def on_row(row: dict[str, Any]) -> None:
        log.append(row)
        rows[row["key"]] = row
        run.solved += 1
        run.counts.add(row["status"])
        progress.update(bar, advance=1, counts=run.counts.text())

    try:
        with progress:
            bar = progress.add_task("sweep", total=run.total, completed=run.skipped, counts=run.counts.text())
            if backend == "ray":
                run_ray(todo, sweep.path, solver, workers, address, on_row)
            else:
                run_local(todo, sweep.path, solver, min(n_workers, max(len(todo), 1)), on_row)
    except KeyboardInterrupt as exc:
        run.interrupted = "SIGTERM" if isinstance(exc, _Terminated) else "SIGINT"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _INTERRUPT.caught = None  # one that came after the pool stopped
        log.close()
        run.wall_s = time.perf_counter() - t0
        ordered = [rows[k] for k in manifest["keys"] if k in rows]
        write_table(outdir / TABLE_FILE, ordered)
        manifest["run"] = {
            "backend": backend,
            "workers": n_workers,
            "cpu_count": os.cpu_count(),
            "total": run.total,
            "skipped": run.skipped,
            "solved": run.solved,
            "wall_s": run.wall_s,
            "interrupted": run.interrupted,
            "counts": vars(run.counts),
            "python": sys.version.split()[0],
            "validate_s": sweep.validate_s,
            "load_avg_1m_at_end": os.getloadavg()[0],
        }
        write_json(outdir / MANIFEST_FILE, manifest)
    return run
