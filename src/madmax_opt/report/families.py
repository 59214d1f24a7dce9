"""The workload families (training, serving, recommender) and the verbs each one has.

This is the one place that dispatches on a problem's family: every command asks :func:`family_of` for the
family of its problem file and calls that family's verb, or refuses in one line when the verb does not apply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from madmax_opt.core.errors import ProblemError

if TYPE_CHECKING:
    from madmax_opt.search.cpsat import CpSatOptions


@dataclass(frozen=True)
class SolveOptions:
    """What ``solve`` passes to a family's search (the CLI's options)."""

    top_k: int = 1
    time_limit_s: float = 60.0
    workers: int = 1
    solver_params: str | None = None  # CP-SAT parameters, text format (--solver-params)
    export_model: Path | None = None  # write the CP-SAT model(s) here (--export-model)
    robust: bool = False  # training: the best worst case within the error bars (--robust, search/robust.py)

    def cpsat(self) -> CpSatOptions:
        """The CP-SAT options of every search this command runs (search/cpsat.py)."""
        from madmax_opt.search.cpsat import CpSatOptions as Options

        return Options(self.time_limit_s, self.workers, params=self.solver_params, export_model=self.export_model)


@dataclass(frozen=True)
class Family:
    """One workload family: how to solve, show and evaluate its problems; None marks a verb it does not have."""

    name: str
    solve: Callable[[Path, SolveOptions], dict[str, Any]]
    show: Callable[[dict[str, Any], Console], None]
    evaluate: Callable[[Path, Path, bool, Path | None, Console], None]
    verify: Callable[[Path, SolveOptions], dict[str, Any]] | None = None
    sensitivity: bool = False
    timeline: bool = False
    pareto: bool = False  # throughput (or arrival rate) vs latency: serving only
    ops: bool = False  # evaluate --ops: the op table of one transformer layer (model/ops.py)

    def require(self, verb: str, path: Path) -> None:
        """A one-line refusal when ``verb`` does not apply to this family."""
        if not getattr(self, verb):
            has = [f.name for f in FAMILIES.values() if getattr(f, verb)]
            raise ProblemError(f"`{verb}` does not apply to {self.name} problems; it applies to: "
                               + ", ".join(has), file=str(path))


# ---------------------------------------------------------------------------------------------- training


def _problem_solve(path: Path, opts: SolveOptions) -> dict[str, Any]:
    """Training and serving: search.result.solve_result routes by the task (uniform, steady or online serving)."""
    from madmax_opt.io.problem import load_problem
    from madmax_opt.report.progress import progress_bar
    from madmax_opt.search.result import solve_result

    problem = load_problem(path)
    systems = len({o.system.name for o in problem.hardware})
    what = f"solve {path.name}: {len(problem.hardware)} hardware option(s)" + (
        f" on {systems} systems, each system's best kept" if systems > 1 else "")
    with progress_bar(what, None, count=False):  # stderr, on a terminal only: a search can take a minute
        return solve_result(problem, opts.top_k, opts.time_limit_s, opts.workers, cpsat=opts.cpsat(),
                            robust=opts.robust)


def _training_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.report import print_solution

    print_solution(result, console)


def _training_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.analysis.evaluator import evaluate
    from madmax_opt.io.plans import load_plans
    from madmax_opt.io.problem import load_problem
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.report import plots
    from madmax_opt.report.report import print_evaluations

    loaded = load_problem(path)
    records = evaluate(loaded, load_plans(plan, loaded))
    if plot is not None:
        paths = plots.plan_figures(records, plot)
        Console(stderr=True).print(f"wrote {', '.join(map(str, paths))} ({len(records)} plan(s) plotted)",
                                   soft_wrap=True)
    if json_out:  # a file with one plan mapping gives one object, a list gives a list in the same order
        print(json.dumps(records if isinstance(read_yaml(plan), list) else records[0], indent=2))
    else:
        print_evaluations(records, console)


def _problem_verify(path: Path, opts: SolveOptions) -> dict[str, Any]:
    from madmax_opt.io.problem import load_problem
    from madmax_opt.search.verify import verify_problem

    return verify_problem(load_problem(path), cpsat=opts.cpsat())


# ---------------------------------------------------------------------------------------------- serving


def _serving_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.serving_tables import print_result

    if result.get("task") == "inference-online":  # arrival-rate problems
        from madmax_opt.report.online_reports import print_online

        return print_online(result, console)
    print_result(result, console)


def _serving_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.io.problem import load_problem
    from madmax_opt.report.serving_tables import evaluate_command

    if plot is not None:
        raise ProblemError("--plot draws training plans; for serving use `madmax-opt pareto`", file=str(path),
                           field="--plot")
    evaluate_command(load_problem(path), plan, json_out, console)


# ------------------------------------------------------------------------------------------- recommender


def _dlrm_solve(path: Path, opts: SolveOptions) -> dict[str, Any]:
    from madmax_opt.io.dlrm_problem import load_dlrm_problem
    from madmax_opt.report.dlrm_report import solve_result

    if opts.top_k != 1:
        raise ProblemError("--top-k applies to training and serving problems; recommenders return one plan",
                           file=str(path), field="--top-k")
    return solve_result(load_dlrm_problem(path), opts.time_limit_s, opts.workers, cpsat=opts.cpsat())


def _dlrm_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.dlrm_report import print_result

    print_result(result, console)


def _dlrm_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.report import dlrm_report

    if plot is not None:
        raise ProblemError("--plot draws training plans", file=str(path), field="--plot")
    dlrm_report.evaluate_command(path, plan, json_out, console)


TRAINING = Family("training", _problem_solve, _training_show, _training_evaluate, _problem_verify,
                  sensitivity=True, timeline=True, ops=True)
SERVING = Family("serving", _problem_solve, _serving_show, _serving_evaluate, _problem_verify,
                 sensitivity=True, timeline=True, pareto=True)
RECOMMENDER = Family("recommender", _dlrm_solve, _dlrm_show, _dlrm_evaluate)
FAMILIES: dict[str, Family] = {f.name: f for f in (TRAINING, SERVING, RECOMMENDER)}


def family_of(path: Path) -> Family:
    """The family of a problem file: recommender (DLRM model), serving (task kind inference) or training."""
    from madmax_opt.io.dlrm_problem import is_dlrm_data
    from madmax_opt.io.yaml_files import read_yaml

    data = read_yaml(path, what="problem file")
    if is_dlrm_data(data):
        return RECOMMENDER
    task = data.get("task") if isinstance(data, dict) else None
    return SERVING if isinstance(task, dict) and task.get("kind") == "inference" else TRAINING
