"""Hypothesis strategies shared by the property tests (imported as a plain module: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

SYSTEMS = ["dgx-a100", "dgx-h100", "dgx-v100", "cloud-b-nc24rs-v3", "gb200-nvl72", "mi300x-platform", "dc-a"]


@st.composite
def small_models(draw: Any, layers: Sequence[int]) -> dict[str, Any]:
    """A small inline dense LLM: MHA or GQA, GELU or SwiGLU, head_dim 64 or 128."""
    heads = draw(st.sampled_from([8, 16, 32]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    return {
        "layers": draw(st.sampled_from(list(layers))),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": draw(st.sampled_from([heads, max(heads // 4, 1)])),
        "ffn": draw(st.sampled_from([2, 4])) * hidden,
        "ffn_kind": draw(st.sampled_from(["gelu", "swiglu"])),
        "vocab": draw(st.sampled_from([32000, 51200])),
    }


@st.composite
def small_hardware(draw: Any, max_systems: int) -> list[dict[str, Any]]:
    """1..max_systems catalog systems, each at one or a few small cluster sizes."""
    return [
        {"system": s, "gpus": draw(st.sampled_from([[4], [8], [16], [8, 32], [2, 4, 16]]))}
        for s in draw(st.lists(st.sampled_from(SYSTEMS), min_size=1, max_size=max_systems, unique=True))
    ]
