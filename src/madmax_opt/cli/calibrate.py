"""madmax-opt calibrate: fit a (GPU, framework) calibration to measured runs, write an overlay for problem files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import JsonOpt, app, console


def _same_file(out: Path, runs: Path) -> bool:
    """--out names the runs file (the same path after links, or the same inode); a link loop is not the same."""
    if os.path.realpath(out) == os.path.realpath(runs):
        return True
    try:
        return out.exists() and runs.exists() and out.samefile(runs)
    except (OSError, RuntimeError):  # a loop or an unreadable path: the read of RUNS says what is wrong
        return False


def _pct(x: float) -> str:
    return "-" if x != x else f"{100.0 * x:+.1f} %"  # NaN: not available


@app.command("calibrate")
def calibrate_command(
    runs: Annotated[Path, typer.Argument(help="measured runs (modern or minimal schema, and/or serving_runs; YAML)", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="overlay file to write")] = Path("cluster.yaml"),
    params: Annotated[
        str | None, typer.Option("--params", help="comma-separated parameters to fit [default: all the runs determine]")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Fit the calibration of each (GPU, framework) in RUNS; print before / after / leave-one-out errors per run."""
    from rich.table import Table

    from madmax_opt.core.errors import ProblemError
    from madmax_opt.studies.calibrate import calibrate, calibrate_serving_file, overlay_yaml

    if _same_file(out, runs):
        raise ProblemError(f"{out} is the runs file; allowed: another file (the overlay would overwrite the "
                           "measurements)", field="--out")
    names = [p.strip() for p in params.split(",") if p.strip()] if params else None
    results = calibrate(runs, names)
    serving = calibrate_serving_file(runs)
    if names and not results:
        raise ProblemError("names training parameters, the runs file has no training run; allowed: --params with "
                           "runs (serving runs fit every serving parameter by their rule)", field="--params")
    try:
        out.write_text(overlay_yaml(results, runs, serving))
    except OSError as exc:  # /proc/version: EIO without a file name; a directory; no permission
        raise ProblemError(f"cannot write the overlay: {exc.strerror or exc}; allowed: a writable file path",
                           file=str(out), field="--out") from None
    if json_out:
        print(json.dumps({"overlay": str(out), "calibrations": [
            {**r.entry().model_dump(mode="json", exclude_none=True), "left_at_prior": r.fit.left_out,
             "notes": list(r.notes),
             "runs": [{"name": run.name, "measured_s": run.measured_s, "before_err": float(b), "after_err": float(a),
                       "loo_err": None if lo != lo else float(lo)}
                      for run, b, a, lo in zip(r.runs, r.before_err, r.fit.error, r.loo_err, strict=True)]}
            for r in results], "serving": [
            {**r.entry().model_dump(mode="json", exclude_none=True),
             "metrics": [{"metric": k, "before_err": r.before_err[k], "after_err": v, "loo_err": r.loo_err.get(k)}
                         for k, v in r.after_err.items()]}
            for r in serving]}, indent=2))
        return
    con = console()
    for sr in serving:
        gpu, framework = sr.key
        t = Table(title=f"serving {gpu} / {framework}: {len(sr.runs)} run(s), fitted around the pair's calibration "
                  f"({sr.prior_level})", header_style="bold")
        for c in ("run:metric", "before", "after", "leave-one-out"):
            t.add_column(c)
        for k, v in sr.after_err.items():
            t.add_row(k, _pct(sr.before_err[k]), _pct(v), _pct(sr.loo_err.get(k, float("nan"))))
        con.print(t)
        con.print("fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in sr.params.model_dump().items()))
    for r in results:
        gpu, framework = r.key
        t = Table(title=f"{gpu} / {framework}: {len(r.runs)} run(s)", header_style="bold")
        for c in ("run", "measured s", "before", "after", "leave-one-out"):
            t.add_column(c)
        for run, b, a, lo in zip(r.runs, r.before_err, r.fit.error, r.loo_err, strict=True):
            t.add_row(run.name, f"{run.measured_s:.3f}", _pct(float(b)), _pct(float(a)), _pct(float(lo)))
        con.print(t)
        fitted = ", ".join(f"{k} {v:g}" for k, v in r.fit.params.items()) or "nothing"
        con.print(f"fitted: {fitted}")
        for name, why in r.fit.left_out.items():
            con.print(f"not fitted (kept as before): {name}: {why}")
        for note in r.notes:
            con.print(f"note: {note}", markup=False)
    con.print(f"wrote {out}")
