"""Serving plans: enumeration, exact records, CP-SAT assembly under latency targets, and the Pareto front.

Same design as ``solver`` (shared/reference/solver-notes.md, "enumerate, then assemble"): the vectorised model
(``inference.inference_terms``) evaluates every candidate (tp, pp, dp replicas, batch, precision, prefill split,
GPU type and count), each metric is rounded once to an integer (ns of GPU time per output token, micro-dollars
per million tokens, us of TTFT/TPOT, tokens/s, cents/hour), and CP-SAT picks one candidate (``add_exactly_one``)
under the linear constraints (latency targets, minimum throughput, GPU count, supply per GPU type, $/hour).
Within one hardware option every remaining constraint is monotone in the objective, so only the ``k`` best
admissible candidates of each option can be in the top-k (exact pruning, as in ``solver.solve``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, NonNegativeInt, model_validator
from rich.console import Console
from rich.table import Table

from madmax_opt.core.errors import InfeasibleError, InternalError, ProblemError
from madmax_opt.io.problem import Problem, validate
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.inference import (
    DEFAULT_KV_PRECISION,
    INVALID_REASONS,
    MEMORY_REASON,
    PRECISIONS,
    STEP_TERMS,
    InferenceTerms,
    ServingArrays,
    ServingWorkload,
    device,
    inference_terms,
    memory_bytes,
    serving_workload,
)
from madmax_opt.model.spec import InferencePrecision, InferenceTask, Plan
from madmax_opt.search.assemble import (
    Limit,
    admissible_mask,
    brute_force,
    cluster_limits,
    pick_best,
    solver_summary,
    supplies,
)
from madmax_opt.search.solver import UUSD

IntArr = NDArray[np.int64]
Arr = NDArray[np.float64]
US = 1e6  # latency unit: microseconds
NS = 1e9  # objective unit for throughput: GPU-nanoseconds per output token
SECONDS_PER_HOUR = 3600.0
MAX_TP = 64
# concurrent sequences per replica searched: 1, 2, 3, 4, 6, 8, 12, ... 4096, plus the largest batch that fits
TRAINING_KNOBS: tuple[str, ...] = (
    "cp",
    "vpp",
    "mbs",
    "zero",
    "recompute",
    "sp",
    "stage_layers",
    "stage_recompute",
)
SERVING_KNOBS: tuple[str, ...] = ("dp", "tp", "pp", "batch", "precision", "prefill_replicas", "system")
BATCH_GRID: tuple[int, ...] = tuple(sorted({b for i in range(13) for b in (1 << i, 3 << i) if b <= 4096}))


class ServingPlan(Plan):
    """A serving plan: a parallel plan plus the weight precision and the prefill/decode split (disaggregation)."""

    @model_validator(mode="after")
    def _serving_knobs(self) -> ServingPlan:
        training = [k for k in TRAINING_KNOBS if getattr(self, k) != ServingPlan.model_fields[k].default]
        if training:
            raise ValueError(
                f"{', '.join(training)}: training-only; allowed for inference: {', '.join(SERVING_KNOBS)}"
            )
        return self

    precision: InferencePrecision | None = Field(
        None, description="weight precision; default: the task's first"
    )
    prefill_replicas: NonNegativeInt = Field(
        0, description="disaggregated: replicas (of dp) that only prefill"
    )


@dataclass
class ServingModel:
    """An inference problem prepared for evaluation: workload and hardware table built once."""

    problem: Problem
    task: InferenceTask = field(init=False)
    workload: ServingWorkload = field(init=False)
    table: HardwareTable = field(init=False)

    def __post_init__(self) -> None:
        p = self.problem
        if not isinstance(p.task, InferenceTask):
            raise ProblemError("expected kind: inference", file=p.source, field="task.kind")
        if p.model.moe is not None:
            raise ProblemError(
                "mixture-of-experts models are not modelled for inference yet (expert parallelism is a later "
                "issue); allowed: dense models",
                file=p.source,
                field="model",
            )
        for knob in ("cp", "vpp", "mbs", "zero", "recompute", "sp"):
            if getattr(p.space, knob) is not None:
                allowed = "dp, tp, pp"
                raise ProblemError(
                    f"training-only knob; allowed for inference: {allowed}",
                    file=p.source,
                    field=f"space.{knob}",
                )
        self.task = p.task
        self.workload = serving_workload(p.model, p.task, p.stack)
        self.table = HardwareTable(p.hardware)

    def terms(self, plans: ServingArrays) -> InferenceTerms:
        return inference_terms(self.workload, self.task, self.problem.stack, self.table, plans)

    def arrays(self, plans: list[ServingPlan]) -> ServingArrays:
        default = self.task.precisions()[0]

        def col(values: list[int]) -> IntArr:
            return np.array(values, dtype=np.int64)

        return ServingArrays(
            dp=col([p.dp for p in plans]),
            tp=col([p.tp for p in plans]),
            pp=col([p.pp for p in plans]),
            batch=col([p.batch or 1 for p in plans]),
            precision=col([PRECISIONS.index(p.precision or default) for p in plans]),
            prefill_dp=col([p.prefill_replicas for p in plans]),
            hw=col([self.problem.hw_index(p) for p in plans]),
        )


def serving_plan(plans: ServingArrays, i: int, system: str | None = None) -> ServingPlan:
    return ServingPlan(
        dp=int(plans.dp[i]),
        tp=int(plans.tp[i]),
        pp=int(plans.pp[i]),
        batch=int(plans.batch[i]),
        precision=PRECISIONS[int(plans.precision[i])],
        prefill_replicas=int(plans.prefill_dp[i]),
        system=system,
    )


def as_serving_plan(plan: Plan, problem: Problem) -> ServingPlan:
    """A plan (e.g. the problem's baseline) as a serving plan; training-only knobs are one-line errors."""
    if isinstance(plan, ServingPlan):
        return plan
    return validate(ServingPlan, plan.model_dump(exclude_unset=True), file=problem.source, prefix="baseline")


# --------------------------------------------------------------------------------------------- enumeration


def _values(given: int | list[int] | None, default: list[int]) -> list[int]:
    if given is None:
        return default
    return sorted({given} if isinstance(given, int) else set(given))


def enumerate_serving(model: ServingModel) -> ServingArrays:
    """Every serving plan that uses all GPUs of each hardware option; batches up to the largest that fits."""
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
                shapes.extend((dp, tp, pp, prec, hw) for prec in precisions)
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
    )
    capacity = model.table.hbm_bytes[base.hw] * (1.0 - p.stack.memory_reserve_fraction)
    _, _, max_batch = memory_bytes(
        model.workload, device(model.workload, model.task, model.table, base), capacity
    )
    rows: list[tuple[int, ...]] = []
    for i in range(len(base)):
        fits = int(max_batch[i])
        batches = [b for b in BATCH_GRID if b <= max(fits, 1)]
        if fits > 1 and fits not in batches:
            batches.append(fits)
        splits = range(int(base.dp[i])) if model.task.disaggregated else [0]  # 0: prefill interleaved
        rows.extend((*s[i, :3], b, s[i, 3], pre, s[i, 4]) for pre in splits for b in batches)
    if not rows:
        return ServingArrays.empty()
    r = np.array(rows, dtype=np.int64)
    return ServingArrays(*(r[:, j] for j in range(7)))


# ------------------------------------------------------------------------------------------- candidates


@dataclass
class ServingCandidates:
    """Enumerated plans with their float terms and the rounded integer columns CP-SAT sees."""

    plans: ServingArrays
    terms: InferenceTerms
    price_per_gpu_hour: Arr
    ttft_us: IntArr = field(init=False)
    tpot_us: IntArr = field(init=False)
    tokens_per_s: IntArr = field(init=False)  # whole deployment, floored
    gpu_ns_per_token: IntArr = field(init=False)
    uusd_per_million_tokens: IntArr = field(init=False)
    cost_cents_per_hour: IntArr = field(init=False)

    def __post_init__(self) -> None:
        t = self.terms
        self.ttft_us = _integer(np.rint(t.ttft_s * US))
        self.tpot_us = _integer(np.rint(t.tpot_s * US))
        self.tokens_per_s = _integer(np.floor(np.nan_to_num(t.output_tokens_per_s, nan=0.0)))
        self.gpu_ns_per_token = _integer(np.rint(self.gpu_s_per_token * NS))
        self.uusd_per_million_tokens = _integer(np.rint(self.usd_per_million_tokens * UUSD))
        self.cost_cents_per_hour = _integer(np.rint(self.cost_per_hour * 100))

    @property
    def gpu_s_per_token(self) -> Arr:
        """GPU-seconds per output token = 1 / (output tokens/s per GPU)."""
        return self.plans.gpus / np.maximum(self.terms.output_tokens_per_s, 1e-30)

    @property
    def cost_per_hour(self) -> Arr:
        return self.price_per_gpu_hour * self.plans.gpus

    @property
    def usd_per_million_tokens(self) -> Arr:
        return self.cost_per_hour / SECONDS_PER_HOUR / np.maximum(self.terms.output_tokens_per_s, 1e-30) * 1e6

    @property
    def valid(self) -> NDArray[np.bool_]:
        return np.asarray(self.terms.invalid == 0)

    def objective(self, kind: str) -> IntArr:
        return self.uusd_per_million_tokens if kind == "cost" else self.gpu_ns_per_token


def _integer(x: Arr) -> IntArr:
    """Rounded metric -> int64; NaN (invalid plans) and overflow saturate at 2^50 (below CP-SAT's 2^62 limit)."""
    return np.minimum(np.nan_to_num(x, nan=2.0**50, posinf=2.0**50), 2.0**50).astype(np.int64)


def candidates(model: ServingModel, plans: ServingArrays | None = None) -> ServingCandidates:
    plans = enumerate_serving(model) if plans is None else plans
    return ServingCandidates(plans, model.terms(plans), model.table.price_per_gpu_hour[plans.hw])


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


# ---------------------------------------------------------------------------------------------- CP-SAT


@dataclass
class ServingOutcome:
    status: str
    top: list[int]
    objective: int | None
    best_bound: float | None
    wall_s: float
    candidates: ServingCandidates
    model_size: int


def solve_serving(
    problem: Problem,
    *,
    top_k: int = 1,
    time_limit_s: float = 60.0,
    workers: int = 1,
    seed: int = 0,
    model: ServingModel | None = None,
    plans: ServingArrays | None = None,
) -> ServingOutcome:
    """The best serving plan(s) under the targets; InfeasibleError names what binds."""
    t0 = time.perf_counter()
    model = model or ServingModel(problem)
    c = candidates(model, plans)
    lims = target_limits(model, c) + cluster(model, c)
    pick = pick_best(
        c.objective(problem.objective),
        admissible_mask(c.valid, lims),
        c.plans.hw,
        lims,
        top_k=top_k,
        time_limit_s=time_limit_s,
        workers=workers,
        seed=seed,
    )
    if pick is None:
        raise InfeasibleError(explain_infeasible(model, c))
    return ServingOutcome(
        pick.status, pick.top, pick.objective, pick.best_bound, time.perf_counter() - t0, c, pick.booleans
    )


# --------------------------------------------------------------------------------------------- records


def _reason(model: ServingModel, c: ServingCandidates, i: int) -> str | None:
    code = int(c.terms.invalid[i])
    if code == MEMORY_REASON:
        mem = c.terms.memory
        return (
            f"batch {int(c.plans.batch[i])} needs {mem['total'][i] / 1e9:.1f} GB per GPU, usable "
            f"{mem['capacity'][i] / 1e9:.1f} GB (at most {int(c.terms.max_batch[i])} sequences fit)"
        )
    if code:
        return INVALID_REASONS[code]
    task = model.task
    misses = []
    if task.ttft_s is not None and c.ttft_us[i] > round(task.ttft_s * US):
        misses.append(f"TTFT {c.terms.ttft_s[i] * 1e3:.1f} ms exceeds the target {task.ttft_s * 1e3:g} ms")
    if task.tpot_s is not None and c.tpot_us[i] > round(task.tpot_s * US):
        misses.append(f"TPOT {c.terms.tpot_s[i] * 1e3:.2f} ms exceeds the target {task.tpot_s * 1e3:g} ms")
    floor = _min_tokens_per_s(task, model)
    if floor is not None and c.tokens_per_s[i] < floor:
        misses.append(
            f"{c.terms.output_tokens_per_s[i]:,.0f} output tokens/s is below min_throughput {floor:,}"
        )
    return "; ".join(misses) or None


def plan_dict(model: ServingModel, c: ServingCandidates, i: int) -> dict[str, Any]:
    p = c.plans
    opt = model.problem.hardware[int(p.hw[i])]
    prec = PRECISIONS[int(p.precision[i])]
    return {
        "dp": int(p.dp[i]),
        "tp": int(p.tp[i]),
        "pp": int(p.pp[i]),
        "batch": int(p.batch[i]),
        "precision": prec,
        "kv_precision": model.task.kv_precision or DEFAULT_KV_PRECISION[prec],
        "prefill_replicas": int(p.prefill_dp[i]),
        "system": opt.system.name,
    }


def to_records(
    model: ServingModel, c: ServingCandidates, index: list[int] | IntArr | None = None
) -> list[dict[str, Any]]:
    """The JSON objects of ``evaluate --json`` / ``solve --json`` for inference problems."""
    t = c.terms
    rows = range(len(c.plans)) if index is None else [int(i) for i in index]
    out = []
    for i in rows:
        opt = model.problem.hardware[int(c.plans.hw[i])]
        reason = _reason(model, c, i)
        out.append(
            {
                "plan": plan_dict(model, c, i),
                "hardware": {"system": opt.system.name, "gpu": opt.gpu.name, "gpus": opt.gpus},
                "feasible": reason is None,
                "infeasible_reason": reason,
                "ttft_s": float(t.ttft_s[i]),
                "tpot_s": float(t.tpot_s[i]),
                "output_tokens_per_s": float(t.output_tokens_per_s[i]),
                "output_tokens_per_s_per_gpu": float(t.output_tokens_per_s_per_gpu[i]),
                "max_batch": int(t.max_batch[i]),
                "kv_cache_bytes_per_gpu": float(t.memory["kv_cache"][i]),
                "decode_step_s": float(t.decode_step_s[i]),
                "prefill_s": float(t.prefill_s[i]),
                "cost_per_hour_usd": float(c.cost_per_hour[i]),
                "usd_per_million_tokens": float(c.usd_per_million_tokens[i]),
                "memory_bytes_per_gpu": {k: float(v[i]) for k, v in t.memory.items()},
                "tpot_breakdown_s": {k: float(t.step[k][i]) for k in STEP_TERMS},
            }
        )
    return out


def evaluate_serving(problem: Problem, plans: list[Plan]) -> list[dict[str, Any]]:
    """Evaluate public plans of an inference problem (a plan without ``batch`` gets its best batch)."""
    model = ServingModel(problem)
    records = []
    for plan in (as_serving_plan(p, problem) for p in plans):
        if plan.batch is None:
            records.append(best_batch_record(model, plan))
            continue
        arr = model.arrays([plan])
        records.append(to_records(model, candidates(model, arr))[0])
    return records


def best_batch_record(model: ServingModel, plan: ServingPlan) -> dict[str, Any]:
    """The plan at its best batch: the highest-objective batch meeting the targets, else the largest that fits."""
    arr = model.arrays([plan])
    fits = int(candidates(model, arr).terms.max_batch[0])
    grid = sorted({b for b in BATCH_GRID if b <= max(fits, 1)} | ({fits} if fits > 1 else set()))
    rows = arr.take([0] * len(grid))
    rows = ServingArrays(
        rows.dp, rows.tp, rows.pp, np.array(grid, dtype=np.int64), rows.precision, rows.prefill_dp, rows.hw
    )
    c = candidates(model, rows)
    ok = c.valid & meets_targets(model, c)
    obj = c.objective(model.problem.objective)
    if ok.any():
        idx = np.flatnonzero(ok)
        best = int(idx[np.lexsort((idx, obj[idx]))][0])
    else:
        best = len(grid) - 1
    return to_records(model, c, [best])[0]


def cross_check(outcome: ServingOutcome, records: list[dict[str, Any]], objective: str) -> None:
    """Each returned plan, re-evaluated in floating point, must be feasible and match its integer objective."""
    c = outcome.candidates
    for i, rec in zip(outcome.top, records, strict=True):
        if objective == "cost":
            exact, rounded = rec["usd_per_million_tokens"], c.uusd_per_million_tokens[i] / UUSD
            tol = 0.5 / UUSD
        else:
            exact, rounded = 1.0 / rec["output_tokens_per_s_per_gpu"], c.gpu_ns_per_token[i] / NS
            tol = 0.5 / NS
        if not rec["feasible"] or abs(exact - rounded) > tol * (1 + 1e-9):
            raise InternalError(
                f"solver/evaluator mismatch on {rec['plan']}: evaluator {exact:.9g}, solver "
                f"{rounded:.9g} (feasible={rec['feasible']})"
            )


# ------------------------------------------------------------------------------------------ explanations


def _plan_text(plan: dict[str, Any]) -> str:
    text = f"tp={plan['tp']} pp={plan['pp']} dp={plan['dp']} batch={plan['batch']} {plan['precision']}"
    return text + (f" prefill_replicas={plan['prefill_replicas']}" if plan.get("prefill_replicas") else "")


def explain_infeasible(model: ServingModel, c: ServingCandidates) -> str:
    """Name what binds: the plan space, memory, a latency or throughput target, or the cluster limits."""
    p = model.problem
    task = model.task
    if len(c.plans) == 0:
        sizes = ", ".join(str(o.gpus) for o in p.hardware)
        return (
            f"the plan space is empty: no allowed tp x pp divides the cluster size(s) {sizes} (check 'space')"
        )
    valid = c.valid
    if not valid.any():
        inv = c.terms.invalid
        if np.any(inv == MEMORY_REASON):
            cand = np.flatnonzero(inv == MEMORY_REASON)
            best = int(cand[np.argmin(c.terms.memory["total"][cand])])
            opt = p.hardware[int(c.plans.hw[best])]
            plan = plan_dict(model, c, best)
            return (
                f"{p.model.name} does not fit: even {_plan_text(plan)} on {opt.name} needs "
                f"{c.terms.memory['total'][best] / 1e9:.1f} GB per GPU, usable "
                f"{c.terms.memory['capacity'][best] / 1e9:.1f} GB (binding constraint: memory capacity)"
            )
        code = int(np.bincount(inv[inv > 0]).argmax())
        return f"no plan in the space is valid; most common violation: {INVALID_REASONS[code]}"
    reasons = []
    ok_cluster = valid & within_cluster_limits(model, c)
    pool = ok_cluster if ok_cluster.any() else valid
    types = _gpu_type(model, c.plans)
    for name, target, metric in (
        ("TTFT", task.ttft_s, c.terms.ttft_s),
        ("TPOT", task.tpot_s, c.terms.tpot_s),
    ):
        if target is None:
            continue
        unit = US
        hit = pool & ((c.ttft_us if name == "TTFT" else c.tpot_us) <= round(target * unit))
        if hit.any():
            continue
        per_type = []
        for gpu in dict.fromkeys(types[pool].tolist()):
            sel = np.flatnonzero(pool & (types == gpu))
            best = int(sel[np.argmin(metric[sel])])
            opt = p.hardware[int(c.plans.hw[best])]
            per_type.append(
                f"{metric[best] * 1e3:.3g} ms on {gpu} ({opt.name}: {_plan_text(plan_dict(model, c, best))})"
            )
        reasons.append(
            f"{name} {target * 1e3:g} ms needs a faster plan than any in the space; the best reachable "
            f"is " + "; ".join(per_type)
        )
    floor = _min_tokens_per_s(task, model)
    if floor is not None:
        lat_ok = pool & meets_targets_latency(model, c)
        best_rate = c.terms.output_tokens_per_s[lat_ok].max() if lat_ok.any() else 0.0
        if best_rate < floor:
            reasons.append(
                f"min_throughput {floor:,} output tokens/s: the best plan meeting the latency targets "
                f"reaches {best_rate:,.0f}"
            )
    if not reasons:
        fit_targets = valid & meets_targets(model, c)
        cons = p.constraints
        if fit_targets.any():
            fewest = int(c.plans.gpus[fit_targets].min())
            cheapest = float(c.cost_per_hour[fit_targets].min())
            reasons.append(
                f"the targets need at least {fewest} GPUs (${cheapest:,.2f}/h); limits: max_gpus="
                f"{cons.max_gpus}, max_cost_per_hour={cons.max_cost_per_hour}, supply={supplies(model.problem.hardware)}"
            )
        else:
            reasons.append("the targets together exclude every valid plan")
    return "no serving plan meets the targets (binding: " + "; ".join(reasons) + ")"


def meets_targets_latency(model: ServingModel, c: ServingCandidates) -> NDArray[np.bool_]:
    task = model.task
    ok = np.ones(len(c.plans), dtype=bool)
    if task.ttft_s is not None:
        ok &= c.ttft_us <= round(task.ttft_s * US)
    if task.tpot_s is not None:
        ok &= c.tpot_us <= round(task.tpot_s * US)
    return ok


# ---------------------------------------------------------------------------------------------- Pareto


def pareto_front(model: ServingModel, c: ServingCandidates) -> IntArr:
    """Valid candidates (within the cluster limits) not dominated in (lower TPOT, higher tokens/s per GPU),
    ignoring the latency targets; one candidate per distinct point, the first in enumeration order."""
    idx = np.flatnonzero(c.valid & within_cluster_limits(model, c))
    if len(idx) == 0:
        return idx
    cost = c.gpu_ns_per_token  # integer GPU-ns per token: lower is higher throughput per GPU
    order = idx[np.lexsort((idx, cost[idx], c.tpot_us[idx]))]
    front: list[int] = []
    best = np.iinfo(np.int64).max
    for i in order:
        if cost[i] < best:
            front.append(int(i))
            best = int(cost[i])
    return np.array(front, dtype=np.int64)


# ------------------------------------------------------------------------------------------ entry points


def solve_result(problem: Problem, top_k: int, time_limit: float, workers: int) -> dict[str, Any]:
    """The JSON object of ``solve --json`` for an inference problem."""
    model = ServingModel(problem)
    outcome = solve_serving(problem, top_k=top_k, time_limit_s=time_limit, workers=workers, model=model)
    c = outcome.candidates
    records = to_records(model, c, outcome.top)
    cross_check(outcome, records, problem.objective)
    baseline = evaluate_serving(problem, [problem.baseline])[0] if problem.baseline else None
    speedup = None
    if baseline and baseline["feasible"]:
        speedup = records[0]["output_tokens_per_s_per_gpu"] / baseline["output_tokens_per_s_per_gpu"]
    front = pareto_front(model, c)
    ok = meets_targets(model, c)
    pareto = [
        dict(r, meets_targets=bool(ok[i])) for i, r in zip(front, to_records(model, c, front), strict=True)
    ]
    summary = solver_summary(outcome.objective, outcome.best_bound, outcome.wall_s, len(c.plans), outcome.model_size)
    summary["objective_unit"] = "uUSD per million tokens" if problem.objective == "cost" else "GPU-ns per token"
    summary["admissible"] = int(admissible(model, c).sum())
    return {
        "task": "inference",
        "status": outcome.status,
        "objective": problem.objective,
        "best": records[0],
        "top": records,
        "solver": summary,
        "pareto": pareto,
        "baseline": baseline,
        "speedup_vs_baseline": speedup,
    }


# ------------------------------------------------------------------------------------------ human output


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f}"


def record_table(rec: dict[str, Any], title: str = "plan") -> Table:
    hw = rec["hardware"]
    t = Table(
        title=f"{title}: {_plan_text(rec['plan'])} on {hw['gpus']} x {hw['gpu']} ({hw['system']})",
        header_style="bold",
    )
    t.add_column("metric")
    t.add_column("value", justify="right")
    if not rec["feasible"]:
        t.add_row("[red]infeasible[/red]", str(rec["infeasible_reason"]))
    t.add_row("TTFT (ms)", _ms(rec["ttft_s"]))
    t.add_row("TPOT (ms)", _ms(rec["tpot_s"]))
    t.add_row("output tokens/s", f"{rec['output_tokens_per_s']:,.0f}")
    t.add_row("output tokens/s per GPU", f"{rec['output_tokens_per_s_per_gpu']:,.1f}")
    t.add_row("max batch per replica", f"{rec['max_batch']:,}")
    t.add_row("KV cache per GPU (GB)", f"{rec['kv_cache_bytes_per_gpu'] / 1e9:,.2f}")
    t.add_row("$ / M output tokens", f"{rec['usd_per_million_tokens']:,.4f}")
    t.add_section()
    for k, v in rec["tpot_breakdown_s"].items():
        if v > 0:
            t.add_row(f"  TPOT {k} (ms)", _ms(v))
    t.add_section()
    for k, v in rec["memory_bytes_per_gpu"].items():
        t.add_row(f"  memory {k} (GB)", f"{v / 1e9:,.2f}")
    return t


def pareto_table(rows: list[dict[str, Any]], title: str = "throughput vs latency (Pareto front)") -> Table:
    t = Table(title=title, header_style="bold")
    for col in ("TPOT ms", "TTFT ms", "tok/s/GPU", "tok/s", "hardware", "plan", "targets"):
        t.add_column(col, justify="left" if col in ("hardware", "plan") else "right")
    for r in rows:
        t.add_row(
            _ms(r["tpot_s"]),
            _ms(r["ttft_s"]),
            f"{r['output_tokens_per_s_per_gpu']:,.1f}",
            f"{r['output_tokens_per_s']:,.0f}",
            f"{r['hardware']['system']} x{r['hardware']['gpus']}",
            _plan_text(r["plan"]),
            "met" if r.get("meets_targets") else "-",
        )
    return t


def print_records(records: list[dict[str, Any]], console: Console) -> None:
    for i, r in enumerate(records):
        console.print(record_table(r, title=f"plan {i + 1}" if len(records) > 1 else "plan"))


def print_result(result: dict[str, Any], console: Console) -> None:
    s = result["solver"]
    console.print(
        f"[bold]status:[/bold] {result['status']}   objective {s['objective']} {s['objective_unit']}   "
        f"candidates {s['candidates']:,} (admissible {s['admissible']:,})   CP-SAT Booleans "
        f"{s['booleans']}   wall {s['wall_s']:.3f} s"
    )
    console.print(record_table(result["best"], title="best plan"))
    for i, r in enumerate(result["top"][1:], start=2):
        console.print(record_table(r, title=f"plan {i}"))
    console.print(pareto_table(result["pareto"]))
    if result.get("baseline"):
        console.print(record_table(result["baseline"], title="baseline"))
        if result.get("speedup_vs_baseline"):
            console.print(f"[bold]speedup over baseline: {result['speedup_vs_baseline']:.2f}x[/bold]")
