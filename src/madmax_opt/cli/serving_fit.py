"""Serving calibration command: fit-serving."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import app, console


@app.command("fit-serving")
def fit_serving_command(
    out: Annotated[
        Path | None, typer.Option("--out", help="catalog file to write (default: the package's serving calibration)")
    ] = None,
) -> None:
    """Refit the serving calibration per (GPU, framework) on the measured serving runs (with leave-one-source-out
    errors) and write data/serving_calibration.yaml."""
    from madmax_opt.studies.serving_fit import default_catalog_path, evaluate_all, write_catalog
    from madmax_opt.studies.serving_intervals import interval_table

    ev = evaluate_all()
    path = write_catalog(out or default_catalog_path(), ev, interval_table(ev))
    console().print(
        f"wrote {path}: {len(ev.cases)} runs, in-sample median |error| {ev.median(ev.in_sample):.1%}, "
        f"leave-one-source-out median {ev.median(ev.loso):.1%}"
    )
