"""Shared fixtures: a toy GPU and system with round numbers, so that cost terms can be computed by hand.

The toy GPU reaches exactly ``gemm_eff`` of peak for every GEMM (``gemm_half_dim`` = 0 switches the shape
dependence off), so a GEMM of F FLOPs takes F / (1e15 * 0.5) s. The toy system has 8 GPUs per node on a
100 GB/s effective scale-up tier (200e9 x 0.5) and a 20 GB/s effective scale-out tier (25e9 x 0.8).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from madmax_opt.io.calibration import with_record
from madmax_opt.model.collectives import Tiers
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import (
    GPU,
    Calibration,
    Constraints,
    Space,
    Stack,
    System,
    Task,
    Tier,
    TransformerModel,
)

GC_THRESHOLD = gc.get_threshold()  # the interpreter's, before any test ran cli.main()


@pytest.fixture(autouse=True)
def _process_gc_threshold() -> Iterator[None]:
    """cli.main() raises the garbage collector's young threshold for the rest of its process (cli/main.py); tests
    (and module-scoped fixtures) that call it in process would leave the worker there, so every test ends with the
    interpreter's threshold back (a raised threshold over a test worker's large heap made the evaluator's timing test
    2.7-5x slower per plan)."""
    yield
    gc.set_threshold(*GC_THRESHOLD)


TOY_PEAK_FLOPS = 1.0e15
TOY_GEMM_EFF = 0.5
TOY_ATTN_EFF = 0.25
TOY_HBM_BW = 2.0e12
TOY_HBM_EFF = 0.5
TOY_HBM_BYTES = 80.0 * 2**30
TOY_NODE = 8
TOY_NVLINK_BW, TOY_NVLINK_EFF, TOY_NVLINK_LAT = 200.0e9, 0.5, 10.0e-6
TOY_NET_BW, TOY_NET_EFF, TOY_NET_LAT = 25.0e9, 0.8, 20.0e-6
TOY_PRICE = 2.0

ProblemFactory = Callable[..., Problem]


def toy_gpu(**calibration: Any) -> GPU:
    cal = {"gemm_eff": TOY_GEMM_EFF, "gemm_half_dim": 0.0, "attn_eff": TOY_ATTN_EFF, "hbm_eff": TOY_HBM_EFF,
           "layer_overhead_s": 0.0, "source": "test"} | calibration
    return GPU(
        name="toy-gpu",
        peak_flops={"bf16": TOY_PEAK_FLOPS},
        hbm_bytes=TOY_HBM_BYTES,
        hbm_bw=TOY_HBM_BW,
        tdp_w=700.0,
        calibration=Calibration(**cal),
        platform="cuda",
        source="test",
    )


def toy_system(tiers: list[Tier] | None = None) -> System:
    return System(
        name="toy-system",
        gpu="toy-gpu",
        gpus_per_node=TOY_NODE,
        tiers=tiers
        or [
            Tier(name="nvl", size=TOY_NODE, bw=TOY_NVLINK_BW, latency_s=TOY_NVLINK_LAT, efficiency=TOY_NVLINK_EFF),
            Tier(name="net", size=None, bw=TOY_NET_BW, latency_s=TOY_NET_LAT, efficiency=TOY_NET_EFF),
        ],
        price_per_gpu_hour=TOY_PRICE,
        power_w_per_gpu=1000.0,
        source="test",
    )


def toy_model(**fields: Any) -> TransformerModel:
    """A small GPT (MHA, GELU, f = 4h, untied head, no biases) unless ``fields`` say otherwise."""
    base: dict[str, Any] = {"name": "toy", "layers": 8, "hidden": 1024, "heads": 8, "ffn": 4096,
                            "ffn_kind": "gelu", "vocab": 1000, "norm": "layernorm", "bias": False}
    return TransformerModel(**(base | fields))


@pytest.fixture
def make_problem() -> ProblemFactory:
    """Build a resolved Problem directly (the toy GPU is not in the catalog, so no YAML round trip)."""

    def build(
        model: TransformerModel | None = None,
        *,
        gpus: int | list[int] = 8,
        system: System | None = None,
        gpu: GPU | None = None,
        **task_and_stack: Any,
    ) -> Problem:
        task_fields = {k: v for k, v in task_and_stack.items() if k in Task.model_fields}
        stack_fields = {k: v for k, v in task_and_stack.items() if k in Stack.model_fields}
        unknown = set(task_and_stack) - set(task_fields) - set(stack_fields)
        assert not unknown, f"not a Task or Stack field: {unknown}"
        task = Task(**({"seq_len": 1024, "global_batch": 16} | task_fields))
        sys_ = system or toy_system()
        g = gpu or toy_gpu()
        sizes = [gpus] if isinstance(gpus, int) else gpus
        stack = Stack(**stack_fields)
        return Problem(
            model=model or toy_model(),
            task=task,
            stack=stack,
            hardware=tuple(with_record(HardwareOption(sys_, g, n), stack.framework) for n in sizes),
            space=Space(),
            objective="throughput",
            constraints=Constraints(),
            baseline=None,
        )

    return build


@pytest.fixture
def toy_tiers() -> Tiers:
    """The toy system's two tiers for one plan: effective bandwidths 100e9 and 20e9 bytes/s."""
    return Tiers(
        size=np.array([[float(TOY_NODE)], [np.inf]]),
        bw=np.array([[TOY_NVLINK_BW * TOY_NVLINK_EFF], [TOY_NET_BW * TOY_NET_EFF]]),
        latency_s=np.array([[TOY_NVLINK_LAT], [TOY_NET_LAT]]),
    )
