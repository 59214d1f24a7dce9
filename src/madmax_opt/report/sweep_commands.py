"""A sweep's report (``write_report``: Markdown and plots) and the bodies of the sweep and report commands."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from madmax_opt.core.errors import ProblemError
from madmax_opt.report.sweep_plots import write_plots
from madmax_opt.report.sweep_report import load, markdown, point
from madmax_opt.studies.sweep import run_sweep
from madmax_opt.studies.sweep_spec import RESULTS_FILE, TABLE_FILE, load_sweep

# ------------------------------------------------------------------------------------------ entry points


def write_report(outdir: Path, md_path: Path | None = None) -> Path:
    """Write the Markdown summary (default OUTDIR/report.md) and its plots (next to it, in STEM-plots/)."""
    return _write_loaded(outdir, md_path, *load(outdir))


def _write_loaded(outdir: Path, md_path: Path | None, manifest: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """``write_report`` of a folder already read by ``load`` (the report command counts the same rows)."""
    md_path = md_path or outdir / "report.md"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    points = [point(r) for r in rows if r["status"] == "ok"]
    has_budget = all(r["combination"].get("train_tokens") for r in rows)
    plots = write_plots(points, md_path.parent / f"{md_path.stem}-plots", has_budget)
    md_path.write_text(markdown(outdir, md_path, manifest, rows, plots) + "\n")
    return md_path


def report_cmd(
    *,
    outdir: Path,
    md: Path | None,
) -> None:
    """Pareto fronts, best plans per objective and per system, speedups, PNG plots of a sweep's results."""
    manifest, rows = load(outdir)  # read once: the report and the status count below use the same rows
    print(f"wrote {_write_loaded(outdir, md, manifest, rows)}")
    status = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    print(f"report: {len(rows)} problems ({', '.join(f'{n} {s}' for s, n in status.items()) or 'none'})")


def sweep_cmd(
    *,
    sweep_file: Path,
    out: Path | None,
    workers: int | None,
    backend: str,
    address: str | None,
    restart: bool,
    retry_errors: bool,
    report: Path | None,
) -> None:
    """Solve every model x task x system x size x objective of a sweep file; resumable, streamed to OUTDIR."""
    if backend not in ("local", "ray"):
        raise ProblemError(f"unknown backend {backend!r}; allowed: local, ray", field="--backend")
    if address is not None and backend != "ray":
        raise ProblemError("--address needs --backend ray", field="--address")
    sweep = load_sweep(sweep_file)
    outdir = out or Path("sweeps") / sweep_file.stem
    console = Console(stderr=True)
    command = (
        "madmax-opt " + shlex.join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("madmax-opt") else None
    )
    console.print(f"{len(sweep.combinations)} problems from {sweep_file} -> {outdir}/{RESULTS_FILE}")
    run = run_sweep(
        sweep,
        outdir,
        workers=workers,
        backend="ray" if backend == "ray" else "local",
        address=address,
        restart=restart,
        retry_errors=retry_errors,
        command=command,
        console=console,
    )
    console.print(
        f"solved {run.solved} ({run.counts.text()}), skipped {run.skipped} already done, "
        f"{run.wall_s:.1f} s; table {outdir / TABLE_FILE}"
    )
    if run.interrupted:
        console.print(
            f"interrupted ({run.interrupted}): {run.total - run.skipped - run.solved} problems left; "
            "rerun the same command to resume"
        )
        raise typer.Exit(128 + int(getattr(signal, run.interrupted)))  # the shell convention: 128 + signal
    if report is not None:
        console.print(f"wrote {write_report(outdir, report)}")
