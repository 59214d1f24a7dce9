"""``madmax-opt sensitivity``: the study as a rich table, JSON, and files (Markdown, JSON, tornado PNG)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import load_problem
from madmax_opt.model.plan_settings import plan_text
from madmax_opt.studies.sensitivity import (
    HARDWARE_PARAMETERS,
    PARAMETERS,
    Study,
    _floats,
    _pct,
    base_summary,
    run_sensitivity,
    to_json,
    unit,
    variant_row,
    write_study,
)


def print_study(study: Study, console: Console) -> None:
    t = Table(title=f"hardware sensitivity of {study.problem.source} ({study.solves} solves, {study.wall_s:.2f} s)",
              header_style="bold")
    # at 80 columns the parameter names stay whole and numbers never wrap; value and new plan fold
    t.add_column("parameter", no_wrap=True, min_width=max([len(v.param) for v in study.variants] + [9]))
    t.add_column("x", justify="right", no_wrap=True)
    t.add_column("value", min_width=7)  # "$/GPU-h" whole
    for c in (unit(study), "gain", "fixed\nplan", "$/M\ntok"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("new\nplan", overflow="fold", min_width=4)
    for v in study.variants:
        r = variant_row(study, v)
        if v.record is None:
            t.add_row(v.param, f"{v.factor:g}", r["value_human"] or "-", f"[red]{v.status}[/red]", "-", "-", "-",
                      v.reason or "")
            continue
        new_plan = "same" if r["plan_change"] == "same" else plan_text(v.record["plan"])
        t.add_row(v.param, f"{v.factor:g}", r["value_human"], f"{r['tokens_per_s']:,.0f}", _pct(r["gain"]),
                  _pct(r["fixed_plan_gain"]), f"{r['usd_per_million_tokens']:.3f}", new_plan)
    console.print(t)
    console.print(base_summary(study))


def sensitivity_cmd(
    *,
    problem: Path,
    params: str | None,
    factors: str,
    out: Path,
    json_out: bool,
    time_limit: float,
    workers: int,
    jobs: int,
) -> None:
    """Re-optimise the plan for each hardware parameter x factor: throughput, cost, plan change, tornado chart."""
    from madmax_opt.report.families import family_of

    family_of(problem).require("sensitivity", problem)  # recommenders: one line, before loading the file
    names = [p.strip() for p in (params or ",".join(HARDWARE_PARAMETERS)).split(",") if p.strip()]
    if not names:
        raise ProblemError(f"empty list; allowed: {', '.join(PARAMETERS)}", field="--params")
    from madmax_opt.report.progress import progress_bar

    values = _floats(factors, "--factors")
    with progress_bar("sensitivity: solving", 1 + len(names) * len(values)) as bar:
        bar.show("base problem")
        study = run_sensitivity(load_problem(problem), names, values, time_limit_s=time_limit, workers=workers,
                                jobs=jobs, on_variant=lambda v: bar.step(f"{v.param} x{v.factor:g} done"))
    paths = write_study(study, out, f"{problem.stem}-sensitivity")
    if json_out:
        print(json.dumps(to_json(study), indent=2))
        return
    console = Console()
    print_study(study, console)
    console.print("wrote " + ", ".join(map(str, paths)), soft_wrap=True)
    ok = sum(v.status == "ok" for v in study.variants)
    console.print(f"sensitivity: {len(study.variants)} variants ({ok} solved or unchanged, "
                  f"{len(study.variants) - ok} infeasible or not applicable), {study.solves} solves in "
                  f"{study.wall_s:.1f} s", soft_wrap=True)
