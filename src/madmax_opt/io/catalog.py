"""Built-in catalogs of GPUs, systems and models (YAML data files in ``madmax_opt/data``, each with sources)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.yaml_files import SAFE_LOADER, shorten
from madmax_opt.model.spec import GPU, FamilyCalibration, System, TransformerModel

T = TypeVar("T", bound=BaseModel)

def _load(filename: str, cls: type[T]) -> dict[str, T]:
    text = resources.files("madmax_opt").joinpath("data").joinpath(filename).read_text()
    raw: dict[str, dict[str, Any]] = yaml.load(text, Loader=SAFE_LOADER) or {}  # libyaml when present
    out: dict[str, T] = {}
    for name, fields in raw.items():
        try:
            out[name] = cls(name=name, **fields)
        except ValidationError as exc:  # a broken catalog is a bug in the package, but say where
            raise ProblemError(str(exc).splitlines()[0], file=f"catalog {filename}", field=name) from None
    return out


@cache
def gpus() -> dict[str, GPU]:
    return _load("gpus.yaml", GPU)


@cache
def systems() -> dict[str, System]:
    out = _load("systems.yaml", System)
    for s in out.values():
        if s.gpu not in gpus():
            raise ProblemError(f"unknown gpu {s.gpu!r}", file="catalog systems.yaml", field=f"{s.name}.gpu")
    for g in gpus().values():  # a GPU's standard node must exist and hold that GPU
        if g.standard_system is not None and out.get(g.standard_system, None) is None:
            raise ProblemError(f"unknown system {g.standard_system!r}", file="catalog gpus.yaml",
                               field=f"{g.name}.standard_system")
        if g.standard_system is not None and out[g.standard_system].gpu != g.name:
            raise ProblemError(f"system {g.standard_system!r} holds {out[g.standard_system].gpu}, not {g.name}",
                               file="catalog gpus.yaml", field=f"{g.name}.standard_system")
    return out


@cache
def families() -> dict[str, FamilyCalibration]:
    """Training calibration pooled per framework family (data/training_families.yaml, `madmax-opt validate`)."""
    return _load("training_families.yaml", FamilyCalibration)


@cache
def models() -> dict[str, TransformerModel]:
    return _load("models.yaml", TransformerModel)


def lookup(kind: str, name: str, *, file: str | None, field: str) -> Any:
    loaders: dict[str, Any] = {"gpu": gpus, "system": systems, "model": models}
    table: dict[str, Any] = loaders[kind]()
    if name not in table:
        allowed = ", ".join(sorted(table))
        hint = ", or a Hugging Face config: {hf_config: config.json}" if kind == "model" else ""
        raise ProblemError(f"unknown {kind} {shorten(repr(name))}; allowed: {allowed}{hint}", file=file, field=field)
    return table[name]


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
