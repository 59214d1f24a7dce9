"""The plan settings: one registry read off the plan models, so a new knob is one field on a plan model.

Every consumer that lists plan settings (tables, plan labels, CSV columns, sensitivity diffs, the training plan
columns) reads them from here instead of spelling ``dp, tp, pp, ...`` out by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel

from madmax_opt.model.spec import Plan, ProcessGroup

__all__ = ["PARALLEL_DEGREES", "SHARED_DEGREES", "Setting", "degree_settings", "parallel_degrees", "plan_text",
           "process_group", "settings", "shared_degrees", "training_only_degrees", "training_only_settings"]


def process_group(name: str, model: type[BaseModel] = Plan) -> ProcessGroup | None:
    """The ``ProcessGroup`` mark of a plan field (None for a setting that is not a parallel degree)."""
    return next((m for m in model.model_fields[name].metadata if isinstance(m, ProcessGroup)), None)


@cache
def parallel_degrees(model: type[BaseModel] = Plan) -> tuple[str, ...]:
    """The plan fields marked ``ProcessGroup`` (each sizes a process group), in declaration order."""
    return tuple(n for n in model.model_fields if process_group(n, model) is not None)


@cache
def shared_degrees(model: type[BaseModel] = Plan) -> tuple[str, ...]:
    """The degrees base training and serving plans share (a serving plan has no context parallelism); a serving
    plan adds its own settings (search/serving_space.ServingPlan) and refuses every other training setting."""
    return tuple(n for n in parallel_degrees(model) if (g := process_group(n, model)) and g.serving)


PARALLEL_DEGREES: tuple[str, ...] = parallel_degrees()
SHARED_DEGREES: tuple[str, ...] = shared_degrees()

Kind = Literal["int", "bool", "choice", "name", "list"]
# Settings a label always shows, even at their default (the three degrees every plan has).
ALWAYS_SHOWN: frozenset[str] = frozenset({"dp", "tp", "pp"})
# Short prefixes in plan labels ("z1", "rc=selective"); every other setting is labelled by its own name.
LABEL_PREFIX: dict[str, str] = {"zero": "z", "recompute": "rc=", "prefill_replicas": "prefill", "max_num_seqs": "seqs"}


@dataclass(frozen=True)
class Setting:
    """One plan setting: its name, kind, default and description, as the plan model declares them."""

    name: str
    kind: Kind
    default: Any
    description: str
    choices: tuple[str, ...] = ()

    def label(self, value: Any) -> str | None:
        """The setting in a compact plan label ('tp8', 'sp', 'rc=selective'); None where it adds nothing."""
        if value is None or (value == self.default and self.name not in ALWAYS_SHOWN):
            return None
        prefix = LABEL_PREFIX.get(self.name, self.name)
        if self.kind == "bool":
            return self.name if value else None
        if self.kind == "list":
            return f"{self.name}=" + "/".join(str(v) for v in value)
        if self.kind in ("choice", "name"):
            return f"{prefix}{'' if prefix.endswith('=') else '='}{value}"
        return f"{prefix}{value}"


def _kind(annotation: Any) -> tuple[Kind, tuple[str, ...]]:
    if get_origin(annotation) is Annotated:  # PositiveInt and the like: the base type decides
        return _kind(get_args(annotation)[0])
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return "choice", tuple(str(a) for a in get_args(annotation))
    if annotation is bool:
        return "bool", ()
    if annotation is int:
        return "int", ()
    if get_origin(annotation) is list or any(get_origin(a) is list for a in args):
        return "list", ()
    if args and len(args) == 1:  # Optional[X]
        return _kind(args[0])
    return "name", ()


@cache
def settings(model: type[BaseModel] = Plan) -> tuple[Setting, ...]:
    """The settings of a plan model in declaration order (training ``Plan`` by default)."""
    out = []
    for name, f in model.model_fields.items():
        kind, choices = _kind(f.annotation)
        out.append(Setting(name, kind, f.default, f.description or "", choices))
    return tuple(out)


@cache
def degree_settings(model: type[BaseModel] = Plan) -> tuple[str, ...]:
    """Settings that are integer array columns of a training plan (degrees, modes, flags; not names or lists)."""
    return tuple(s.name for s in settings(model) if s.kind in ("int", "bool", "choice") and s.default is not None)


@cache
def training_only_degrees(model: type[BaseModel] = Plan) -> tuple[str, ...]:
    """The array settings of the training plan outside the shared degrees base (cp, vpp, mbs, zero, recompute, sp):
    what a serving plan or a serving space refuses."""
    return tuple(n for n in degree_settings(model) if n not in shared_degrees(model))


@cache
def training_only_settings(model: type[BaseModel] = Plan) -> tuple[str, ...]:
    """Every training-plan setting a serving plan refuses: :func:`training_only_degrees` and the per-stage lists of
    uneven pipelines (stage_layers, stage_recompute, stage_systems)."""
    return (*training_only_degrees(model), *(s.name for s in settings(model) if s.kind == "list"))


def plan_text(plan: Mapping[str, Any] | BaseModel | None, model: type[BaseModel] = Plan) -> str:
    """One label for a plan, e.g. 'dp64 tp8 pp8 vpp4 z1 rc=selective sp ep4' (settings at their default left out,
    except dp, tp and pp); settings of the plan dict that ``model`` does not declare are labelled by name too."""
    if plan is None:
        return "-"
    if isinstance(plan, BaseModel):
        plan = plan.model_dump()
    declared = {s.name: s for s in settings(model)}
    parts = []
    for s in settings(model):
        if s.name in plan and s.name != "system" and s.kind != "list":
            text = s.label(plan[s.name])
            if text:
                parts.append(text)
    for name, value in plan.items():  # e.g. a serving plan's precision in a training-model label
        if name not in declared and isinstance(value, (int, str)) and not isinstance(value, bool) and value:
            parts.append(Setting(name, "name" if isinstance(value, str) else "int", None, "").label(value) or "")
    # per-stage lists: the layer split says what is uneven
    if plan.get("stage_layers"):
        parts.append("stages=" + "/".join(str(n) for n in plan["stage_layers"]))
    return " ".join(p for p in parts if p)
