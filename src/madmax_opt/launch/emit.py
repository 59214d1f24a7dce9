"""From plan to launch: emit a plan as a framework's runnable configuration, or parse one back.

``emit_plan(problem, plan, fmt)`` -> :class:`Emitted` (commands + files), or a one-line ProblemError (exit 2) when
the plan sets something the framework cannot express. ``parse_emitted`` is the inverse (tests: round trips).
Launch reads no files (no io import): the CLI reads problem and plan files and hands over the priced plan.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from madmax_opt.core.errors import InternalError, ProblemError
from madmax_opt.launch.common import Context, Emitted, Format, is_problem_field, parse_flags
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.registry import check_format, format_names
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.search.family import family_of
from madmax_opt.search.serving_space import ServingPlan


def get_format(fmt: str) -> Format:
    """The registered format ``fmt`` (launch/registry.py), from the module its flag file names; unknown names: the
    one-line error listing the allowed ones."""
    module = import_module(check_format(fmt).module)
    return next(v for v in vars(module).values() if isinstance(v, Format) and v.name == fmt)


def formats() -> dict[str, Format]:
    """Every registered format, in listing order."""
    return {name: get_format(name) for name in format_names()}


def formats_for(problem: Problem) -> list[str]:
    """The formats of the problem's family (search/family.py): serving formats for serving problems, training
    formats for training problems."""
    kind = family_of(problem).launch_kind
    return format_names(kind) if kind is not None else []


def emit_plan(problem: Problem, plan: Plan, fmt: str, checkpoint: str | None = None) -> Emitted:
    """The runnable configuration of ``plan`` in format ``fmt``; ProblemError when it cannot be expressed.
    ``checkpoint``: the weights a serving format loads (default: the model's Hugging Face id)."""
    f = get_format(fmt)
    if fmt not in formats_for(problem):
        allowed = ", ".join(formats_for(problem))
        raise ProblemError(f"{fmt} is a {f.kind} format; allowed for this problem: {allowed}", file=problem.source,
                           field="FORMAT")
    if family_of(problem).serving and not isinstance(plan, ServingPlan):
        plan = _serving_plan(problem, plan)
    option = problem.hardware[problem.hw_index(plan)]
    emitted = f.emit(Context(problem=problem, plan=plan, option=option, checkpoint=checkpoint))
    unknown = emitted_names(emitted) - allowed_names(fmt)
    if unknown:  # never hand out a flag the framework does not have (a bug: exit 4)
        raise InternalError(f"{fmt} emitted names missing from data/flags/{fmt}.yaml: {', '.join(sorted(unknown))}")
    bad = [f"{k}={v}" for k, v in disallowed_values(emitted)]
    if bad:
        raise InternalError(f"{fmt} emitted values outside the choices of data/flags/{fmt}.yaml: {', '.join(bad)}")
    return emitted


def _serving_plan(problem: Problem, plan: Plan) -> ServingPlan:
    """A training-shaped plan given for a serving format, as a serving plan; a training-only knob is one line."""
    try:
        return ServingPlan.model_validate(plan.model_dump(exclude_unset=True))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ProblemError(err["msg"], file=problem.source, field=".".join(["plan", *map(str, err["loc"])])) from None


def parse_emitted(emitted: Emitted) -> Plan:
    """The plan an emitted configuration runs (``system`` is not recovered: the commands carry node counts)."""
    return get_format(emitted.format).parse(emitted)


def emitted_items(emitted: Emitted) -> list[tuple[str, Any]]:
    """Every (flag or config key, value) an emitted configuration uses: launcher and program flags (a bare flag's
    value is True), then the keys of its files and overrides."""
    items: list[tuple[str, Any]] = []
    for c in emitted.commands:
        items += parse_flags(c.launcher[1:]).items()
        items += parse_flags([a for a in c.args if a.startswith("-") or not _is_override(a)]).items()
    return items + list(get_format(emitted.format).config(emitted).items())


def emitted_names(emitted: Emitted) -> set[str]:
    """Every flag (launcher and program) and config key an emitted configuration uses."""
    return {name for name, _ in emitted_items(emitted)}


def disallowed_values(emitted: Emitted) -> list[tuple[str, Any]]:
    """(name, value) pairs whose value is not among the recorded choices of that flag or key."""
    choices = {k: {str(c) for c in v} for k, v in flagset(emitted.format).choices.items()}
    return [(name, value) for name, value in emitted_items(emitted) if name in choices
            and any(str(x) not in choices[name] for x in (value if isinstance(value, list) else [value]))]


def _is_override(token: str) -> bool:
    return "=" in token and not token.startswith("-")


def allowed_names(fmt: str) -> set[str]:
    fs = flagset(fmt)
    return set(fs.flags) | set(fs.config_keys) | fs.launcher_flags


def plan_of_record(problem: Problem, record_plan: dict[str, Any]) -> Plan:
    """A plan of a ``solve --json`` record (serving records carry kv_precision, a task setting, besides); the
    records are solve's own, so a record that is not a plan is a bug (exit 4)."""
    cls = family_of(problem).plan_type
    try:
        plan = cls.model_validate({k: v for k, v in record_plan.items() if k in cls.model_fields})
    except ValidationError as exc:
        raise InternalError(f"a solve record's plan is not a {cls.__name__}: {exc.errors()[0]['msg']}") from None
    assert isinstance(plan, Plan)  # transformer families only: recommenders emit nothing (launch_kind None)
    return plan


def locate_refusal(exc: ProblemError, problem: Path, plan_file: Path, prefix: str = "") -> ProblemError:
    """A refusal of ``emit_plan`` (no file) named where it comes from: a problem field (``task...``, ``model...``)
    in the problem file, a plan field in the plan file, at ``prefix`` (``[i]``) when the file lists plans."""
    if exc.file is not None:
        return exc
    if is_problem_field(exc.field):
        return ProblemError(exc.message, file=str(problem), field=exc.field)
    field = exc.field if exc.field != "plan" else None
    return ProblemError(exc.message, file=str(plan_file), field=".".join(x for x in (prefix, field) if x) or None)


def write_emitted(emitted: Emitted, out: Path) -> list[Path]:
    """Write the files and a launch script (``launch.sh``) into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in {**emitted.files, "launch.sh": emitted.script()}.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    (out / "launch.sh").chmod(0o755)
    return paths
