"""Plan files: one plan or a list of plans, validated against a problem's hardware."""

from __future__ import annotations

from pathlib import Path

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import (
    Plan,
)


def load_plans(path: Path, problem: Problem | None = None) -> list[Plan]:
    """Plans from a YAML/JSON file (a mapping or a list); with ``problem``, each must fit its hardware."""
    data = read_yaml(path, what="plan file")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        keys = ", ".join(Plan.model_fields)
        allowed = f"a mapping with keys {{{keys}}} or a non-empty list of them"
        raise ProblemError(f"expected a plan; allowed: {allowed}", file=str(path))
    plans = []
    for i, item in enumerate(items):
        prefix = f"[{i}]" if isinstance(data, list) else ""
        plan = validate(Plan, item, file=str(path), prefix=prefix)
        # a plan for other hardware is an input error, not an invalid plan (heterogeneous stages span several)
        if problem is not None and getattr(plan, "stage_systems", None) is None:
            systems = {o.system.name for o in problem.hardware}
            if plan.system is not None and plan.system not in systems | {o.name for o in problem.hardware}:
                raise ProblemError(
                    f"{plan.system!r} is not a hardware option of {problem.source}; allowed: "
                    f"{', '.join(sorted(systems))}",
                    file=str(path),
                    field=f"{prefix}.system".lstrip("."),
                )
            sizes = sorted({o.gpus for o in problem.hardware if plan.system in (None, o.system.name, o.name)})
            if plan.gpus not in sizes:
                raise ProblemError(
                    f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.gpus} GPUs matches no cluster size of "
                    f"{problem.source}; allowed: {', '.join(map(str, sizes))}",
                    file=str(path),
                    field=f"{prefix}.dp*tp*pp*cp".lstrip("."),
                )
        plans.append(plan)
    return plans
