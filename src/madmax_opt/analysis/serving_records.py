"""Typed serving records: one steady-state serving plan, evaluated (``evaluate --json`` and ``best`` / ``top`` /
``pareto`` / ``baseline`` of ``solve --json`` for inference problems).

The search layer builds them (search/serving.py ``serving_records``); reports read their attributes, so a field a
report needs that the record lacks fails at type-check time; JSON output is :meth:`ServingRecord.to_json`, which
writes the keys, their order and their values exactly as the plain dicts did before the records were typed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServingPlanRecord(_Record):
    """The serving plan as the record shows it (the ServingPlan keys, every one resolved). Declared here, not derived
    from search/serving_space.ServingPlan: analysis sits below search, and the fields must be static for type checks;
    tests/test_serving_records.py pins them to ``serving_knobs()`` (ServingPlan's settings, in order)."""

    dp: int = Field(description="decode replicas (data parallel)")
    tp: int = Field(description="tensor-parallel degree per replica")
    pp: int = Field(description="pipeline-parallel degree per replica")
    ep: int = Field(description="expert-parallel degree (1: dense or experts replicated)")
    batch: int = Field(description="offered concurrent sequences per replica")
    max_num_seqs: int | None = Field(description="scheduler cap on running sequences; None: the framework default")
    precision: str = Field(description="weight / compute precision (model/inference.PRECISIONS)")
    prefill_replicas: int = Field(description="dedicated prefill replicas (0: prefill and decode co-located)")
    system: str = Field(description="catalog system the plan runs on")


class ServingHardwareRecord(_Record):
    """Where a serving plan runs."""

    system: str = Field(description="catalog system name")
    gpu: str = Field(description="GPU catalog key")
    gpus: int = Field(description="GPUs of the deployment")


class ServingInterval(_Record):
    """The calibration level's interval on the record's predictions (model/serving_calibration.record_interval):
    each list is [low, high] of the record field of the same name; absent when the level has no such factor."""

    coverage: float = Field(description="probability that the measured value lies in the interval")
    level: str = Field(description="calibration level whose held-out residuals gave the factors")
    tpot_s: list[float] | None = Field(default=None, description="[low, high] time per output token (s)")
    output_tokens_per_s: list[float] | None = Field(default=None, description="[low, high] output tokens/s")
    output_tokens_per_s_per_gpu: list[float] | None = Field(
        default=None, description="[low, high] output tokens/s per GPU")


class ServingRecord(_Record):
    """One steady-state serving plan, evaluated by the serving model (model/inference.py)."""

    plan: ServingPlanRecord = Field(description="the plan, every setting resolved")
    hardware: ServingHardwareRecord = Field(description="system, GPU type and GPU count")
    feasible: bool = Field(description="valid, fits in memory and meets the task's latency and throughput targets")
    infeasible_reason: str | None = Field(description="what the plan violates; None when feasible")
    ttft_s: float = Field(description="time to first token (s), queue wait included")
    tpot_s: float = Field(description="time per output token (s): one decode step")
    output_tokens_per_s: float = Field(description="output tokens/s of the deployment")
    output_tokens_per_s_per_gpu: float = Field(description="output tokens/s divided by the GPUs")
    kv_precision: str = Field(description="KV-cache precision (the task's, else the default for the precision)")
    max_batch: int = Field(description="sequences per replica that the KV cache holds")
    running_batch: int = Field(description="sequences running per replica (offered batch capped by memory/cap)")
    queue_wait_s: float = Field(description="queue wait in the TTFT (s)")
    framework: str = Field(description="serving framework the plan is priced for")
    calibration: dict[str, Any] = Field(
        description="what priced it: CalibrationRecord fields plus level (and interval factors), per option")
    kv_cache_bytes_per_gpu: float = Field(description="KV-cache bytes per GPU")
    decode_step_s: float = Field(description="one decode step (s)")
    prefill_s: float = Field(description="prefill of one prompt (s)")
    cost_per_hour_usd: float = Field(description="deployment price ($/h)")
    usd_per_million_tokens: float = Field(description="$ per million output tokens")
    memory_bytes_per_gpu: dict[str, float] = Field(description="memory terms per GPU (bytes), total and capacity")
    tpot_breakdown_s: dict[str, float] = Field(description="TPOT by step term (model/inference.STEP_TERMS), s")
    interval: ServingInterval | None = Field(default=None, description="calibration interval; None: no factors")
    meets_targets: bool | None = Field(
        default=None, description="Pareto rows only: whether the plan meets the latency/throughput targets")

    def to_json(self) -> dict[str, Any]:
        """The JSON object: every field in declaration order; ``interval`` and ``meets_targets`` only when set,
        the interval's bounds only where the level has them."""
        out = self.model_dump(exclude={"interval", "meets_targets"})
        if self.interval is not None:
            out["interval"] = self.interval.model_dump(exclude_none=True)
        if self.meets_targets is not None:
            out["meets_targets"] = self.meets_targets
        return out
