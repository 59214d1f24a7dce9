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
    index: Annotated[int | None, typer.Option("--index", help="which plan of a list, from 0 [default: 0, said on "
                                              "stderr when the file holds several]")] = None,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("timelines"),
    detail: Annotated[str, typer.Option("--detail", help="ops (every op) | layers (one event per layer pass)")]
    = "ops",
    json_out: Annotated[bool, typer.Option("--json", help="print the JSON summary instead of a table")] = False,
) -> None:
    """Simulate one training step of a plan op by op; write a Chrome trace (Perfetto) and a Gantt PNG."""
    from madmax_opt.report.families import family_of
    from madmax_opt.report.timeline import timeline_cmd

    family_of(problem).require("timeline", problem)
    if index is None:
        index = 0
        _say_which(plan)
    timeline_cmd(problem=problem, plan=plan, index=index, out=out, detail=detail, json_out=json_out)


def _say_which(plan: Path) -> None:
    """A plan file with several plans and no --index: say on stderr that the first is simulated, and how to pick."""
    import sys

    from madmax_opt.io.yaml_files import read_yaml

    data = read_yaml(plan, what="plan file")
    if isinstance(data, list) and len(data) > 1:
        print(f"timeline: {plan} holds {len(data)} plans; simulating plan 0 (the first); --index K "
              f"(0 to {len(data) - 1}) picks another", file=sys.stderr)
