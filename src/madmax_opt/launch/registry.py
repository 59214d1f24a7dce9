"""The launch formats, registered once: each is a flag file ``data/flags/<format>.yaml`` naming the format, its
kind (training or serving), the module that defines its :class:`~madmax_opt.launch.common.Format` and its place in
listings. A new format is its module and its flag file; emit, the CLI's help and its allowed names read them here.

Light to import and read (the four top-level keys only; flagsets.py validates whole files), so the CLI lists the formats without loading the emitters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from madmax_opt.core.errors import InternalError, ProblemError


@dataclass(frozen=True)
class Registered:
    name: str
    kind: Literal["training", "serving"]
    module: str
    listed: int


@cache
def flag_files() -> dict[str, str]:
    """File name -> text of every flag file (package data; read once, not again for each format's flagset)."""
    folder = resources.files("madmax_opt").joinpath("data/flags")
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.name.endswith(".yaml")}


@cache
def registered() -> dict[str, Registered]:
    """Format name -> its registration, in listing order."""
    entries = []
    for text in flag_files().values():
        if re.search(r"^format:", text, re.M):  # a format's flag file (not the start-up rules or positions)
            d = {k: re.search(rf"^{k}: *(\S+)", text, re.M) for k in ("format", "kind", "module", "listed")}
            name, kind, module, listed = (m.group(1) if m else "" for m in d.values())
            if kind not in ("training", "serving"):
                raise InternalError(f"data/flags: format {name} has kind {kind!r}; allowed: training, serving")
            entries.append(Registered(name, "training" if kind == "training" else "serving", module, int(listed)))
    return {e.name: e for e in sorted(entries, key=lambda e: (e.listed, e.name))}


def format_names(kind: str | None = None) -> list[str]:
    return [name for name, e in registered().items() if kind is None or e.kind == kind]


def check_format(fmt: str) -> Registered:
    """The registration of ``fmt``, or the one-line error listing the allowed names (exit 2)."""
    if fmt not in registered():
        raise ProblemError(f"unknown format {fmt!r}; allowed: {', '.join(registered())}", field="FORMAT")
    return registered()[fmt]


def formats_help() -> str:
    """``megatron, nemo, ... (training); vllm, ... (serving)``: the formats by kind, for help texts."""
    return "; ".join(f"{', '.join(format_names(kind))} ({kind})" for kind in ("training", "serving")
                     if format_names(kind))
