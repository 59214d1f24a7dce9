"""KV-cache precision of the InferenceX launches (studies/inferencex.KV_PRECISION): SGLang on Hopper keeps the
checkpoint's BF16 KV cache, every other launch the serving model's default (FP8 for FP8 / FP4 weights)."""

from __future__ import annotations

from typing import Any

import pytest

from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.serving_calibration import ServingParams
from madmax_opt.studies.inferencex import prepare, raw_rows, to_point


def _first(**match: Any) -> dict[str, Any]:
    return next(r for r in raw_rows() if all(r.get(k) == v for k, v in match.items()))


@pytest.mark.parametrize(
    ("gpu", "framework_key", "kv"),
    [("h200", "sglang", "bf16"), ("h100", "dynamo-sglang", "bf16"), ("b200", "sglang", None),
     ("h200", "trt", None), ("mi355x", "sglang", None)],
)
def test_kv_precision_follows_the_launch(gpu: str, framework_key: str, kv: str | None) -> None:
    p = to_point(_first(gpu=gpu, framework_key=framework_key, model_key="dsr1"))
    engines = [e for e in (p.decode, p.prefill) if e is not None]
    assert engines and all(e.data["task"].get("kv_precision") == kv for e in engines)


def test_bf16_kv_halves_the_sequences_the_decode_pool_holds() -> None:
    row = _first(key="dsr1-h100-dynamo-sglang-fp8-mtp-disagg-8192x1024-c128-p1x16-d1x16")
    bf16 = prepare(to_point(row))
    fp8 = prepare(to_point({**row, "gpu": "h100", "framework_key": "dynamo-trt"}))  # same plan, FP8 KV
    assert not isinstance(bf16, str) and not isinstance(fp8, str)
    prior = ServingParams(**serving_catalog().prior.model_dump())
    held_bf16 = float(bf16.decode.terms([prior]).max_batch[0])
    held_fp8 = float(fp8.decode.terms([prior]).max_batch[0])
    # the weights and activations are the same: the KV pool holds about half the sequences at 2 bytes per value
    assert 0.45 * held_fp8 <= held_bf16 <= 0.55 * held_fp8
