"""One-line validation errors: a pydantic model over a mapping, the first error turned into one line naming the
file, the field and what is allowed (keys, choices, bounds, types)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.limits import (
    check_booleans,
    check_finite,
    check_input,
)
from madmax_opt.io.yaml_files import shorten

# -------------------------------------------------------------------------------- one-line errors

Loc = tuple[str | int, ...]


def validate(cls: type[Any], data: Any, *, file: str | None, prefix: str = "") -> Any:
    """``cls.model_validate(data)``; failing, one ProblemError line: field, what is wrong, what is allowed."""
    check_input(data, file=file, prefix=prefix)  # sizes bounded, numbers finite, nesting and lists limited
    try:
        record = cls.model_validate(data)
    except ValidationError as exc:
        field, message = _one_line(cls, exc)
        raise ProblemError(message, file=file, field=_join_field(prefix, field) or None) from None
    check_booleans(data, boolean_fields(cls), file=file, prefix=prefix)  # `gpus: true` is not 1 GPU
    check_finite(record.model_dump(warnings=False), file=file, prefix=prefix)  # 'inf' given as a string
    return record


_BOOLEAN_FIELDS: dict[type[Any], frozenset[str]] = {}


def boolean_fields(cls: type[Any]) -> frozenset[str]:
    """Names of the fields of ``cls`` and the records inside it that take true/false (anywhere else a boolean is
    an error: pydantic would read ``gpus: true`` as 1 and ``ttft_s: true`` as 1.0)."""
    if cls in _BOOLEAN_FIELDS:
        return _BOOLEAN_FIELDS[cls]
    names: set[str] = set()
    seen: set[Any] = set()
    stack: list[Any] = [cls]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            todo = [info.annotation]
            while todo:
                a = _strip(todo.pop())
                if a is bool:
                    names.add(name)
                elif _is_model(a):
                    stack.append(a)
                else:
                    todo.extend(get_args(a))
    _BOOLEAN_FIELDS[cls] = frozenset(names)
    return _BOOLEAN_FIELDS[cls]


def _one_line(cls: type[BaseModel], exc: ValidationError) -> tuple[str, str]:
    """The most specific error of ``exc`` as (field, "what is wrong; allowed: ...")."""
    errors = [(_walk(cls, e["loc"], unknown_last=e["type"] == "extra_forbidden"), e) for e in exc.errors()]
    # every member of a union reports an error; the member that got deepest into the input is the one meant
    depth = max(len(w.path) for w, _ in errors)
    deepest = [(w, e) for w, e in errors if len(w.path) == depth]
    where, err = min(deepest, key=lambda we: _rank(we[1]))
    field = _field_name(where.path)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _walk(cls, err["loc"][:-1]).cursor
        return field, f"unknown key; allowed: {', '.join(_allowed_keys(parent)) or 'no keys'}"
    if kind == "missing":
        siblings = [w for w, e in deepest if e["type"] == "missing" and w.path[:-1] == where.path[:-1]]
        names = [str(w.path[-1]) for w in siblings]
        if len(names) == 1:
            return field, f"required key missing; allowed: {_describe(where.annotation, where.metadata)}"
        return _field_name(where.path[:-1]), f"required keys missing: {', '.join(names)}"
    allowed = _describe(where.annotation, where.metadata)
    got = _shown(err.get("input"))
    if kind == "literal_error":
        return field, f"unknown value {shorten(repr(err.get('input')))}; allowed: {allowed}"
    if all(_is_type_error(e) for w, e in deepest if w.path == where.path):
        return field, f"wrong type ({got}); allowed: {allowed}"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Input ")
    if kind == "value_error":  # our own validators: the message says what is allowed
        return field, msg
    if kind == "too_short" and not err.get("input"):
        return field, f"empty list; allowed: {allowed}"
    return field, f"{msg} ({got}); allowed: {allowed}"


@dataclass(frozen=True)
class _Where:
    path: list[str | int]  # field names and list indices, union branch tags removed
    annotation: Any  # the annotation of the last field on the path (the whole union, for "allowed")
    metadata: tuple[Any, ...]  # that field's constraints (Field(ge=...) etc.)
    cursor: Any  # the union member the location went through last (for the keys of a mapping)


def _walk(cls: type[BaseModel], loc: Loc, *, unknown_last: bool = False) -> _Where:
    """Follow a pydantic error location through ``cls``, dropping the union branch tags pydantic inserts."""
    path: list[str | int] = []
    annotation: Any = cls
    metadata: tuple[Any, ...] = ()
    cursor: Any = cls
    for i, part in enumerate(loc):
        members = [_strip(m) for m in _members(cursor)]
        lists = [m for m in members if get_origin(m) is list]
        owners = [m for m in members if _is_model(m) and part in m.model_fields]
        dicts = [m for m in members if get_origin(m) is dict]
        branch = [m for m in _members(cursor) if isinstance(part, str) and _names_branch(m, part)]
        if isinstance(part, int) and lists:
            annotation = cursor = get_args(lists[0])[0]
            metadata = ()
        elif owners:
            info = owners[0].model_fields[str(part)]
            annotation = cursor = info.annotation
            metadata = tuple(info.metadata)
        elif branch:
            cursor = branch[0]
            continue
        elif dicts:
            annotation = cursor = get_args(dicts[0])[1]
            metadata = ()
        elif not (unknown_last and i == len(loc) - 1):
            continue  # a branch tag we cannot place: not part of the user's field path
        path.append(part)
    return _Where(path, annotation, metadata, cursor)


def _field_name(path: list[str | int]) -> str:
    """['hardware', 0, 'gpus'] -> 'hardware[0].gpus'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _join_field(prefix: str, field: str) -> str:
    if not prefix or not field:
        return prefix or field
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


def _rank(err: Any) -> int:
    """Which of several errors at one depth to report: an unknown key (often a misspelt required key) first,
    then a bound or value error, then a missing key, then a type error (the other members of a union)."""
    if err["type"] == "extra_forbidden":
        return 0
    if err["type"] == "missing":
        return 2
    return 3 if _is_type_error(err) else 1


def _is_type_error(err: Any) -> bool:
    kind = str(err["type"])
    return kind.endswith(("_type", "_parsing")) or kind in ("int_from_float", "union_tag_invalid")


def _shown(value: Any) -> str:
    """The offending input, short: 'got 3', "got 'eight'", 'got a mapping'."""
    if value is None:
        return "got null"
    if isinstance(value, dict):
        return "got a mapping"
    if isinstance(value, list | tuple):
        return "got a list"
    return f"got {shorten(repr(value))}"  # a 2 MB string stays a short line


def _strip(annotation: Any) -> Any:
    """Annotated[X, ...] -> X."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a (possibly Annotated) union, each still Annotated; ``[annotation]`` otherwise."""
    base = _strip(annotation)
    if _is_union(base):
        return [m for a in get_args(base) for m in _members(a)]
    return [annotation]


_PRIMITIVE_TAGS: dict[Any, tuple[str, ...]] = {
    int: ("int", "constrained-int"),
    float: ("float", "constrained-float"),
    str: ("str", "constrained-str"),
    bool: ("bool",),
}


def _names_branch(member: Any, tag: str) -> bool:
    """Whether ``tag`` (e.g. 'inline', 'list[constrained-int]', 'function-after[_one_of(), HardwareEntry]') is
    the branch pydantic took through union ``member``."""
    explicit = [m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)]
    if explicit:
        return tag in explicit
    base = _strip(member)
    if _is_model(base):
        return not tag.startswith("list[") and re.search(rf"\b{base.__name__}\b", tag) is not None
    if get_origin(base) is list:
        return tag.startswith("list[")
    if get_origin(base) is Literal:
        return tag.startswith("literal[")
    return tag in _PRIMITIVE_TAGS.get(base, ())


def _allowed_keys(annotation: Any) -> list[str]:
    """Keys of the mapping(s) at ``annotation``, sorted."""
    models = [m for m in (_strip(a) for a in _members(annotation)) if _is_model(m)]
    return sorted({k for m in models[:1] for k in m.model_fields})


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _bounds(metadata: tuple[Any, ...] | list[Any]) -> list[str]:
    """Numeric bounds of annotated_types/pydantic constraints: ['> 0', '<= 3']."""
    out: list[str] = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            out.extend(_bounds(m.metadata))
            continue
        for attr, sign in _BOUNDS:
            value = getattr(m, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}")
        if getattr(m, "min_length", None):
            out.append(f"with at least {m.min_length} item{'s' if m.min_length > 1 else ''}")
    return out


def _describe(annotation: Any, metadata: tuple[Any, ...] = (), *, plural: bool = False) -> str:
    """An annotation in words: 'an integer > 0 or a list of integers > 0 or a mapping with keys {...}'."""
    inner = list(metadata)
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        inner.extend(extra)
    if any(isinstance(m, Tag) and m.tag == "catalog-name" for m in inner):
        return "catalog names" if plural else "a catalog name"
    if _is_union(annotation):
        alternatives = [a for a in get_args(annotation) if a is not type(None)]
        words = [_describe(a, tuple(inner), plural=plural) for a in alternatives]
        return " or ".join(dict.fromkeys(words))
    bounds = " and ".join(_bounds(tuple(inner)))
    bounded = f" {bounds}" if bounds else ""
    if get_origin(annotation) is Literal:
        values = ", ".join(str(v) for v in get_args(annotation))
        return f"{'values from' if plural else 'one of'} {{{values}}}"
    if get_origin(annotation) is list:
        item = _describe(get_args(annotation)[0], plural=True)
        return f"{'lists' if plural else 'a list'} of {item}{bounded}"
    if get_origin(annotation) is dict or annotation is dict:
        return "mappings" if plural else "a mapping"
    if _is_model(annotation):
        keys = ", ".join(annotation.model_fields)
        return f"{'mappings' if plural else 'a mapping'} with keys {{{keys}}}"
    nouns = {
        bool: ("true or false", "booleans"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        str: ("a string", "strings"),
        type(None): ("null", "nulls"),
    }
    singular, many = nouns.get(annotation, (f"a {getattr(annotation, '__name__', annotation)}", "values"))
    return f"{many if plural else singular}{bounded}"
