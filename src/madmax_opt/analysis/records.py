"""Typed records: the shape of the JSON objects that the evaluator produces and every report reads.

They are ``TypedDict`` s, so a record is still the plain dict that ``json.dumps`` writes (the JSON keys users rely
on stay as they are, at no cost per plan), while mypy checks every key a report reads or writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from typing_extensions import NotRequired


class HardwareRef(TypedDict):
    """Where a plan runs: catalog system (``a+b`` for a mixed pipeline), GPU type(s) and GPU count."""

    system: str
    gpu: str
    gpus: int
    gpus_by_type: NotRequired[dict[str, int]]  # mixed pipelines: GPUs of each type


class TimeToTrain(TypedDict):
    """``task.train_tokens`` (or samples) at the plan's throughput."""

    hours: float
    gpu_hours: float
    cost_usd: float
    energy_mwh: NotRequired[float]


class PredictionInterval(TypedDict):
    """An interval of ``coverage`` on a record's predictions, from the calibration residuals of the level that
    priced it (core/intervals.py): each key names a field of the record, its value the [low, high] bounds."""

    coverage: float
    level: str  # the calibration level whose residuals gave it
    step_time_s: NotRequired[list[float]]
    tokens_per_s: NotRequired[list[float]]


class TrainingRecord(TypedDict):
    """One training plan, evaluated (``madmax-opt evaluate --json``; ``best`` and ``top`` of ``solve --json``)."""

    plan: dict[str, Any]  # Plan.model_dump(): the keys are the plan-settings registry's
    hardware: HardwareRef
    calibration: dict[str, Any]  # CalibrationRecord.model_dump(): how much to trust the number
    feasible: bool
    infeasible_reason: str | None
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float  # model FLOPs (as the task runs them: model/workload.py) / (step time x GPUs x peak)
    hfu: float  # the same with the recomputed forward FLOPs counted (executed FLOPs)
    model_flops_per_step: float
    cost_per_hour_usd: float
    usd_per_million_tokens: float
    memory_bytes_per_gpu: dict[str, float]  # memory terms, "total" and "capacity"
    time_breakdown_s: dict[str, float]  # STEP_TERMS
    overlapped_comm_s: dict[str, float]
    bottleneck_shares: dict[str, float]  # attribution.CATEGORIES, summing to 1
    time_to_train: NotRequired[TimeToTrain]
    interval: NotRequired[PredictionInterval]  # 80 % interval on step time and throughput (calibration residuals)
    simulated_step_time_s: NotRequired[float]  # solve --rerank


class TrainingSolveResult(TypedDict):
    """``madmax-opt solve --json`` of a training problem."""

    status: str
    objective: str
    best: TrainingRecord
    top: list[TrainingRecord]
    solver: dict[str, Any]  # search/assemble.solver_summary
    baseline: TrainingRecord | None
    speedup_vs_baseline: float | None
    rerank: NotRequired[dict[str, Any]]


# A record of any family, read-only: training records are typed; serving and recommender records are plain dicts
Record = Mapping[str, Any]
