"""madmax-opt sensitivity: what-if hardware with re-optimised plans."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import app


@app.command("sensitivity")
def sensitivity_command(
    problem: Annotated[Path, typer.Argument(help="problem file (YAML)", show_default=False)],
    params: Annotated[
        str | None,
        typer.Option("--params", help="comma-separated parameters [default: every hardware parameter; a wrong "
                     "name lists them all]"),
    ] = None,
    factors: Annotated[str, typer.Option("--factors", help="comma-separated factors")] = "0.5,2,4",
    out: Annotated[Path, typer.Option("--out", help="output directory for STEM.md/.json/.png (default: "
                                      "./sensitivity in the current directory)")] = Path("sensitivity"),
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.01, help="CP-SAT time limit per solve, s")] = 60.0,
    workers: Annotated[int, typer.Option("--workers", min=1, help="CP-SAT workers (1 = deterministic)")] = 1,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="variants solved in parallel processes")] = 1,
) -> None:
    """Re-optimise the plan for each hardware parameter x factor: throughput, cost, plan change, tornado chart."""
    from madmax_opt.report.sensitivity_report import sensitivity_cmd

    sensitivity_cmd(problem=problem, params=params, factors=factors, out=out, json_out=json_out,
                    time_limit=time_limit, workers=workers, jobs=jobs)
