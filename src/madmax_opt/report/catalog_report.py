"""``madmax-opt catalog``: the built-in GPUs, systems and models as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog

TABLES: dict[str, Callable[[], dict[str, Any]]] = {
    "gpus": catalog.gpus, "systems": catalog.systems, "models": catalog.models
}


def print_catalog(kind: str, json_out: bool, console: Console) -> None:
    """One catalog (gpus, systems or models) with its key numbers; names are never truncated."""
    if kind not in TABLES:
        raise ProblemError(f"unknown catalog {kind!r}; allowed: {', '.join(TABLES)}", field="KIND")
    entries = TABLES[kind]()
    if json_out:
        print(json.dumps({k: v.model_dump() for k, v in entries.items()}, indent=2))
        return
    t = Table(title=f"{kind} ({len(entries)})", header_style="bold")
    if kind == "gpus":
        for c in ("name", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "TDP W", "gemm_eff"):
            t.add_column(c)
        for g in entries.values():
            t.add_row(g.name, f"{g.peak_flops.get('bf16', 0) / 1e12:,.0f}", f"{g.hbm_bytes / 1e9:.0f}",
                      f"{g.hbm_bw / 1e12:.2f}", f"{g.tdp_w:.0f}", f"{g.calibration.gemm_eff:.2f}")
    elif kind == "systems":
        for c in ("name", "gpu", "per node", "tiers (size: GB/s per GPU)", "$/GPU-h"):
            t.add_column(c)
        for s in entries.values():
            tiers = ", ".join(f"{x.name} {x.size or 'all'}: {x.bw / 1e9:.3g}" for x in s.tiers)
            t.add_row(s.name, s.gpu, str(s.gpus_per_node), tiers, f"{s.price_per_gpu_hour:.2f}")
    else:
        for c in ("name", "layers", "hidden", "heads/kv", "ffn", "vocab", "dtype"):
            t.add_column(c)
        for m in entries.values():  # a ViT has no vocabulary: '-' there marks the family
            t.add_row(m.name, str(m.layers), str(m.hidden), f"{m.heads}/{m.n_kv_heads}", f"{m.ffn} {m.ffn_kind}",
                      str(m.vocab) if m.family == "llm" else "- (vit)", m.native_precision or "-")
        hub = Table(title="Hugging Face checkpoints (hf_id)", header_style="bold")
        hub.add_column("name", no_wrap=True)
        hub.add_column("repository", overflow="fold")
        for m in entries.values():
            if m.hf_id:
                hub.add_row(m.name, m.hf_id)
    for col in t.columns:  # at 80 columns text folds onto the next line rather than ending in '…'
        col.overflow = "fold"
    t.columns[0].no_wrap = True  # names are what users copy into problem files: never truncated
    t.columns[0].min_width = max(len(name) for name in entries)
    if kind == "systems":  # the GPU name too is copied into problem files
        t.columns[1].no_wrap, t.columns[1].min_width = True, max(len(s.gpu) for s in entries.values())
    console.print(t)
    if kind == "models":
        console.print(hub)
