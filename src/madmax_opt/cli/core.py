"""The core commands: solve, evaluate, verify, schema, catalog, validate, paper, bench-solver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from madmax_opt.cli.app import JsonOpt, ProblemArg, app, console
from madmax_opt.cli.emit import FORMAT_HELP, check_emit, emit_best, script_of
from madmax_opt.io.limits import MAX_TOP_K

# CP-SAT options of solve and verify (checked by search.cpsat.CpSatOptions: one line, exit 2)
TimeLimitOpt = Annotated[float, typer.Option("--time-limit", min=0.01, help="CP-SAT time limit, s")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="CP-SAT workers, 1 to 64 (1 = deterministic)")]
SolverParamsOpt = Annotated[str | None, typer.Option(
    "--solver-params", help="CP-SAT parameters in text format, applied last, e.g. 'log_search_progress: true'")]
ExportModelOpt = Annotated[Path | None, typer.Option(
    "--export-model", help="write each CP-SAT model as a text proto to FILE (later ones to FILE-2, FILE-3, ...)")]


@app.command()
def solve(
    problem: ProblemArg,
    json_out: JsonOpt = False,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=MAX_TOP_K, help="return the K best distinct plans")] = 1,
    time_limit: TimeLimitOpt = 60.0,
    workers: WorkersOpt = 1,
    solver_params: SolverParamsOpt = None,
    export_model: ExportModelOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="write PNG plots (step time, memory, top-k) here")]
    = None,
    rerank: Annotated[bool, typer.Option("--rerank", help="re-rank the top-k by simulated step time (trace)")]
    = False,
    robust: Annotated[bool, typer.Option("--robust", help="training: pick the plan with the best worst case within "
                                         "the 80 % error bars (among the top-k and each system's best)")] = False,
    emit: Annotated[str | None, typer.Option("--emit", help=f"also emit the best plan as FORMAT: {FORMAT_HELP}")]
    = None,
    out: Annotated[Path | None, typer.Option("--out", help="with --emit: write its files and launch.sh here")] = None,
    benchmark: Annotated[int | None, typer.Option("--benchmark", metavar="N", help="with --emit and --out: each "
                         "returned plan FORMAT can run, as a short measured run (N iterations / a serving client) "
                         "in OUT/plan-i, with measure.sh, runs.yaml for calibrate and the problem naming its "
                         "overlay")] = None,
) -> None:
    """Search the plan space (and hardware options) for the optimal plan; cross-checked by the evaluator."""
    from madmax_opt.report.families import SolveOptions, family_of

    check_emit(problem, emit)  # an unknown or wrong-kind format fails before the search
    if benchmark is not None:  # the loaded problem is read again by the measured runs below
        from madmax_opt.io.problem import load_problem
        from madmax_opt.launch.benchmark import check_benchmark_options

        loaded = load_problem(problem)
        check_benchmark_options(benchmark, emit, out, loaded.task, problem)
    family = family_of(problem)
    result = family.solve(problem, SolveOptions(top_k, time_limit, workers, solver_params, export_model,
                                                robust=robust))
    if rerank or plot is not None:  # step timelines (trace simulation, plots)
        from madmax_opt.io.problem import load_problem
        from madmax_opt.report.timeline import rerank_and_plot

        family.require("timeline", problem)
        result = rerank_and_plot(load_problem(problem), result, rerank, plot)
    if emit is not None:  # runnable configuration of the best plan (launch formats)
        result["emitted"] = emit_best(problem, result, emit, out)
    if benchmark is not None and emit is not None and out is not None:  # measured runs of the returned plans
        from madmax_opt.cli.emit import report_written
        from madmax_opt.io.yaml_files import read_yaml
        from madmax_opt.launch.benchmark import benchmark_plans

        records = result.get("top") or [result["best"]]
        raw = read_yaml(problem, what="problem file")
        report_written(benchmark_plans(problem, raw, loaded, records, emit, out, benchmark))
    if json_out:
        print(json.dumps(result, indent=2))
    else:
        family.show(result, console())
        if emit is not None:
            print(script_of(result["emitted"]), end="")


@app.command("evaluate")
def evaluate_cmd(
    problem: ProblemArg,
    plan: Annotated[Path, typer.Option("--plan", help="YAML/JSON file: one plan or a list of plans")],
    json_out: JsonOpt = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="write PNG plots (step time, memory) here")] = None,
    ops: Annotated[bool, typer.Option("--ops", help="training: where one layer's time goes, op by op")] = False,
) -> None:
    """Predict step time, throughput, MFU and memory per GPU of given plan(s)."""
    from madmax_opt.report.families import family_of

    family = family_of(problem)
    if ops:
        from madmax_opt.report.ops_report import evaluate_ops_command

        family.require("ops", problem)
        return evaluate_ops_command(problem, plan, json_out, plot, console())
    family.evaluate(problem, plan, json_out, plot, console())


@app.command()
def verify(
    problem: ProblemArg,
    json_out: JsonOpt = False,
    time_limit: TimeLimitOpt = 60.0,
    workers: WorkersOpt = 1,
    solver_params: SolverParamsOpt = None,
    export_model: ExportModelOpt = None,
) -> None:
    """Brute-force the same space with the evaluator; exit 1 if the solver's optimum is worse."""
    from madmax_opt.report.families import SolveOptions, family_of

    family = family_of(problem)
    family.require("verify", problem)
    assert family.verify is not None
    report = family.verify(problem, SolveOptions(1, time_limit, workers, solver_params, export_model))
    if json_out:
        print(json.dumps(report, indent=2))
    else:
        from madmax_opt.report.report import verify_table

        console().print(verify_table(report))
        console().print(f"agree: {report['agree']}")  # the verdict as one plain line, for scripts and logs
    if not report["agree"]:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON Schema of problem files (point your editor at it)."""
    from madmax_opt.io.problem_file import ProblemFile

    print(json.dumps(ProblemFile.model_json_schema(), indent=2))


@app.command("catalog")
def catalog_cmd(
    kind: Annotated[str, typer.Argument(help="gpus, systems or models")] = "systems",
    json_out: JsonOpt = False,
) -> None:
    """List the built-in GPUs, systems or models with their key numbers and sources."""
    from madmax_opt.report.catalog_report import print_catalog

    print_catalog(kind, json_out, console())


@app.command("validate")
def validate_cmd(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/validation"),
    write_catalog: Annotated[bool, typer.Option(
        "--write-catalog", help="also write the modern fits into the package catalog (gpus.yaml frameworks blocks, "
        "training_families.yaml): for developers refitting after a data or model change")] = False,
) -> None:
    """Predicted vs measured on the validation data shipped with the package; writes Markdown tables."""
    import numpy as np

    from madmax_opt.report.progress import progress_bar
    from madmax_opt.studies import validation_modern
    from madmax_opt.studies.inferencex_report import write_inferencex_report
    from madmax_opt.studies.modern_report import write_modern_report
    from madmax_opt.studies.validation_report import write_training_report

    written = []
    with progress_bar("validate", 3) as bar:  # three stages, each several seconds to a minute
        bar.show("A100 training sets (Korthikanti 2022, vTrain)")
        written.append(write_training_report(out))
        bar.step("modern training fits, leave-one-source-out (H100 / B200 / GB200)")
        summary = validation_modern.summarize_modern()  # H100 / B200 / GB200: in-sample and leave-one-source-out
        written.append(write_modern_report(out, summary))
        bar.step("InferenceX serving: in-sample, leave-one-source-out, leave-one-GPU-out")
        written.append(write_inferencex_report(out))
        bar.step()
    for path in written:
        console().print(f"wrote {path}", soft_wrap=True)
    loso = abs(summary.loso_s / summary.measured_s - 1.0)
    console().print(f"validate: {len(written)} reports in {out}; modern training: {len(summary.cases)} runs, "
                    f"leave-one-source-out median |error| {float(np.nanmedian(loso)):.1%} "
                    f"({int(np.isfinite(loso).sum())} runs with a fit)", soft_wrap=True)
    from madmax_opt.studies.intervals import coverage_summary, write_intervals

    for line in coverage_summary(summary):  # the interval every training record carries, checked held-out
        console().print(line, soft_wrap=True)
    from madmax_opt.studies import serving_fit, serving_intervals

    for line in serving_intervals.coverage_summary(serving_fit.evaluate_all()):  # cached: the report's fit
        console().print(line, soft_wrap=True)
    for path in [*validation_modern.write_catalog(summary), write_intervals(summary)] if write_catalog else []:
        console().print(f"wrote {path}")


@app.command()
def paper(
    study: Annotated[str, typer.Argument(help="pretraining, inference, codesign or dlrm")] = "pretraining",
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/paper"),
) -> None:
    """Regenerate a paper study (results/paper/STUDY.md): pretraining, inference, codesign or dlrm."""
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.report import dlrm_report, serving_reports
    from madmax_opt.studies import codesign, studies

    writers = {
        "pretraining": studies.write_pretraining_study,
        "inference": serving_reports.write_inference_study,
        "codesign": codesign.write_codesign_study,
        "dlrm": dlrm_report.write_dlrm_study,
    }
    if study not in writers:
        raise ProblemError(f"unknown study {study!r}; allowed: {', '.join(writers)}", field="STUDY")
    console().print(f"wrote {writers[study](out)}")


@app.command("bench-solver")
def bench_solver_cmd(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
) -> None:
    """Benchmark the solver against brute force (results/bench/solver.md)."""
    from madmax_opt.studies.bench_solver import write_solver_bench

    console().print(f"wrote {write_solver_bench(out)}")
