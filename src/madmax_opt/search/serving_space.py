"""Serving plans and their candidates: the plan record, the prepared model, enumeration and the integer columns.

Same design as ``solver`` (docs/reference/solver-notes.md, "enumerate, then assemble"): the vectorised model
(``inference.inference_terms``) evaluates every candidate (tp, pp, dp replicas, batch, precision, prefill split,
GPU type and count), each metric is rounded once to an integer (ns of GPU time per output token, micro-dollars
per million tokens, us of TTFT/TPOT, tokens/s, cents/hour), and CP-SAT picks one candidate (``add_exactly_one``)
under the linear constraints (latency targets, minimum throughput, GPU count, supply per GPU type, $/hour).
Within one hardware option every remaining constraint is monotone in the objective, so only the ``k`` best
admissible candidates of each option can be in the top-k (exact pruning, as in ``solver.solve``). The search itself,
records and explanations are in ``search.serving``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from madmax_opt.core.errors import ProblemError
from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.core.units import NS, US
from madmax_opt.model.hardware import HardwareOption, HardwareTable
from madmax_opt.model.inference import (
    GEMM_PRECISION,
    PRECISIONS,
    InferenceTerms,
    ServingArrays,
    ServingWorkload,
    device,
    gemm_precision,
    inference_terms,
    memory_bytes,
    serving_workload,
)
from madmax_opt.model.objectives import Rates, uniform_rates, usd_per_million_units
from madmax_opt.model.plan_settings import SHARED_DEGREES, training_only_degrees, training_only_settings
from madmax_opt.model.problem import Problem
from madmax_opt.model.serving_calibration import (
    CalibrationColumns,
    ServingCatalog,
    ServingData,
    calibration_columns,
    serving_framework,
)
from madmax_opt.model.spec import InferencePrecision, InferenceTask, Plan, System
from madmax_opt.search.assemble import IntObjective, Limit, admissible_mask, brute_force, cluster_limits
from madmax_opt.search.objectives import integer_objective, serving_units

MAX_TP = 64
# concurrent sequences per replica searched: 1, 2, 3, 4, 6, 8, 12, ... 4096, plus the largest batch that fits
TRAINING_KNOBS: tuple[str, ...] = training_only_settings()  # from the plan-settings registry
BATCH_GRID: tuple[int, ...] = tuple(sorted({b for i in range(13) for b in (1 << i, 3 << i) if b <= 4096}))


def training_knobs(plan: Plan) -> list[str]:
    """The training-only knobs ``plan`` sets (off their defaults)."""
    return [k for k in TRAINING_KNOBS if getattr(plan, k) != Plan.model_fields[k].default]


def serving_knobs() -> tuple[str, ...]:
    """A serving plan's settings: the shared degrees base, the batch and the serving plan's own settings (in name
    order), the system."""
    own = set(ServingPlan.model_fields) - set(Plan.model_fields)
    return (*SHARED_DEGREES, *sorted({"batch", *own}), "system")


def training_only(knobs: list[str]) -> str:
    return f"{', '.join(knobs)}: training-only; allowed for inference: {', '.join(serving_knobs())}"


class ServingPlan(Plan):
    """A serving plan: a parallel plan plus the weight precision and the prefill/decode split (disaggregation)."""

    @model_validator(mode="after")
    def _serving_knobs(self) -> ServingPlan:
        training = training_knobs(self)
        if training:
            raise ValueError(training_only(training))
        return self

    precision: InferencePrecision | None = Field(
        None, description="weight precision; default: the task's first"
    )
    prefill_replicas: NonNegativeInt = Field(
        0, description="disaggregated: replicas (of dp) that only prefill"
    )
    ep: PositiveInt = Field(
        1,
        description="MoE: GPUs one layer's experts are spread over; 1 = every expert TP-sharded over the replica, a "
        "multiple of tp = whole experts on ep GPUs shared by ep / tp attention replicas (attention DP with tp 1)",
    )
    max_num_seqs: PositiveInt | None = Field(
        None, description="cap on the running batch (vLLM max_num_seqs, TensorRT-LLM max_batch_size); default: "
        "the framework's; batch above it (or above what the KV cache holds) waits in a queue",
    )


def per_gpu_calibration(options: Sequence[HardwareOption], framework: str, catalog: ServingCatalog
                        ) -> tuple[CalibrationColumns, list[dict[str, Any]]]:
    """``calibration_columns`` resolved once per distinct GPU and spread over the options that use it (an option's
    calibration and its record depend on its GPU alone; the hardware order made one resolution 1 ms, 256 options
    of 4 GPU types 0.3 s)."""
    reps: list[HardwareOption] = []
    at: list[int] = []
    for o in options:
        k = next((k for k, r in enumerate(reps) if r.gpu is o.gpu or r.gpu == o.gpu), len(reps))
        if k == len(reps):
            reps.append(o)
        at.append(k)
    cal, records = calibration_columns(reps, framework, catalog)
    if len(reps) == len(options):
        return cal, records
    idx = np.array(at, dtype=np.int64)
    spread = CalibrationColumns(**{f.name: getattr(cal, f.name)[idx] for f in dataclasses.fields(cal)})
    return spread, [copy.deepcopy(records[k]) for k in at]


@dataclass
class ServingModel:
    """An inference problem prepared for evaluation: workload and hardware table built once."""

    problem: Problem
    catalog: ServingCatalog | None = None  # serving calibration; default the package's data/serving_calibration.yaml
    task: InferenceTask = field(init=False)
    workload: ServingWorkload = field(init=False)
    table: HardwareTable = field(init=False)
    framework: str = field(init=False)
    cal: CalibrationColumns = field(init=False)
    calibration: list[dict[str, Any]] = field(init=False)  # per hardware option: what priced it

    def __post_init__(self) -> None:
        p = self.problem
        task = p.serving_task  # a training problem is refused in one line (task.kind)
        if p.model.moe is None and p.space.ep not in (None, 1, [1]):
            raise ProblemError(
                f"expert parallelism needs a mixture-of-experts model ({p.model.name} is dense); allowed: 1",
                file=p.source,
                field="space.ep",
            )
        for knob in training_only_degrees():
            if getattr(p.space, knob) is not None:
                allowed = "dp, tp, pp"
                raise ProblemError(
                    f"training-only knob; allowed for inference: {allowed}",
                    file=p.source,
                    field=f"space.{knob}",
                )
        self.task = task
        _check_precisions(p, task.precisions(), "task.precision")
        self.framework = serving_framework(p.stack, file=p.source)
        self.workload = serving_workload(p.model, task, p.stack)
        self.table = HardwareTable(p.hardware)
        self.cal, self.calibration = per_gpu_calibration(p.hardware, self.framework,
                                                         self.catalog or _serving_data(p).catalog)

    def terms(self, plans: ServingArrays) -> InferenceTerms:
        return inference_terms(self.workload, self.task, self.problem.stack, self.table, plans, self.cal)

    def arrays(self, plans: list[ServingPlan]) -> ServingArrays:
        default = self.task.precisions()[0]

        def col(values: list[int]) -> IntArr:
            return np.array(values, dtype=np.int64)

        hw = [self.problem.hw_index(p) for p in plans]
        for p, j in zip(plans, hw, strict=True):
            if p.precision is not None:
                _check_precisions(self.problem, [p.precision], "plan.precision", [j])
        return ServingArrays(
            dp=col([p.dp for p in plans]),
            tp=col([p.tp for p in plans]),
            pp=col([p.pp for p in plans]),
            batch=col([p.batch or 1 for p in plans]),
            precision=col([PRECISIONS.index(p.precision or default) for p in plans]),
            prefill_dp=col([p.prefill_replicas for p in plans]),
            hw=col(hw),
            ep=col([p.ep for p in plans]),
            max_seqs=col([p.max_num_seqs or 0 for p in plans]),
        )


def _check_precisions(problem: Problem, precisions: list[str], where: str, options: list[int] | None = None) -> None:
    """One-line error for a precision that no hardware option (or the plan's) can run (e.g. fp4 before Blackwell)."""
    hw = problem.hardware if options is None else [problem.hardware[j] for j in options]
    for prec in precisions:
        need = GEMM_PRECISION[prec]
        if not any(gemm_precision(prec, o.gpu.peak_flops) for o in hw):  # fp4 runs weight-only (bf16) pre-Blackwell
            catalog_gpus = _serving_data(problem).catalog_gpus
            able = sorted(g for g, gpu in catalog_gpus.items() if gemm_precision(prec, gpu.peak_flops))
            gpus = ", ".join(dict.fromkeys(o.gpu.name for o in hw))
            raise ProblemError(
                f"{prec} needs {need} tensor cores, which {gpus} lack; allowed on {gpus}: "
                f"{', '.join(p for p in PRECISIONS if any(gemm_precision(p, o.gpu.peak_flops) for o in hw))} "
                f"({prec} runs on {', '.join(able)})",
                file=problem.source,
                field=where,
            )


def _serving_data(problem: Problem) -> ServingData:
    """The catalogs io resolved for an inference problem (io/problem.py, ``serving``)."""
    if problem.serving is None:
        raise ValueError("an inference problem carries its serving data (io/problem.py resolves it)")
    return problem.serving


def serving_plan(plans: ServingArrays, i: int, system: str | None = None) -> ServingPlan:
    return ServingPlan(
        dp=int(plans.dp[i]),
        tp=int(plans.tp[i]),
        pp=int(plans.pp[i]),
        ep=int(plans.ep[i]),
        batch=int(plans.batch[i]),
        max_num_seqs=int(plans.max_seqs[i]) or None,
        precision=PRECISIONS[int(plans.precision[i])],
        prefill_replicas=int(plans.prefill_dp[i]),
        system=system,
    )


def as_serving_plan(plan: Plan, problem: Problem) -> ServingPlan:
    """A plan (e.g. the problem's baseline) as a serving plan; training-only knobs are one-line errors."""
    if not isinstance(plan, ServingPlan) and training_knobs(plan):
        raise ProblemError(training_only(training_knobs(plan)), file=problem.source, field="baseline")
    # a validated Plan that sets no training knob is a valid ServingPlan
    sp = plan if isinstance(plan, ServingPlan) else ServingPlan(**plan.model_dump(exclude_unset=True))
    if problem.model.moe is None and sp.ep > 1:  # as the space check: a dense MLP has no experts to spread
        raise ProblemError(f"ep={sp.ep} needs a mixture-of-experts model ({problem.model.name} is dense); allowed: 1",
                           file=problem.source, field="plan.ep")
    return sp


# --------------------------------------------------------------------------------------------- enumeration


def _values(given: int | list[int] | None, default: list[int]) -> list[int]:
    if given is None:
        return default
    return sorted({given} if isinstance(given, int) else set(given))


def ep_values(model: ServingModel, dp: int, tp: int) -> list[int]:
    """Expert-parallel degrees of a (dp, tp) shape: 1, or multiples of tp dividing dp x tp and the experts."""
    moe = model.problem.model.moe
    given = model.problem.space.ep
    if moe is None:
        return [1]
    options = [1] + [e for e in range(tp, dp * tp + 1, tp) if e > 1 and (dp * tp) % e == 0 and moe.num_experts % e == 0]
    return [e for e in options if given is None or e in _values(given, [])]


def enumerate_serving(model: ServingModel) -> ServingArrays:
    """Every serving plan that uses all GPUs of each hardware option; batches up to the largest that runs at once
    (what the KV cache holds, capped by the framework's max_num_seqs): a larger offered batch only queues."""
    p = model.problem
    m = p.model
    sp = p.space
    precisions = [PRECISIONS.index(x) for x in model.task.precisions()]
    shapes: list[tuple[int, ...]] = []
    for hw, option in enumerate(p.hardware):
        domain = option.system.tiers[0].size or option.gpus
        tps = _values(sp.tp, [t for t in (1 << i for i in range(7)) if t <= min(domain, MAX_TP, m.heads)])
        pps = _values(sp.pp, [d for d in range(1, m.layers + 1) if m.layers % d == 0 and d <= option.gpus])
        for tp in tps:
            for pp in pps:
                if option.gpus % (tp * pp):
                    continue
                dp = option.gpus // (tp * pp)
                if sp.dp is not None and dp not in _values(sp.dp, []):
                    continue
                shapes.extend(
                    (dp, tp, pp, prec, hw, ep) for prec in precisions for ep in ep_values(model, dp, tp)
                )
    if not shapes:
        return ServingArrays.empty()
    s = np.array(shapes, dtype=np.int64)
    one = np.ones(len(s), dtype=np.int64)
    base = ServingArrays(
        dp=s[:, 0],
        tp=s[:, 1],
        pp=s[:, 2],
        batch=one,
        precision=s[:, 3],
        prefill_dp=np.where(model.task.disaggregated, 1, 0) * one,
        hw=s[:, 4],
        ep=s[:, 5],
        max_seqs=0 * one,
    )
    capacity = model.table.hbm_bytes[base.hw] * (1.0 - p.stack.memory_reserve_fraction)
    dev = device(model.workload, model.task, model.table, base, model.cal)
    _, _, max_batch = memory_bytes(model.workload, dev, capacity, model.cal.kv_full_reservation[base.hw])
    runs = np.minimum(max_batch, model.cal.default_max_num_seqs[base.hw])
    # each shape once per batch size (and, disaggregated, per prefill split 0..dp-1: 0 = prefill interleaved),
    # the batch varying fastest; rows built as columns (a row-by-row Python build was 0.2 s on 4 GPU types)
    reps: list[int] = []
    batch_col: list[int] = []
    split_col: list[int] = []
    grids: dict[int, list[int]] = {}
    for fits_f, dp in zip(runs.tolist(), base.dp.tolist(), strict=True):
        fits = int(min(fits_f, 1 << 30))
        batches = grids.get(fits)
        if batches is None:
            batches = grids[fits] = [b for b in BATCH_GRID if b <= max(fits, 1)]
            if fits > 1 and fits not in batches:
                batches.append(fits)
        n_splits = dp if model.task.disaggregated else 1
        reps.append(n_splits * len(batches))
        batch_col.extend(batches * n_splits)
        split_col.extend(pre for pre in range(n_splits) for _ in batches)
    if not batch_col:
        return ServingArrays.empty()
    at = np.repeat(np.arange(len(base)), reps)
    return ServingArrays(s[at, 0], s[at, 1], s[at, 2], np.array(batch_col, dtype=np.int64), s[at, 3],
                         np.array(split_col, dtype=np.int64), s[at, 4], s[at, 5], np.zeros(len(at), dtype=np.int64))


# ------------------------------------------------------------------------------------------- candidates


@dataclass
class ServingCandidates:
    """Enumerated plans with their float terms and the rounded integer columns CP-SAT sees."""

    plans: ServingArrays
    terms: InferenceTerms
    systems: tuple[System, ...]  # the problem's hardware options' systems (plans.hw indexes them)
    ttft_us: IntArr = field(init=False)
    tpot_us: IntArr = field(init=False)
    tokens_per_s: IntArr = field(init=False)  # whole deployment, floored
    gpu_ns_per_token: IntArr = field(init=False)
    cost_cents_per_hour: IntArr = field(init=False)

    def __post_init__(self) -> None:
        t = self.terms
        self.ttft_us = _integer(np.rint(t.ttft_s * US))
        self.tpot_us = _integer(np.rint(t.tpot_s * US))
        self.tokens_per_s = _integer(np.floor(np.nan_to_num(t.output_tokens_per_s, nan=0.0)))
        self.gpu_ns_per_token = _integer(np.rint(self.gpu_s_per_token * NS))
        self.cost_cents_per_hour = _integer(np.rint(self.cost_per_hour * 100))

    @property
    def gpu_s_per_token(self) -> Arr:
        """GPU-seconds per output token = 1 / (output tokens/s per GPU)."""
        return self.plans.gpus / np.maximum(self.terms.output_tokens_per_s, 1e-30)

    @property
    def cost_per_hour(self) -> Arr:
        return self.rates().usd_per_hour

    @property
    def usd_per_million_tokens(self) -> Arr:
        return usd_per_million_units(self.cost_per_hour, np.maximum(self.terms.output_tokens_per_s, 1e-30))

    @property
    def valid(self) -> NDArray[np.bool_]:
        return np.asarray(self.terms.invalid == 0)

    def rates(self) -> Rates:
        """What every registered objective is computed from (model/objectives.py), per output token."""
        return uniform_rates(1.0 / np.maximum(self.terms.output_tokens_per_s, 1e-30), self.systems, self.plans.hw,
                             self.plans.gpus.astype(np.float64), throughput_per_gpu=True)

    def int_objective(self, kind: str) -> IntObjective:
        return integer_objective(kind, self.rates(), serving_units(kind))

    def objective(self, kind: str) -> IntArr:
        return self.int_objective(kind).values


def _integer(x: Arr) -> IntArr:
    """Rounded metric -> int64; NaN (invalid plans) and overflow saturate at 2^50 (below CP-SAT's 2^62 limit)."""
    return np.minimum(np.nan_to_num(x, nan=2.0**50, posinf=2.0**50), 2.0**50).astype(np.int64)


def candidates(model: ServingModel, plans: ServingArrays | None = None) -> ServingCandidates:
    plans = enumerate_serving(model) if plans is None else plans
    return ServingCandidates(plans, model.terms(plans), tuple(o.system for o in model.problem.hardware))


def _min_tokens_per_s(task: InferenceTask, model: ServingModel) -> int | None:
    floors = [x for x in (task.min_throughput, model.problem.constraints.min_throughput) if x is not None]
    return int(np.ceil(max(floors))) if floors else None


def _gpu_type(model: ServingModel, plans: ServingArrays) -> NDArray[np.str_]:
    names = np.array([o.gpu.name for o in model.problem.hardware])
    return names[plans.hw] if len(plans) else np.array([], dtype=str)


def target_limits(model: ServingModel, c: ServingCandidates) -> list[Limit]:
    """TTFT, TPOT and throughput targets as linear limits (on the rounded integers CP-SAT sees)."""
    task = model.task
    out = []
    if task.ttft_s is not None:
        out.append(Limit(c.ttft_us, round(task.ttft_s * US)))
    if task.tpot_s is not None:
        out.append(Limit(c.tpot_us, round(task.tpot_s * US)))
    floor = _min_tokens_per_s(task, model)
    if floor is not None:
        out.append(Limit(c.tokens_per_s, floor, at_least=True))
    return out


def cluster(model: ServingModel, c: ServingCandidates) -> list[Limit]:
    """GPU count, $/hour and GPU supply per type."""
    cons = model.problem.constraints
    return cluster_limits(
        model.problem.hardware, c.plans.hw, c.plans.gpus, c.cost_cents_per_hour, cons.max_gpus, cons.max_cost_per_hour
    )


def meets_targets(model: ServingModel, c: ServingCandidates) -> NDArray[np.bool_]:
    return admissible_mask(np.ones(len(c.plans), dtype=bool), target_limits(model, c))


def within_cluster_limits(model: ServingModel, c: ServingCandidates) -> NDArray[np.bool_]:
    return admissible_mask(np.ones(len(c.plans), dtype=bool), cluster(model, c))


def admissible(model: ServingModel, c: ServingCandidates) -> NDArray[np.bool_]:
    """Valid plans meeting every target and constraint: what brute force minimises over."""
    return admissible_mask(c.valid, target_limits(model, c) + cluster(model, c))


def brute_force_order(model: ServingModel, c: ServingCandidates, objective: str) -> IntArr:
    """Admissible candidate indices sorted by (integer objective, enumeration order): the reference answer."""
    return brute_force(c.objective(objective), admissible(model, c))
