"""Validation, paper studies and benchmarks: validate, paper, bench-*, trace-check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import app


@app.command("bench-evaluator")
def bench_evaluator_command(
    problem: Annotated[Path, typer.Argument(help="problem file (YAML) to sample plans from")] = Path("problems/llama2-70b-h100.yaml"),
    plans: Annotated[int, typer.Option("--plans", min=1, help="plans in the vectorised batch")] = 1_000_000,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="timed repeats of the batch")] = 5,
    calls: Annotated[int, typer.Option("--calls", min=1, help="timed scalar calls")] = 2000,
    workers: Annotated[int, typer.Option("--workers", min=1, help="also time the batch on this many threads")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="plan sampling seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="Markdown report to write")] = Path("results/bench/evaluator.md"),
) -> None:
    """Benchmark the evaluator: 10^6 plans vectorised and one scalar call; writes results/bench/evaluator.md."""
    from madmax_opt.studies.bench import bench_evaluator_cmd

    bench_evaluator_cmd(problem=problem, plans=plans, repeats=repeats, calls=calls, workers=workers, seed=seed, out=out)


@app.command("bench-sensitivity")
def bench_sensitivity_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
) -> None:
    """Time a 10-parameter x 4-factor sensitivity study of a 70B pre-training problem (results/bench)."""
    from madmax_opt.studies.codesign import bench_sensitivity_cmd

    bench_sensitivity_cmd(out=out)


@app.command("validate-inference")
def validate_inference_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/validation"),
) -> None:
    """Inference model vs the measured serving runs in data/validation; writes results/validation/inference.md."""
    from madmax_opt.report.serving_validation import validate_inference_cmd

    validate_inference_cmd(out=out)


@app.command("trace-check")
def trace_check_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/validation"),
) -> None:
    """Simulated vs closed-form step time on the validation cases and random plans (trace_vs_closed_form.md)."""
    from madmax_opt.report.timeline import trace_check_cmd

    trace_check_cmd(out=out)


@app.command("bench-trace")
def bench_trace_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
) -> None:
    """Benchmark the trace simulator on a 405B plan with 16 stages and 64 micro-batches (results/bench/trace.md)."""
    from madmax_opt.report.timeline import bench_trace_cmd

    bench_trace_cmd(out=out)


@app.command("bench-startup")
def bench_startup_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
) -> None:
    """Wall time of whole commands from a fresh process: --help, schema, catalog, solve (results/bench/startup.md)."""
    from madmax_opt.studies.bench_startup import write_startup_bench

    print(f"wrote {write_startup_bench(out)}")


BENCHES = ("solver", "evaluator", "sensitivity", "trace", "startup", "fleet")  # results/bench, in this order


@app.command("bench-all")
def bench_all_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
    only: Annotated[list[str] | None, typer.Option("--only", metavar="NAME", help="run only these benchmarks "
                                                   f"(repeatable): {', '.join(BENCHES)}")] = None,
) -> None:
    """Regenerate results/bench in one command: bench-solver, bench-evaluator, bench-sensitivity, bench-trace,
    bench-startup and bench-fleet in turn, each with its defaults (tens of minutes on 2 cores)."""
    from madmax_opt.core.errors import ProblemError

    chosen = list(only or BENCHES)
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        raise ProblemError(f"got {', '.join(unknown)}; allowed: {', '.join(BENCHES)}", field="--only")
    for name in BENCHES:
        if name not in chosen:
            continue
        print(f"bench-{name} ...", flush=True)
        if name == "solver":
            from madmax_opt.cli.core import bench_solver_cmd

            bench_solver_cmd(out=out)
        elif name == "evaluator":
            bench_evaluator_command(out=out / "evaluator.md")
        elif name == "sensitivity":
            bench_sensitivity_command(out=out)
        elif name == "trace":
            bench_trace_command(out=out)
        elif name == "startup":
            bench_startup_command(out=out)
        else:  # the bench-fleet command itself: its runner measures the 2-process row in 2 processes
            from madmax_opt.cli.fleet import bench_fleet_cmd

            bench_fleet_cmd(out=out)


@app.command("validate-online")
def validate_online_command(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/validation"),
) -> None:
    """Online-serving percentiles (queueing model) against the seeded simulation (online_serving.md)."""
    from madmax_opt.studies.online_validation import write_online_validation

    print(f"wrote {write_online_validation(out)}")
