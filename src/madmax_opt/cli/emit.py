"""emit: a plan as a framework's runnable configuration; and the --emit option of solve."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from madmax_opt.cli.app import JsonOpt, ProblemArg, app
from madmax_opt.launch.registry import format_names, formats_help

FORMAT_HELP = formats_help()  # the registered launch formats (launch/registry.py)
OutOpt = Annotated[Path | None, typer.Option("--out", help="write the files and launch.sh here (one folder per "
                                             "plan when the plan file lists several)")]


def _load(problem: Path) -> Any:
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.io.file_family import file_family
    from madmax_opt.io.problem import load_problem
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.search.family import FAMILIES

    if FAMILIES[file_family(read_yaml(problem, what="problem file"))].launch_kind is None:
        raise ProblemError("recommendation (DLRM) problems have no launch formats; allowed: transformer problems",
                           file=str(problem), field="--emit")
    return load_problem(problem)


def check_emit(problem: Path, fmt: str | None) -> None:
    """Before a long solve: the format exists and fits the problem's kind (one-line error otherwise)."""
    if fmt is None:
        return
    from madmax_opt.launch.emit import formats_for, get_format

    f, loaded = get_format(fmt), _load(problem)
    if fmt not in formats_for(loaded):
        from madmax_opt.core.errors import ProblemError

        raise ProblemError(f"{fmt} is a {f.kind} format; allowed for this problem: {', '.join(formats_for(loaded))}",
                           file=str(problem), field="--emit")


def emit_best(problem: Path, result: dict[str, Any], fmt: str, out: Path | None) -> dict[str, Any]:
    """``solve --emit FMT``: the configuration of the best returned plan FMT can express (the optimum unless FMT
    refuses it; then the next of the --top-k plans), written to ``out`` when given. The JSON object adds ``rank``
    (0 = the optimum) and ``refused`` (why FMT could not run the better plans)."""
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.launch.emit import emit_plan, plan_of_record, write_emitted

    loaded = _load(problem)
    refused: list[str] = []
    first: ProblemError | None = None
    for rank, record in enumerate(result.get("top") or [result["best"]]):
        try:
            emitted = emit_plan(loaded, plan_of_record(loaded, record["plan"]), fmt)
        except ProblemError as exc:
            refused.append(str(exc))
            first = first or exc
            continue
        if out is not None:
            report_written(write_emitted(emitted, out))
        return {**emitted.model_dump(), "rank": rank, "refused": refused}
    more = f" (none of the {len(refused)} returned plans; a larger --top-k may find one)" if len(refused) > 1 else \
        " (try --top-k 20: the next plans may be expressible)"
    assert first is not None
    raise ProblemError(first.message + more, file=str(problem), field="--emit")


def load_plan_file(path: Path, problem: Any) -> list[Any]:
    """Plans of a YAML/JSON plan file (a mapping or a list), as training or serving plans per the problem."""
    from madmax_opt.io.plans import load_plans
    from madmax_opt.io.validate import validate
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.search.family import family_of
    from madmax_opt.search.serving_space import ServingPlan

    if not family_of(problem).serving:
        return load_plans(path, problem)
    data = read_yaml(path, what="plan file")
    items = data if isinstance(data, list) else [data]
    return [validate(ServingPlan, x, file=str(path), prefix=f"[{i}]" if isinstance(data, list) else "")
            for i, x in enumerate(items)]


def report_written(paths: list[Path]) -> None:
    """``wrote PATH`` for every file written, on stderr (stdout carries the script or the JSON)."""
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)


def script_of(record: dict[str, Any]) -> str:
    from madmax_opt.launch.common import Emitted

    e = Emitted.model_validate({k: v for k, v in record.items() if k in Emitted.model_fields})
    rank = record.get("rank", 0)
    head = f"# the optimum cannot be emitted; this is the plan ranked {rank + 1} of those returned\n" if rank else ""
    refused = "".join(f"# refused: {r}\n" for r in record.get("refused", []))
    files = "".join(f"\n# --- {name}\n{text}" for name, text in e.files.items())
    return head + refused + e.script() + files


@app.command("emit")
def emit_cmd(
    problem: ProblemArg,
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=FORMAT_HELP, show_default=False)],
    plan: Annotated[Path, typer.Option("--plan", help="YAML/JSON file: one plan or a list of plans")],
    out: OutOpt = None,
    json_out: JsonOpt = False,
    force: Annotated[bool, typer.Option("--force", help="emit a plan that does not fit in memory (exit 3 without); "
                                        "never an invalid one")] = False,
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="serving: the weights to load, a path or "
                                                   "Hugging Face id (default: the model's hf_id)")] = None,
    benchmark: Annotated[int | None, typer.Option("--benchmark", metavar="N", help="with --out: a short measured "
                         "run (N logged iterations, or a serving client writing result JSON) and, for training, "
                         "measure.sh + runs.yaml for calibrate")] = None,
) -> None:
    """Emit plan(s) as a framework's commands and config files. Each plan first passes the evaluator's checks: an
    invalid plan is exit 2, one that does not fit exit 3 (--force emits it); a setting the framework cannot
    express is exit 2."""
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.launch.checks import check_before_emit
    from madmax_opt.launch.emit import emit_plan, locate_refusal, write_emitted

    loaded = _load(problem)
    if benchmark is not None:
        from madmax_opt.launch.benchmark import check_benchmark_options

        check_benchmark_options(benchmark, fmt, out, loaded.task, problem)
    plans = load_plan_file(plan, loaded)
    listed = isinstance(read_yaml(plan, what="plan file"), list)
    for i, p in enumerate(plans):  # every plan checked before any file is written
        check_before_emit(loaded, p, str(plan), f"[{i}]" if listed else "", force=force)
    records = []
    for i, p in enumerate(plans):
        try:
            emitted = emit_plan(loaded, p, fmt, checkpoint)
        except ProblemError as exc:  # name the plan file and field (or the problem's, for a task/model setting)
            raise locate_refusal(exc, problem, plan, f"[{i}]" if listed else "") from None
        if benchmark is not None:
            from madmax_opt.launch.benchmark import benchmark_emitted

            emitted = benchmark_emitted(emitted, loaded, p, benchmark)
        if out is not None:
            report_written(write_emitted(emitted, out if len(plans) == 1 else out / f"plan-{i}"))
        records.append(emitted.model_dump())
    if benchmark is not None and out is not None and fmt in format_names("training"):
        from madmax_opt.launch.benchmark import loop_files, write_loop_files

        dirs = ["."] if len(plans) == 1 else [f"plan-{i}" for i in range(len(plans))]
        raw = read_yaml(problem, what="problem file")
        report_written(write_loop_files(loop_files(problem, raw, loaded, plans, dirs), out))
    if json_out:
        print(json.dumps(records[0] if len(records) == 1 else records, indent=2))
    else:
        print("\n".join(script_of(r) for r in records), end="")
