"""madmax-opt sweep and report: batch optimisation over hardware catalogs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import app


@app.command("sweep")
def sweep_command(
    sweep_file: Annotated[Path, typer.Argument(help="sweep file (YAML)", show_default=False)],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="output directory [default: sweeps/NAME]")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="parallel problems [default: cores]")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="local (process pool) | ray")] = "local",
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (ray backend)")
    ] = None,
    restart: Annotated[bool, typer.Option("--restart", help="discard earlier results in OUTDIR")] = False,
    retry_errors: Annotated[
        bool, typer.Option("--retry-errors", help="solve failed (not infeasible) problems again")
    ] = False,
    report: Annotated[
        Path | None, typer.Option("--report", help="then write the Markdown report (and plots) here")
    ] = None,
) -> None:
    """Solve every model x task x system x size x objective of a sweep file; resumable, streamed to OUTDIR."""
    from madmax_opt.report.sweep_commands import sweep_cmd

    sweep_cmd(sweep_file=sweep_file, out=out, workers=workers, backend=backend, address=address, restart=restart, retry_errors=retry_errors, report=report)


@app.command("report")
def report_command(
    outdir: Annotated[Path, typer.Argument(help="output directory of madmax-opt sweep", show_default=False)],
    md: Annotated[Path | None, typer.Option("--md", help="Markdown file [default: OUTDIR/report.md]")] = None,
) -> None:
    """Pareto fronts, best plans per objective and per system, speedups, PNG plots of a sweep's results."""
    from madmax_opt.report.sweep_commands import report_cmd

    report_cmd(outdir=outdir, md=md)
