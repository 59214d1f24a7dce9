"""DLRM problem files: loading, validation and catalog resolution for recommender problems (the shapes and
costs live in ``madmax_opt.model.dlrm``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.data_cache import package_entries
from madmax_opt.io.limits import MAX_DLRM_GPUS
from madmax_opt.io.problem import check_space, hardware_options, resolve_system
from madmax_opt.io.problem_file import HardwareEntry
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.dlrm_spec import (
    DLRMConstraints,
    DLRMModel,
    DLRMObjective,
    DLRMPlan,
    DLRMSpace,
    DLRMStack,
    DLRMTask,
)
from madmax_opt.model.problem import DLRMProblem
from madmax_opt.model.spec import Strict


def _by_shape(v: Any) -> str:
    return "catalog-name" if isinstance(v, str) else "inline"


DLRMModelRef = Annotated[
    Annotated[str, Tag("catalog-name")] | Annotated[DLRMModel, Tag("inline")], Discriminator(_by_shape)
]


class DLRMProblemFile(Strict):
    """A DLRM problem file: like the transformer one, with a DLRM model and a task in samples."""

    model: DLRMModelRef
    hardware: HardwareEntry | Annotated[list[HardwareEntry], Field(min_length=1)]
    task: DLRMTask
    space: DLRMSpace = DLRMSpace()
    stack: DLRMStack = DLRMStack()
    objective: DLRMObjective = "throughput"
    constraints: DLRMConstraints = DLRMConstraints()
    baseline: DLRMPlan | None = None


@cache
def dlrm_models() -> dict[str, DLRMModel]:
    """The DLRM catalog's models (``data/dlrm.yaml``)."""
    out: dict[str, DLRMModel] = {}
    for name, fields in package_entries("dlrm.yaml").items():
        try:
            out[name] = DLRMModel(name=name, **fields)
        except ValidationError as exc:
            raise ProblemError(str(exc).splitlines()[0], file="catalog dlrm.yaml", field=name) from None
    return out


def load_dlrm_problem(path: str | Path) -> DLRMProblem:
    data = read_yaml(path, what="problem file")
    if not isinstance(data, dict):
        validate(DLRMProblemFile, data, file=str(path))
    return dlrm_problem_from_dict(data, source=str(path))


def dlrm_problem_from_dict(data: dict[str, Any], source: str = "<inline>") -> DLRMProblem:
    pf = validate(DLRMProblemFile, data, file=source)
    check_space(pf.space, file=source)  # tp: 0 and the like, as for training and serving spaces
    if isinstance(pf.model, str):
        models = dlrm_models()
        if pf.model not in models:
            raise ProblemError(f"unknown DLRM model {pf.model!r}; allowed: {', '.join(sorted(models))}",
                               file=source, field="model")
        model = models[pf.model]
    else:
        model = pf.model
    options = hardware_options(pf.hardware, file=source)
    entries = pf.hardware if isinstance(pf.hardware, list) else [pf.hardware]
    total = 0  # GPUs over all options: the placement models' size
    for i, e in enumerate(entries):  # DLRM placement works on whole nodes
        field = f"hardware[{i}]" if isinstance(pf.hardware, list) else "hardware"
        node = resolve_system(e, file=source, field=field).tiers[0].size
        for n in e.sizes():
            total += n
            if total > MAX_DLRM_GPUS:
                raise ProblemError(f"{total:,} GPUs over the hardware options; allowed: at most {MAX_DLRM_GPUS:,} "
                                   "in all for a recommender (table placement is a per-GPU CP-SAT model)",
                                   file=source, field=f"{field}.gpus")
            if node is not None and n > node and n % node:
                raise ProblemError(f"{n} GPUs is not a whole number of {node}-GPU nodes; allowed: multiples of "
                                   f"{node} or at most {node}", file=source, field=f"{field}.gpus")
    if pf.objective == "time_to_train" and pf.task.train_samples is None:
        raise ProblemError("objective time_to_train needs task.train_samples", file=source,
                           field="task.train_samples")
    names = {t.name for t in model.tables}
    if isinstance(pf.baseline, DLRMPlan) and isinstance(pf.baseline.placement, list):
        for j, s in enumerate(pf.baseline.placement):
            if s.group not in names:
                raise ProblemError(f"unknown table group {s.group!r}; allowed: {', '.join(sorted(names))}",
                                   file=source, field=f"baseline.placement[{j}].group")
    return DLRMProblem(model, pf.task, pf.space, pf.stack, tuple(options), pf.objective, pf.constraints,
                       pf.baseline, source)


def load_dlrm_plans(path: str | Path) -> list[DLRMPlan]:
    """DLRM plans from a YAML/JSON file: one mapping or a list of them."""
    data = read_yaml(path, what="plan file")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        keys = ", ".join(DLRMPlan.model_fields)
        raise ProblemError(f"expected a DLRM plan; allowed: a mapping with keys {{{keys}}} or a list of them",
                           file=str(path))
    return [validate(DLRMPlan, x, file=str(path), prefix=f"[{i}]" if isinstance(data, list) else "")
            for i, x in enumerate(items)]
