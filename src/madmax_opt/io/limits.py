"""Upper bounds on every size a problem, plan or sweep file may give, checked before anything is built from it.

Each bound sits about 100x beyond the largest system or model of 2025-26 (the "today" column), so a user never
meets one by accident, while a typo (``layers: 1000000000``) or a fuzzer's value gets a one-line error instead of
an hour-long loop, a memory error or an integer overflow. docs/limits.md tabulates :func:`bounds` (a test keeps the
two equal).
Booleans are not counts (``gpus: true`` is a type error, not one GPU) and every float must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from madmax_opt.core.errors import ProblemError


@dataclass(frozen=True)
class Bound:
    """The largest value a field may take, and the largest value in use today that it is sized against."""

    limit: float
    today: str


_GPUS = Bound(20_000_000, "~200,000 GPUs in one cluster (xAI Colossus, 2025)")
_LAYERS = Bound(20_000, "126 layers (Llama-3.1-405B)")
_HIDDEN = Bound(2_000_000, "18,432 (PaLM-540B)")
_HEADS = Bound(20_000, "128 query heads (Llama-3.1-405B)")
_FFN = Bound(10_000_000, "73,728 (PaLM-540B)")
_EXPERTS = Bound(50_000, "384 experts (Kimi K2)")
_TOKENS = Bound(100_000_000, "1-10 M tokens of context")
_BATCH = Bound(100_000_000, "~16 k sequences (LLM) or 256 k samples (DLRM) per step")

_FIXED_BOUNDS: dict[str, Bound] = {
    # cluster sizes (problem, plan and sweep files); the parallel degrees join them in bounds()
    "gpus": _GPUS, "max_gpus": _GPUS, "supply": _GPUS, "start": _GPUS, "stop": _GPUS, "step": _GPUS,
    "size": _GPUS, "gpus_per_node": _GPUS, "node": _GPUS,
    "vpp": _LAYERS,
    # transformer shapes
    "layers": _LAYERS, "frozen_layers": _LAYERS, "stage_layers": _LAYERS,
    "hidden": _HIDDEN, "lora_rank": _HIDDEN, "kv_lora_rank": _HIDDEN, "q_lora_rank": _HIDDEN, "qk_nope_head_dim": _HIDDEN,
    "qk_rope_head_dim": _HIDDEN, "v_head_dim": _HIDDEN, "width": _HIDDEN,
    "heads": _HEADS, "kv_heads": _HEADS,
    "ffn": _FFN, "expert_ffn": _FFN,
    "vocab": Bound(50_000_000, "256,000 tokens (Gemma)"),
    "num_experts": _EXPERTS, "experts": _EXPERTS, "top_k": _EXPERTS, "shared_experts": _EXPERTS,
    "image_size": Bound(1_000_000, "~4,096 pixels"), "patch_size": Bound(1_000_000, "14-16 pixels"),
    "channels": Bound(10_000, "3 (RGB)"),
    # tasks
    "seq_len": _TOKENS, "prompt_len": _TOKENS, "output_len": _TOKENS,
    "global_batch": _BATCH, "mbs": _BATCH, "batch": _BATCH,
    "train_tokens": Bound(1e17, "3.6e13 tokens (Qwen3 pre-training)"),
    "train_samples": Bound(1e16, "~1e11 samples (production DLRM)"),
    # recommenders
    "count": Bound(500_000, "4,096 identical tables (DLRM-A)"),
    "rows": Bound(100_000_000_000, "7.3e8 rows per table (DLRM-F)"),
    "dim": Bound(100_000, "256 (DLRM-F)"),
    "dense_features": Bound(1_000_000, "~1,000 dense features"),
    "compressed_features": Bound(500_000, "a few hundred features"),
    "column_splits": Bound(100_000, "2-8 column shards"),
}



@cache
def bounds() -> dict[str, Bound]:
    """Every bounded field name and its bound: the fixed ones above plus each parallel degree of the plan-settings
    registry, bounded like a GPU count (it sizes a process group). Read when the first file is checked, so that
    starting the command line loads no plan model (tests/test_layers.py)."""
    from madmax_opt.model.plan_settings import PARALLEL_DEGREES  # a plan field marked ProcessGroup

    return {**_FIXED_BOUNDS, **dict.fromkeys(PARALLEL_DEGREES, _GPUS)}


# DLRM table placement builds one CP-SAT variable per (table group, sharding, GPU): 16,384 GPUs solve in ~50 s on
# 2 cores (4,096 in ~25 s), so recommenders are bounded at 16x today's largest run (1,024 ZionEX GPUs, Mudigere et
# al. 2022) rather than 100x
MAX_DLRM_GPUS = 16_384
MAX_INT = 10**18  # any other integer: int64-safe with room for products of two such values
MAX_CLUSTER_SIZES = 1_024  # cluster sizes one `gpus` field may stand for (a list or a range)
MAX_LIST = 100_000  # items of any other list (plans in a plan file, table groups, ...)
MAX_DEPTH = 64  # nesting depth of mappings and lists in a YAML/JSON file
MAX_FILE_BYTES = 16 * 2**20  # size of any input file: problem, plan, hf_config, overlay, runs, sweep, fleet
MAX_RESULTS_BYTES = 2**30  # a sweep's results.jsonl: ~6 KB a row, so ~170,000 rows > MAX_SWEEP_PROBLEMS
MAX_TOP_K = 1_000  # plans `solve --top-k` returns: each is a re-solve with the earlier ones cut (1e8 ran for minutes)
MAX_SHOWN_CHARS = 200  # characters of an input value an error message repeats (a 2 MB string stays one short line)


def check_input(data: Any, *, file: str | None, prefix: str = "") -> None:
    """Raise a one-line ProblemError for the first size beyond its bound, non-finite number, too long list or too
    deep nesting in a parsed file (before pydantic sees it, so no validator loops over it)."""
    for path, key, value in _leaves(data, prefix, file=file):
        field = path or None
        bound = bounds().get(key) if key is not None else None
        if isinstance(value, bool):
            continue
        number = _number(value) if bound is not None else value
        if isinstance(number, float) and not math.isfinite(number):
            raise ProblemError(f"not a finite number (got {value!r}); allowed: a finite number", file=file,
                               field=field)
        if isinstance(number, int | float) and not isinstance(number, bool):
            limit = bound.limit if bound is not None else MAX_INT
            if abs(number) > limit:
                what = _allowed(key, bound) if bound is not None else f"integers of magnitude <= {MAX_INT:.0e}"
                raise ProblemError(f"{_shown(number)} is beyond the supported range; allowed: {what}", file=file,
                                   field=field)


def check_booleans(data: Any, flags: frozenset[str], *, file: str | None, prefix: str = "") -> None:
    """After pydantic accepted ``data``: a true/false anywhere but in the fields named in ``flags`` was read as a
    number (``gpus: true`` as 1 GPU, ``ttft_s: true`` as 1 s); refuse it instead."""
    for path, key, value in _leaves(data, prefix, file=file, check_lists=False):
        name = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if isinstance(value, bool) and name not in flags:
            bound = bounds().get(key) if key is not None else None
            allowed = _allowed(key, bound) if bound is not None else "a number, not true/false"
            raise ProblemError(f"wrong type (got {str(value).lower()}); allowed: {allowed}", file=file,
                               field=path or None)


def check_finite(values: Any, *, file: str | None, prefix: str = "") -> None:
    """Raise for the first non-finite float in a validated record's ``model_dump()`` (strings such as 'inf'
    become floats only inside pydantic, so this runs after validation too)."""
    for path, _, value in _leaves(values, prefix, file=file, check_lists=False):
        if isinstance(value, float) and not math.isfinite(value):
            raise ProblemError(f"not a finite number (got {value}); allowed: a finite number", file=file,
                               field=path or None)


def _allowed(key: str | None, bound: Bound) -> str:
    kind = "a number" if isinstance(bound.limit, float) else "an integer"
    return f"{kind} up to {_shown(bound.limit)} (today's largest: {bound.today})"


def _shown(x: float) -> str:
    """1,024 / 1e+17 / 'an integer of 5,000 digits' (Python will not print more than 4,300 digits)."""
    if isinstance(x, int) and x.bit_length() > 100:
        return f"an integer of about {x.bit_length() * math.log10(2):,.0f} digits"
    return f"{x:,}" if isinstance(x, int) or (abs(x) < 1e15 and float(x).is_integer()) else f"{x:.3g}"


def _number(value: Any) -> Any:
    """A numeric string as pydantic's lax mode would read it ('8' -> 8, '1e30' -> 1e30); anything else as is."""
    if not isinstance(value, str):
        return value
    text = value.strip().replace("_", "")
    for kind in (int, float):
        try:
            return kind(text)
        except (ValueError, OverflowError):
            continue
    return value


def _leaves(
    data: Any, prefix: str, *, file: str | None, check_lists: bool = True
) -> Iterator[tuple[str, str | None, Any]]:
    """(field path, nearest bounded key, value) of every scalar, depth-first, without recursion."""
    stack: list[tuple[Any, str, str | None, int]] = [(data, prefix, None, 0)]
    seen: set[int] = set()  # YAML aliases share one object: visit it once (a "billion laughs" file stays linear)
    while stack:
        node, path, key, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if id(node) in seen:
                continue
            seen.add(id(node))
        if depth > MAX_DEPTH:
            raise ProblemError(f"nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}", file=file,
                               field=path or None)
        if isinstance(node, dict):
            for k, v in reversed(list(node.items())):
                name = str(k)
                stack.append((v, f"{path}.{name}" if path else name, name if name in bounds() else None, depth + 1))
        elif isinstance(node, list | tuple):
            limit = MAX_CLUSTER_SIZES if key == "gpus" and depth > 0 else MAX_LIST
            if check_lists and len(node) > limit:
                what = "cluster sizes" if limit == MAX_CLUSTER_SIZES else "items"
                raise ProblemError(f"a list of {len(node):,} items; allowed: at most {limit:,} {what}", file=file,
                                   field=path or None)
            for i in reversed(range(len(node))):
                stack.append((node[i], f"{path}[{i}]", key, depth + 1))
        else:
            yield path, key, node

