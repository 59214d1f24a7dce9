"""Command line: ``madmax-opt solve | evaluate | verify | schema | catalog | validate``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.core.errors import MadmaxError, ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import ProblemFile, load_plans, load_problem, read_yaml
from madmax_opt.report import serving_reports, sweep_report, timeline
from madmax_opt.report.report import print_evaluations, print_solution, solve_result
from madmax_opt.studies import bench, codesign, sensitivity, sweep

app = typer.Typer(
    help="Throughput- or cost-optimal, memory-feasible plans for distributed training of large models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

ProblemArg = Annotated[Path, typer.Argument(help="problem file (YAML)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]


@app.command()
def solve(
    problem: ProblemArg,
    json_out: JsonOpt = False,
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="return the K best distinct plans")] = 1,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.01, help="CP-SAT time limit, s")] = 60.0,
    workers: Annotated[int, typer.Option("--workers", min=1, help="CP-SAT workers (1 = deterministic)")] = 1,
    plot: Annotated[Path | None, typer.Option("--plot", help="write PNG plots (step time, memory, top-k) here")]
    = None,
    rerank: Annotated[bool, typer.Option("--rerank", help="re-rank the top-k by simulated step time (trace)")]
    = False,
) -> None:
    """Search the plan space (and hardware options) for the optimal plan; cross-checked by the evaluator."""
    from madmax_opt.model import dlrm
    from madmax_opt.report import dlrm_report, timeline
    from madmax_opt.search import serving

    if dlrm.is_dlrm_file(problem):  # recommendation models have their own problem shape and search
        return dlrm_report.solve_command(problem, json_out, time_limit, workers, console)
    loaded = load_problem(problem)
    result = solve_result(loaded, top_k, time_limit, workers)
    if rerank or plot is not None:  # step timelines (trace simulation, plots)
        result = timeline.rerank_and_plot(loaded, result, rerank, plot)
    if json_out:
        print(json.dumps(result, indent=2))
    elif result.get("task") == "inference":
        serving.print_result(result, console)
    else:
        print_solution(result, console)


@app.command("evaluate")
def evaluate_cmd(
    problem: ProblemArg,
    plan: Annotated[Path, typer.Option("--plan", help="YAML/JSON file: one plan or a list of plans")],
    json_out: JsonOpt = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="write PNG plots (step time, memory) here")] = None,
) -> None:
    """Predict step time, throughput, MFU and memory per GPU of given plan(s)."""
    from madmax_opt.model import dlrm
    from madmax_opt.report import dlrm_report, plots, serving_reports

    if dlrm.is_dlrm_file(problem):
        return dlrm_report.evaluate_command(problem, plan, json_out, console)
    loaded = load_problem(problem)
    if loaded.task.kind == "inference":  # serving plans (+ precision, prefill_replicas)
        return serving_reports.evaluate_command(loaded, plan, json_out, console)
    records = evaluate(loaded, load_plans(plan, loaded))
    if plot is not None:
        plots.plan_figures(records, plot)
    if json_out:  # a file with one plan mapping gives one object, a list gives a list in the same order
        print(json.dumps(records if isinstance(read_yaml(plan), list) else records[0], indent=2))
    else:
        print_evaluations(records, console)


@app.command()
def verify(problem: ProblemArg, json_out: JsonOpt = False) -> None:
    """Brute-force the same space with the evaluator; exit 1 if the solver's optimum is worse."""
    from madmax_opt.search.verify import verify_problem

    report = verify_problem(load_problem(problem))
    if json_out:
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            console.print(f"{k}: {v}")
    if not report["agree"]:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON Schema of problem files (point your editor at it)."""
    print(json.dumps(ProblemFile.model_json_schema(), indent=2))


@app.command("catalog")
def catalog_cmd(
    kind: Annotated[str, typer.Argument(help="gpus | systems | models")] = "systems",
    json_out: JsonOpt = False,
) -> None:
    """List the built-in GPUs, systems or models with their key numbers and sources."""
    tables: dict[str, Callable[[], dict[str, Any]]] = {
        "gpus": catalog.gpus, "systems": catalog.systems, "models": catalog.models
    }
    if kind not in tables:
        raise ProblemError(f"unknown catalog {kind!r}; allowed: gpus, systems, models", field="KIND")
    entries = tables[kind]()
    if json_out:
        print(json.dumps({k: v.model_dump() for k, v in entries.items()}, indent=2))
        return
    t = Table(title=f"{kind} ({len(entries)})", header_style="bold")
    if kind == "gpus":
        for c in ("name", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "TDP W", "gemm_eff"):
            t.add_column(c)
        for g in catalog.gpus().values():
            t.add_row(g.name, f"{g.peak_flops.get('bf16', 0) / 1e12:,.0f}", f"{g.hbm_bytes / 1e9:.0f}",
                      f"{g.hbm_bw / 1e12:.2f}", f"{g.tdp_w:.0f}", f"{g.calibration.gemm_eff:.2f}")
    elif kind == "systems":
        for c in ("name", "gpu", "per node", "tiers (size: GB/s per GPU)", "$/GPU-h"):
            t.add_column(c)
        for s in catalog.systems().values():
            tiers = ", ".join(f"{x.name} {x.size or 'all'}: {x.bw / 1e9:.3g}" for x in s.tiers)
            t.add_row(s.name, s.gpu, str(s.gpus_per_node), tiers, f"{s.price_per_gpu_hour:.2f}")
    else:
        for c in ("name", "family", "layers", "hidden", "heads/kv", "ffn", "vocab"):
            t.add_column(c)
        for m in catalog.models().values():
            t.add_row(m.name, m.family, str(m.layers), str(m.hidden), f"{m.heads}/{m.n_kv_heads}",
                      f"{m.ffn} {m.ffn_kind}", str(m.vocab))
    t.columns[0].no_wrap = True  # names are what users copy into problem files: never truncated
    t.columns[0].min_width = max(len(name) for name in entries)
    console.print(t)


@app.command("validate")
def validate_cmd(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/validation"),
) -> None:
    """Predicted vs measured on the shared validation data; writes Markdown tables."""
    from madmax_opt.studies.validation import write_training_report

    path = write_training_report(out)
    console.print(f"wrote {path}")


@app.command()
def paper(
    study: Annotated[str, typer.Argument(help="pretraining | inference | codesign | dlrm")] = "pretraining",
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/paper"),
) -> None:
    """Regenerate a paper study (results/paper/STUDY.md): pretraining, inference, codesign or dlrm."""
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
    console.print(f"wrote {writers[study](out)}")


@app.command("bench-solver")
def bench_solver_cmd(
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("results/bench"),
) -> None:
    """Benchmark the solver against brute force (results/bench/solver.md)."""
    from madmax_opt.studies.bench_solver import write_solver_bench

    console.print(f"wrote {write_solver_bench(out)}")


# ---- commands defined in their own modules ----------------------------------------------------------------
app.command("timeline")(timeline.timeline_cmd)
app.command("trace-check")(timeline.trace_check_cmd)
app.command("bench-trace")(timeline.bench_trace_cmd)
app.command("validate-inference")(serving_reports.validate_inference_cmd)
app.command("pareto")(serving_reports.pareto_cmd)
app.command("sweep")(sweep.sweep_cmd)
app.command("report")(sweep_report.report_cmd)
app.command("bench-evaluator")(bench.bench_evaluator_cmd)
app.command("sensitivity")(sensitivity.sensitivity_cmd)
app.command("bench-sensitivity")(codesign.bench_sensitivity_cmd)


def main() -> None:
    """Entry point: one-line errors, exit codes 2 (input), 3 (infeasible), 4 (internal); no tracebacks."""

    def fail(message: str, code: int) -> NoReturn:
        print("error: " + " ".join(message.split()), file=sys.stderr)  # always one line
        sys.exit(code)

    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit raised by a command
    except MadmaxError as exc:
        fail(str(exc), exc.exit_code)
    except typer.TyperException as exc:  # usage: unknown command or option, missing argument, bad value
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare command: its help is the answer
            print(exc.format_message() if ctx is None else ctx.get_help())
            sys.exit(2)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        fail(exc.format_message() + hint, 2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        fail("aborted", 130)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.exit(0)
    except OSError as exc:  # e.g. an output directory that cannot be written
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc), 2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
