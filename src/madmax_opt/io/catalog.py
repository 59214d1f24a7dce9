"""Built-in catalogs of GPUs, systems and models (YAML data files in ``madmax_opt/data``, each with sources)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.spec import GPU, System, TransformerModel

T = TypeVar("T", bound=BaseModel)

# The node a GPU name alone stands for (``hardware: {gpu: h100-sxm, gpus: 64}``).
STANDARD_SYSTEM: dict[str, str] = {
    "v100-16gb": "cloud-a-p3-16xlarge",
    "v100-32gb": "dgx-v100",
    "a100-40gb": "dgx-a100-40gb",
    "a100-80gb": "dgx-a100",
    "h100-sxm": "dgx-h100",
    "h100-hbm2e-96gb": "grand-teton-h100-hbm2e",
    "h200-sxm": "dgx-h200",
    "b200": "dgx-b200",
    "gb200": "gb200-nvl72",
    "mi300x": "mi300x-platform",
}


def _load(filename: str, cls: type[T]) -> dict[str, T]:
    text = resources.files("madmax_opt").joinpath("data").joinpath(filename).read_text()
    raw: dict[str, dict[str, Any]] = yaml.safe_load(text)
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
    return out


@cache
def models() -> dict[str, TransformerModel]:
    return _load("models.yaml", TransformerModel)


def lookup(kind: str, name: str, *, file: str | None, field: str) -> Any:
    loaders: dict[str, Any] = {"gpu": gpus, "system": systems, "model": models}
    table: dict[str, Any] = loaders[kind]()
    if name not in table:
        allowed = ", ".join(sorted(table))
        raise ProblemError(f"unknown {kind} {name!r}; allowed: {allowed}", file=file, field=field)
    return table[name]


def standard_system(gpu: str, *, file: str | None, field: str) -> System:
    lookup("gpu", gpu, file=file, field=field)
    system: System = lookup("system", STANDARD_SYSTEM[gpu], file=file, field=field)
    return system
