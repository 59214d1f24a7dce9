"""Typed recommender records: the shape of the JSON objects of ``evaluate --json`` and ``solve --json`` for a DLRM
problem (``best``, ``baseline``, per-option results), as analysis/records.py types the training ones.

They are ``TypedDict`` s: a record is still the plain dict that ``json.dumps`` writes, while mypy checks every key
search/dlrm_search.py writes and report/dlrm_report.py reads.
"""

from __future__ import annotations

from typing import TypedDict

from typing_extensions import NotRequired

from madmax_opt.analysis.records import HardwareRef, TimeToTrain
from madmax_opt.model.dlrm_embedding import ShardEntryJSON


class DensePlanJSON(TypedDict):
    """The dense part of the plan (model/dlrm_spec.DensePlan.model_dump())."""

    strategy: str  # ddp, fsdp or tp
    tp: int
    ep: int


class DLRMPlanJSON(TypedDict):
    """The plan as a plan file gives it back: where it runs, the dense plan and every table's shards."""

    system: str
    gpus: int
    dense: DensePlanJSON
    placement: list[ShardEntryJSON]  # model/dlrm_embedding.compact_placement


class EmbeddingTimesJSON(TypedDict):
    """The embedding part of the step (model/dlrm_embedding.EmbeddingTimes), seconds."""

    lookup_fwd_s: float
    lookup_bwd_s: float
    input_all_to_all_s: float
    output_all_to_all_s: float
    dp_allreduce_s: float
    placement_objective_s: float  # what the placement search minimises
    per_collective_s: dict[str, float]  # the non-zero collectives
    tables_by_sharding: dict[str, float]  # tables per sharding (a column shard counts 1 / split)


class DLRMMemoryJSON(TypedDict):
    """Memory of the busiest GPU, bytes."""

    embedding_max: float
    dense: dict[str, float]  # the dense plan's memory terms
    total: float
    capacity: float


class PlacementSolverJSON(TypedDict):
    """How the placement of the best plan was found (search/placement.PlacementResult)."""

    status: str  # optimal | feasible
    proved_by: str  # cp-sat, or bound (the averaging lower bound met greedy: no CP-SAT model built)
    objective_s: float
    bound_s: float
    gap: float
    wall_s: float
    variables: int  # of the CP-SAT model (counted without building it where the bound proved the plan)
    greedy_objective_s: float | None
    gain_vs_greedy: float | None


class DLRMRecord(TypedDict):
    """One recommender plan, evaluated exactly (floats)."""

    plan: DLRMPlanJSON
    hardware: HardwareRef
    feasible: bool
    infeasible_reason: str | None
    step_time_s: float
    samples_per_s: float
    cost_per_hour_usd: float
    usd_per_million_samples: float
    exposed_a2a_share: float  # exposed all-to-all time / step time
    time_breakdown_s: dict[str, float]
    overlapped_comm_s: dict[str, float]
    embedding: EmbeddingTimesJSON
    memory_bytes_per_gpu: DLRMMemoryJSON
    dense_mfu: float
    time_to_train: NotRequired[TimeToTrain]  # task.train_samples at the plan's throughput
    placement_solver: NotRequired[PlacementSolverJSON]  # solve: the best plan's placement search


class DLRMOptionJSON(TypedDict):
    """One hardware option of ``solve --json``: its best plan's step time, or why it has none."""

    hardware: str
    feasible: bool
    reason: str | None
    step_time_s: float | None
    samples_per_s: float | None
    # optimal | feasible (a placement not proven optimal) | infeasible | pruned (placement not proven: the option's
    # floor is above the best plan, so its best plan is a feasible one, its optimum between floor and step time)
    status: str
    step_time_floor_s: float | None  # pruned: a lower bound on its step time (search/dlrm_bound.py)


class DLRMSolveResult(TypedDict):
    """``madmax-opt solve --json`` of a recommender problem."""

    status: str
    model: str
    objective: str
    best: DLRMRecord
    options: list[DLRMOptionJSON]
    baseline: DLRMRecord | None
    speedup_vs_baseline: float | None


__all__ = ["DLRMMemoryJSON", "DLRMOptionJSON", "DLRMPlanJSON", "DLRMRecord", "DLRMSolveResult", "DensePlanJSON",
           "EmbeddingTimesJSON", "PlacementSolverJSON"]
