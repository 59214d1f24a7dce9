"""Physical invariants of the serving model (owned by the serving model's authors; written here as property checks):
a GPU at least as good on every datasheet figure serves no worse, and decode never beats its HBM floor."""

from __future__ import annotations

from typing import Any

import pytest

from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.result import solve_result

TASK = {"kind": "inference", "prompt_len": 1024, "output_len": 256, "precision": "bf16", "tpot_s": 0.05}
BYTES_BF16 = 2.0


def best(gpu: str, model: str = "llama3-70b", **task: Any) -> dict[str, Any]:
    p = problem_from_dict({"model": model, "hardware": {"gpu": gpu, "gpus": [8]}, "task": {**TASK, **task},
                           "objective": "throughput"})
    out: dict[str, Any] = solve_result(p, top_k=3, time_limit=30, workers=1)
    return out


@pytest.mark.parametrize(("model", "precision"), [("llama3-70b", "bf16"), ("llama2-70b", "fp8")])
def test_h200_serves_no_worse_than_h100(model: str, precision: str) -> None:
    """The issue's example: the same serving problem carried fewer requests per second on 8x H200 than on 8x H100."""
    h200, h100 = best("h200-sxm", model, precision=precision), best("h100-sxm", model, precision=precision)
    assert h200["best"]["output_tokens_per_s"] >= h100["best"]["output_tokens_per_s"]


def test_decode_never_beats_reading_the_weights_once_per_token() -> None:
    """TPOT >= weight bytes per tensor-parallel rank / HBM bandwidth: every decode step reads each stage's weights,
    and the stages of a pipeline run one after another for a token."""
    out = best("h100-sxm")
    params = 70.6e9  # Llama-3 70B (Meta model card: 70.6 B parameters)
    bw = catalog.gpus()["h100-sxm"].hbm_bw
    for rec in out["top"]:
        floor_s = params * BYTES_BF16 / rec["plan"]["tp"] / bw
        assert rec["tpot_s"] >= floor_s, (rec["plan"], rec["tpot_s"], floor_s)
