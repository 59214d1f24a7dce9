"""``madmax-opt fleet FLEET.yaml``: many jobs on a heterogeneous fleet, each job's hardware and plan chosen
together by CP-SAT (beside a greedy baseline)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from madmax_opt.cli.app import app, console
from madmax_opt.cli.core import SolverParamsOpt
from madmax_opt.core.errors import ProblemError

if TYPE_CHECKING:
    from madmax_opt.fleet.options import SearchJob, SearchRunner


@app.command("fleet")
def fleet_cmd(
    fleet: Annotated[Path | None, typer.Argument(help="fleet file (YAML)", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    schema: Annotated[bool, typer.Option("--schema", help="print the JSON Schema of fleet files")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write STEM.md, .json, -rows.csv, -gantt.png here")]
    = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="write the Gantt-style PNG of finish times here")] = None,
    csv_out: Annotated[Path | None, typer.Option("--csv", help="write one sweep-compatible row per job here")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=0.01, help="CP-SAT time limit, s "
                                                     "(default: the file's solver.time_limit_s)")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, max=64, help="CP-SAT workers (1 = "
                                                "deterministic)")] = None,
    solver_params: SolverParamsOpt = None,
    search_workers: Annotated[int, typer.Option("--search-workers", min=1, max=256, help="processes (or Ray "
                                                "tasks in flight / 4) for the per-option plan searches")] = 1,
    backend: Annotated[str, typer.Option("--backend", help="where the plan searches run: local (a process pool "
                                         "of --search-workers) or ray (tasks on a Ray cluster), as in sweep")]
    = "local",
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (--backend ray; default: "
                                                "a running ray.init or a local Ray)")] = None,
    cache: Annotated[Path | None, typer.Option("--cache", help="option cache directory (default: "
                                               "~/.cache/madmax-opt/fleet)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="search every option again, store nothing")] = False,
    what_if: Annotated[bool, typer.Option("--what-if/--no-what-if", help="re-solve with extra GPUs per system")]
    = True,
) -> None:
    """Allocate a fleet: per job, one (system, GPU count, plan) or none; CP-SAT optimum vs greedy baseline."""
    from rich.console import Console

    from madmax_opt.fleet.options import default_cache_dir, option_tables
    from madmax_opt.fleet.solve import FleetRun, solve_fleet
    from madmax_opt.fleet.spec import fleet_schema, load_fleet
    from madmax_opt.report import fleet_report
    from madmax_opt.search.cpsat import CpSatOptions

    if schema:
        print(json.dumps(fleet_schema(), indent=2))
        return
    if fleet is None:
        raise ProblemError("missing; allowed: a fleet file (YAML), or --schema", field="FLEET")
    loaded = load_fleet(fleet)
    settings = loaded.spec.solver
    opts = CpSatOptions(time_limit_s=time_limit or settings.time_limit_s, workers=workers or settings.workers,
                        params=solver_params)
    cache_dir = None if no_cache else (cache or default_cache_dir())
    t0 = time.perf_counter()
    from madmax_opt.report.progress import progress_bar

    err = Console(stderr=True)
    runner = search_runner(backend, search_workers, address)
    with progress_bar("fleet: plan searches (job on size x system)", None) as bar:  # cached ones are not counted
        tables = option_tables(loaded, cache_dir, progress=bar.step, runner=runner)
    run = FleetRun(loaded, tables, opts, option_wall_s=time.perf_counter() - t0)
    with progress_bar("fleet: allocating (CP-SAT)" + (" and what-if re-solves" if what_if else ""), None,
                      count=False):
        result = solve_fleet(run, what_if=what_if)
    if out is not None:
        command = "madmax-opt fleet " + shlex.join([str(fleet), "--out", str(out)])
        path = fleet_report.write_report(result, out, str(fleet), command, loaded.spec.horizon_h)
        err.print(f"wrote {path}", soft_wrap=True)
    if plot is not None:
        fleet_report.gantt_png(result, plot, loaded.spec.horizon_h)
        err.print(f"wrote {plot}", soft_wrap=True)
    if csv_out is not None:
        fleet_report.write_csv(result, csv_out)
        err.print(f"wrote {csv_out}", soft_wrap=True)
    if out is not None or plot is not None or csv_out is not None:
        err.print(f"fleet: {fleet_report.headline(result)}", soft_wrap=True)
    if json_out:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    elif out is None:
        fleet_report.print_fleet(result, console())


def search_runner(backend: str, workers: int, address: str | None) -> SearchRunner:
    """The fleet's option searches through a sweep backend (studies.sweep): a local process pool or Ray tasks."""
    from madmax_opt.fleet.options import search_row
    from madmax_opt.studies.sweep import run_local, run_ray

    if backend not in ("local", "ray"):
        raise ProblemError(f"{backend!r}; allowed: local, ray", field="--backend")
    if backend == "local" and address is not None:
        raise ProblemError("--address needs --backend ray; allowed: leave it out", field="--address")

    def run(todo: list[SearchJob], on_row: Callable[[dict[str, Any]], None]) -> None:
        if backend == "ray":
            run_ray(todo, "fleet", {}, workers if workers > 1 else None, address, on_row, fn=search_row)
        else:
            run_local(todo, "fleet", {}, min(workers, len(todo)), on_row, fn=search_row)

    return run


@app.command("bench-fleet")
def bench_fleet_cmd(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=20, help="random fleets per objective")] = 3,
) -> None:
    """Benchmark the fleet allocation: 50 jobs on 10 systems (synthetic option tables), results/bench/fleet.md."""
    from madmax_opt.fleet.bench import write_fleet_bench

    console().print(f"wrote {write_fleet_bench(out, seeds, lambda n: search_runner('local', n, None))}")
