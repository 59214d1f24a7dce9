"""madmax-opt timeline: one simulated step as a Chrome trace and a Gantt chart."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import app


@app.command("timeline")
def timeline_command(
    problem: Annotated[Path, typer.Argument(help="problem file (YAML)", show_default=False)],
    plan: Annotated[Path, typer.Option("--plan", help="YAML/JSON file with the plan (or a list of plans)")],
    index: Annotated[int, typer.Option("--index", help="which plan of a list")] = 0,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("timelines"),
    detail: Annotated[str, typer.Option("--detail", help="ops (every op) | layers (one event per layer pass)")]
    = "ops",
    json_out: Annotated[bool, typer.Option("--json", help="print the JSON summary instead of a table")] = False,
) -> None:
    """Simulate one training step of a plan op by op; write a Chrome trace (Perfetto) and a Gantt PNG."""
    from madmax_opt.report.families import family_of
    from madmax_opt.report.timeline import timeline_cmd

    family_of(problem).require("timeline", problem)
    timeline_cmd(problem=problem, plan=plan, index=index, out=out, detail=detail, json_out=json_out)
