"""Serving commands: pareto."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import ProblemArg, app


@app.command("pareto")
def pareto_command(
    problem: ProblemArg,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="output path without suffix, .md and .png are written (default: "
                     "results/pareto/PROBLEM, PROBLEM the problem file's name without .yaml)"),
    ] = None,
) -> None:
    """Throughput-vs-latency Pareto front of an inference problem: a Markdown table and a PNG plot."""
    from madmax_opt.report.families import family_of
    from madmax_opt.report.serving_pareto import pareto_cmd

    family_of(problem).require("pareto", problem)
    pareto_cmd(problem=problem, out=out)
