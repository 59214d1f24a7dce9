"""How each workload family is shown: the presentation verbs (show a solve result, print evaluations) keyed by
the family's name.

What a family is and does (solve, verify, evaluate, which verbs apply) is search/family.py; which family a problem
file is, io/file_family.py. Every command asks :func:`family_of` for the family of its problem file
and calls that family's verb, or refuses in one line when the verb does not apply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.family_name import FamilyName

if TYPE_CHECKING:  # rich is imported where a table is printed (a --json solve imports none)
    from rich.console import Console

    from madmax_opt.search.cpsat import CpSatOptions
    from madmax_opt.search.family import Family as SearchFamily
    from madmax_opt.search.family import SearchOptions


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

    def search(self) -> SearchOptions:
        """The options of the family's solve and verify (search/family.py), with one CP-SAT options object."""
        from madmax_opt.search.family import SearchOptions

        return SearchOptions(self.top_k, self.time_limit_s, self.workers, self.cpsat(), self.robust)


@dataclass(frozen=True)
class Family:
    """One workload family as the commands show it: ``show`` prints a solve result, ``evaluate`` prints the
    evaluations of a plan file; solve, verify and which verbs apply come from search/family.py."""

    name: FamilyName
    show: Callable[[dict[str, Any], Console], None]
    evaluate: Callable[[Path, Path, bool, Path | None, Console], None]

    @property
    def search(self) -> SearchFamily:
        from madmax_opt.search.family import FAMILIES as SEARCH

        return SEARCH[self.name]

    @property
    def verify(self) -> Callable[[Path, SolveOptions], dict[str, Any]] | None:
        return _verify if self.search.verify is not None else None

    @property
    def sensitivity(self) -> bool:
        return self.search.sensitivity

    @property
    def timeline(self) -> bool:
        return self.search.timeline

    @property
    def pareto(self) -> bool:
        return self.search.pareto

    @property
    def ops(self) -> bool:
        return self.search.ops

    def load(self, path: Path) -> Any:
        """The resolved problem at ``path`` (recommenders have their own loader, io/dlrm_problem.py)."""
        if self.name is FamilyName.RECOMMENDER:
            from madmax_opt.io.dlrm_problem import load_dlrm_problem

            return load_dlrm_problem(path)
        from madmax_opt.io.problem import load_problem

        return load_problem(path)

    def solve(self, path: Path, opts: SolveOptions) -> dict[str, Any]:
        """The JSON object of ``solve --json`` (search/result.py's solve_result, by the problem's family)."""
        from madmax_opt.report.progress import progress_bar
        from madmax_opt.search import result

        if opts.top_k != 1 and not self.search.top_k:
            raise ProblemError("--top-k applies to training and serving problems; recommenders return one plan",
                               file=str(path), field="--top-k")
        problem = self.load(path)
        o = opts.search()
        if self.name is FamilyName.RECOMMENDER:  # one placement solve per option, no progress bar
            return result.solve_result(problem, o.top_k, o.time_limit_s, o.workers, cpsat=o.cpsat)
        systems = len({h.system.name for h in problem.hardware})
        what = f"solve {path.name}: {len(problem.hardware)} hardware option(s)" + (
            f" on {systems} systems, each system's best kept" if systems > 1 else "")
        with progress_bar(what, None, count=False):  # stderr, on a terminal only: a search can take a minute
            return result.solve_result(problem, o.top_k, o.time_limit_s, o.workers, cpsat=o.cpsat, robust=o.robust)

    def require(self, verb: str, path: Path) -> None:
        """A one-line refusal when ``verb`` does not apply to this family."""
        if not getattr(self, verb):
            has = dict.fromkeys(f.search.label for f in FAMILIES.values() if getattr(f, verb))
            raise ProblemError(f"`{verb}` does not apply to {self.search.label} problems; it applies to: "
                               + ", ".join(has), file=str(path))


def _verify(path: Path, opts: SolveOptions) -> dict[str, Any]:
    from madmax_opt.io.problem import load_problem
    from madmax_opt.search import verify

    return verify.verify_problem(load_problem(path), cpsat=opts.cpsat())


def _records(problem: Any, plans: list[Any], plan: Path) -> list[Any]:
    """The records of ``plans`` by the problem's family (search/family.py), in order."""
    from madmax_opt.search.family import family_of as search_family

    return search_family(problem).evaluate(problem, plans, str(plan))


# ---------------------------------------------------------------------------------------------- training


def _training_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.report import print_solution

    print_solution(result, console)


def _training_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from rich.console import Console

    from madmax_opt.io.plans import load_plans
    from madmax_opt.io.problem import load_problem
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.report import plots
    from madmax_opt.report.report import print_evaluations

    loaded = load_problem(path)
    records = _records(loaded, load_plans(plan, loaded), plan)
    if plot is not None:
        paths = plots.plan_figures(records, plot)
        Console(stderr=True).print(f"wrote {', '.join(map(str, paths))} ({len(records)} plan(s) plotted)",
                                   soft_wrap=True)
    if json_out:  # a file with one plan mapping gives one object, a list gives a list in the same order
        print(json.dumps(records if isinstance(read_yaml(plan), list) else records[0], indent=2))
    else:
        print_evaluations(records, console)


# ---------------------------------------------------------------------------------------------- serving


def _serving_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.serving_tables import print_result

    print_result(result, console)


def _online_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.online_reports import print_online

    print_online(result, console)


def _serving_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console,
                      printer: Callable[[list[Any], Console], None]) -> None:
    from madmax_opt.analysis.serving_records import ServingRecord
    from madmax_opt.io.problem import load_problem
    from madmax_opt.report.serving_tables import load_serving_plans

    if plot is not None:
        raise ProblemError("--plot draws training plans; for serving use `madmax-opt pareto`", file=str(path),
                           field="--plot")
    problem = load_problem(path)
    plans, is_list = load_serving_plans(plan)
    records = _records(problem, plans, plan)
    if json_out:  # steady serving records are typed (their JSON object), online ones plain dicts
        out = [r.to_json() if isinstance(r, ServingRecord) else r for r in records]
        print(json.dumps(out if is_list else out[0], indent=2))
    else:
        printer(records, console)


def _steady_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.report.serving_tables import print_records

    _serving_evaluate(path, plan, json_out, plot, console, print_records)


def _online_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.report.online_reports import print_online_records  # percentiles at the arrival rate

    _serving_evaluate(path, plan, json_out, plot, console, print_online_records)


# ------------------------------------------------------------------------------------------- recommender


def _dlrm_show(result: dict[str, Any], console: Console) -> None:
    from madmax_opt.report.dlrm_report import print_result

    print_result(result, console)


def _dlrm_evaluate(path: Path, plan: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    from madmax_opt.io.dlrm_problem import load_dlrm_plans, load_dlrm_problem
    from madmax_opt.report.dlrm_report import print_evaluations

    if plot is not None:
        raise ProblemError("--plot draws training plans", file=str(path), field="--plot")
    problem = load_dlrm_problem(path)
    records = _records(problem, load_dlrm_plans(plan), plan)
    if json_out:
        print(json.dumps(records if len(records) > 1 else records[0], indent=2))
        return
    print_evaluations(records, console)


FAMILIES: dict[FamilyName, Family] = {f.name: f for f in (
    Family(FamilyName.TRAINING, _training_show, _training_evaluate),
    Family(FamilyName.SERVING, _serving_show, _steady_evaluate),
    Family(FamilyName.ONLINE, _online_show, _online_evaluate),
    Family(FamilyName.RECOMMENDER, _dlrm_show, _dlrm_evaluate),
)}


def family_of(path: Path) -> Family:
    """The family of a problem file (io/file_family.py), as the commands show it."""
    from madmax_opt.io.file_family import file_family
    from madmax_opt.io.yaml_files import read_yaml

    return FAMILIES[file_family(read_yaml(path, what="problem file"))]
