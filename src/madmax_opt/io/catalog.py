"""Built-in catalogs of GPUs, systems and models (YAML data files in ``madmax_opt/data``, each with sources).

The files are parsed once per content (io/data_cache.py). A lookup by name builds only the system or model it
names (a solve needs one model and a few systems of the dozens listed); ``systems()`` and ``models()`` build them
all, the same objects a lookup returns."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.data_cache import package_entries
from madmax_opt.io.yaml_files import shorten
from madmax_opt.model.spec import GPU, FamilyCalibration, System, TransformerModel

T = TypeVar("T", bound=BaseModel)


def _build(filename: str, cls: type[T], name: str) -> T:
    try:
        return cls(name=name, **package_entries(filename)[name])
    except ValidationError as exc:  # a broken catalog is a bug in the package, but say where
        raise ProblemError(str(exc).splitlines()[0], file=f"catalog {filename}", field=name) from None


def _load(filename: str, cls: type[T]) -> dict[str, T]:
    return {name: _build(filename, cls, name) for name in package_entries(filename)}


@cache
def gpus() -> dict[str, GPU]:
    return _load("gpus.yaml", GPU)


@cache
def _system(name: str) -> System:
    """One system of systems.yaml, its GPU checked against the GPU catalog."""
    s = _build("systems.yaml", System, name)
    if s.gpu not in gpus():
        raise ProblemError(f"unknown gpu {s.gpu!r}", file="catalog systems.yaml", field=f"{s.name}.gpu")
    return s


@cache
def _standard_systems_checked() -> None:
    """Every GPU's standard node exists in systems.yaml and holds that GPU (read from the files' entries, each the
    field the built System's ``gpu`` is validated from: a str)."""
    raw = package_entries("systems.yaml")
    for g in gpus().values():
        if g.standard_system is not None and g.standard_system not in raw:
            raise ProblemError(f"unknown system {g.standard_system!r}", file="catalog gpus.yaml",
                               field=f"{g.name}.standard_system")
        held = raw[g.standard_system].get("gpu") if g.standard_system is not None else None
        if g.standard_system is not None and held != g.name:
            raise ProblemError(f"system {g.standard_system!r} holds {held}, not {g.name}",
                               file="catalog gpus.yaml", field=f"{g.name}.standard_system")


@cache
def systems() -> dict[str, System]:
    out = {name: _system(name) for name in package_entries("systems.yaml")}
    _standard_systems_checked()
    return out


@cache
def families() -> dict[str, FamilyCalibration]:
    """Training calibration pooled per framework family (data/training_families.yaml, `madmax-opt validate`)."""
    return _load("training_families.yaml", FamilyCalibration)


@cache
def _model(name: str) -> TransformerModel:
    return _build("models.yaml", TransformerModel, name)


@cache
def models() -> dict[str, TransformerModel]:
    return {name: _model(name) for name in package_entries("models.yaml")}


def lookup(kind: str, name: str, *, file: str | None, field: str) -> Any:
    """The catalog entry ``name`` of ``kind`` (gpu, system or model); an unknown name is a one-line error listing
    the catalog's names. Only the entry asked for is built (and, for a system, the standard nodes checked)."""
    names: Any = gpus() if kind == "gpu" else package_entries("systems.yaml" if kind == "system" else "models.yaml")
    if name not in names:
        allowed = ", ".join(sorted(names))
        hint = ", or a Hugging Face config: {hf_config: config.json}" if kind == "model" else ""
        raise ProblemError(f"unknown {kind} {shorten(repr(name))}; allowed: {allowed}{hint}", file=file, field=field)
    if kind == "gpu":
        return names[name]
    if kind == "system":
        _standard_systems_checked()
        return _system(name)
    return _model(name)


def standard_system(gpu: str, *, file: str | None, field: str) -> System:
    """The catalog node a GPU name alone stands for (``standard_system`` in ``data/gpus.yaml``)."""
    g: GPU = lookup("gpu", gpu, file=file, field=field)
    if g.standard_system is None:
        with_gpu = sorted(s.name for s in systems().values() if s.gpu == gpu)
        raise ProblemError(f"GPU {gpu!r} has no standard node in the catalog; name a system instead "
                           f"(hardware.system; allowed: {', '.join(with_gpu) or 'an inline system'})",
                           file=file, field=field)
    system: System = lookup("system", g.standard_system, file=file, field=field)
    return system
