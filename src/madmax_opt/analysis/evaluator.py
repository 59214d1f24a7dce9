"""Exact evaluator: the cost model in floating point for any plan(s), with derived metrics and JSON output.

``Model`` prepares a problem once; ``metrics`` evaluates plan arrays vectorised (it is also the brute-force engine)
and ``to_records`` turns them into JSON records; ``evaluate`` takes public ``Plan`` objects (uneven pipelines stage by
stage) and returns one :class:`~madmax_opt.analysis.records.TrainingRecord` per plan.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, is_dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.analysis.attribution import TermsAt, bottleneck_shares
from madmax_opt.analysis.records import TrainingRecord
from madmax_opt.core.errors import ProblemError
from madmax_opt.core.intervals import Interval
from madmax_opt.core.numeric import Arr
from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareOption, HardwareTable
from madmax_opt.model.objectives import energy_mwh, run_cost_usd, stage_rates, usd_per_million_units
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import RECOMPUTE_MODES, Plan, System
from madmax_opt.model.training import (
    INVALID_REASONS,
    MEMORY_FIELDS,
    MEMORY_REASON,
    STEP_TERMS,
    TrainingTerms,
    staged_terms,
    training_terms,
)
from madmax_opt.model.workload import TransformerWorkload, lower

CHUNK_PLANS = 1 << 14  # plans per evaluation pass: a float64 column of 128 KiB stays in L2


def concat_chunks(parts: Sequence[Any]) -> Any:
    """Join results of consecutive plan chunks: arrays end to end, dicts and dataclasses field by field;
    anything else (per-problem scalars such as tokens per step) is the same in every chunk."""
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if isinstance(first, dict):
        return {k: concat_chunks([p[k] for p in parts]) for k in first}
    if is_dataclass(first) and not isinstance(first, type):
        joined = {f.name: concat_chunks([getattr(p, f.name) for p in parts]) for f in fields(first) if f.init}
        return type(first)(**joined)
    return first


@dataclass
class Model:
    """A problem prepared for evaluation: workload and hardware table built once."""

    problem: Problem
    workers: int = 1  # threads for batches of more than CHUNK_PLANS plans
    workload: TransformerWorkload = field(init=False)
    table: HardwareTable = field(init=False)

    def __post_init__(self) -> None:
        p = self.problem
        self.workload = lower(p.model, p.training_task, p.stack)
        self.table = HardwareTable(p.hardware)

    def terms(self, plans: PlanArrays) -> TrainingTerms:
        """The training terms of ``plans``, in chunks of CHUNK_PLANS (on ``workers`` threads when > 1).

        Every term is elementwise in the plans, so chunking changes no bit; it keeps each numpy pass over a
        column inside the CPU caches instead of streaming 8 MB temporaries through memory per 10^6 plans.
        """
        p = self.problem

        def run(part: PlanArrays) -> TrainingTerms:
            return training_terms(self.workload, p.training_task, p.stack, self.table, part)

        n = len(plans)
        if n <= CHUNK_PLANS:
            return run(plans)
        chunks = [plans.slice(i, min(i + CHUNK_PLANS, n)) for i in range(0, n, CHUNK_PLANS)]
        if self.workers > 1:  # numpy releases the GIL inside its loops
            with ThreadPoolExecutor(self.workers) as pool:
                return concat_chunks(list(pool.map(run, chunks)))
        return concat_chunks([run(c) for c in chunks])

    def arrays(self, plans: list[Plan]) -> PlanArrays:
        return PlanArrays.from_plans(plans, [self.problem.hw_index(pl) for pl in plans])

    def staged(
        self, base: PlanArrays, stage_layers: list[int], stage_recompute: list[int], stage_hw: list[int] | None = None
    ) -> TrainingTerms:
        """Terms of one uneven pipeline plan (``base`` holds one plan with vpp = 1)."""
        p = self.problem
        return staged_terms(
            self.workload, p.training_task, p.stack, self.table, base, stage_layers, stage_recompute, stage_hw
        )

    def system_index(self, name: str) -> int:
        """The first hardware option of a system (for per-stage placement, where the cluster size is free)."""
        for i, o in enumerate(self.problem.hardware):
            if o.system.name == name:
                return i
        names = ", ".join(sorted({o.system.name for o in self.problem.hardware}))
        raise ProblemError(f"unknown stage system {name!r}; allowed: {names}", file=self.problem.source,
                           field="plan.stage_systems")


@dataclass(frozen=True)
class Metrics:
    """Derived per-plan metrics (arrays), computed from the additive terms."""

    terms: TrainingTerms
    price_per_gpu_hour: Arr
    power_w_per_gpu: Arr
    train_tokens: float | None
    systems: tuple[System, ...]  # the problem's hardware options' systems (plans.hw indexes them)

    @cached_property
    def step_time_s(self) -> Arr:
        return self.terms.step_time_s

    @cached_property
    def tokens_per_s(self) -> Arr:
        return self.terms.tokens_per_step / self.step_time_s

    @cached_property
    def mfu(self) -> Arr:
        return self.terms.model_flops_per_step / (self.step_time_s * self.terms.gpus * self.terms.peak_flops)

    @cached_property
    def hfu(self) -> Arr:
        """Hardware FLOP utilisation: model + recomputed FLOPs over the peak of the task's precision."""
        return self.terms.hardware_flops_per_step / (self.step_time_s * self.terms.gpus * self.terms.peak_flops)

    @cached_property
    def cost_per_hour(self) -> Arr:
        return self.price_per_gpu_hour * self.terms.gpus

    @cached_property
    def usd_per_million_tokens(self) -> Arr:
        return usd_per_million_units(self.cost_per_hour, self.tokens_per_s)

    @cached_property
    def feasible(self) -> NDArray[np.bool_]:
        return np.asarray(self.terms.invalid == 0)


def metrics(model: Model, plans: PlanArrays, terms: TrainingTerms | None = None) -> Metrics:
    terms = model.terms(plans) if terms is None else terms
    return Metrics(
        terms=terms,
        price_per_gpu_hour=model.table.price_per_gpu_hour[plans.hw],
        power_w_per_gpu=model.table.power_w_per_gpu[plans.hw],
        train_tokens=model.problem.training_task.train_tokens,
        systems=tuple(o.system for o in model.problem.hardware),
    )


def invalid_reason(code: int, memory_total: float, capacity: float) -> str | None:
    if code == 0:
        return None
    if code == MEMORY_REASON:
        return f"memory per GPU {memory_total / 1e9:.1f} GB exceeds usable capacity {capacity / 1e9:.1f} GB"
    return INVALID_REASONS[code]


def to_records(
    model: Model, plans: PlanArrays, met: Metrics | None = None, terms_at: TermsAt | None = None
) -> list[TrainingRecord]:
    """The JSON objects of ``madmax-opt evaluate --json``, one per plan, in order. ``terms_at`` re-evaluates
    the same plans on other hardware (bottleneck attribution); default: uniform pipelines."""
    met = met or metrics(model, plans)
    t = met.terms
    p = model.problem

    # attribution evaluates the plans on slowed copies of the options they use only (a co-design record set
    # names a few of the problem's hundreds of options); ``local`` indexes those
    used = np.unique(plans.hw)
    local = replace(plans, hw=np.searchsorted(used, plans.hw).astype(plans.hw.dtype))

    def uniform_at(table: HardwareTable, blocks: int) -> dict[str, Arr]:
        n = len(used)
        many = PlanArrays.concat([replace(local, hw=local.hw + b * n) for b in range(blocks)])
        parts = [  # in chunks, like Model.terms: whole-batch temporaries would leave the caches (2.5x per plan)
            training_terms(model.workload, p.training_task, p.stack, table, many.slice(i, i + CHUNK_PLANS)).time
            for i in range(0, len(many), CHUNK_PLANS)
        ]
        return parts[0] if len(parts) == 1 else concat_chunks(parts)

    shares = (bottleneck_shares(t, p.hardware, terms_at) if terms_at is not None
              else bottleneck_shares(t, [p.hardware[int(h)] for h in used], uniform_at))
    # every column is converted to Python floats once (O(n)); per-plan indexing of numpy arrays costs ~1 us a
    # scalar, and anything recomputed per access (e.g. a sum of columns) would make this loop quadratic
    mem = {f: t.memory.total if f == "total" else getattr(t.memory, f) for f in ("total", *MEMORY_FIELDS)}
    cols = {
        "feasible": met.feasible.tolist(),
        "invalid": t.invalid.tolist(),
        "step_time_s": met.step_time_s.tolist(),
        "tokens_per_s": met.tokens_per_s.tolist(),
        "mfu": met.mfu.tolist(),
        "hfu": met.hfu.tolist(),
        "cost_per_hour_usd": met.cost_per_hour.tolist(),
        "usd_per_million_tokens": met.usd_per_million_tokens.tolist(),
        "capacity": t.capacity_bytes.tolist(),
        "gpus": np.asarray(t.gpus, dtype=np.float64).tolist(),
        "power": met.power_w_per_gpu.tolist(),
        "hw": plans.hw.tolist(),
    }
    mem_cols = {f: np.asarray(v, dtype=np.float64).tolist() for f, v in mem.items()}
    time_cols = {k: t.time[k].tolist() for k in STEP_TERMS}
    hidden_cols = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in t.hidden_comm.items()}
    seq_len = model.workload.seq_len
    flops = float(t.model_flops_per_step)
    plan_rows = plan_dicts(plans, [p.hardware[h].system.name for h in cols["hw"]])
    trust = {h: _trust(p.hardware[h]) for h in set(cols["hw"])}  # per option
    step_iv = {h: _step_interval(p.hardware[h]) for h in trust}
    out = []
    # the records hold no reference cycles: pausing the cyclic collector while they are built saves its repeated
    # traversals of the growing list (~20 % of the time at 10^5 plans); it runs again afterwards
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i in range(len(plans)):
            opt = p.hardware[cols["hw"][i]]
            tokens_per_s = cols["tokens_per_s"][i]
            rec: TrainingRecord = {
                "plan": plan_rows[i],
                "hardware": {"system": opt.system.name, "gpu": opt.gpu.name, "gpus": opt.gpus},
                "calibration": {**trust[cols["hw"][i]]},  # how much to trust it (a copy per record)
                "feasible": bool(cols["feasible"][i]),
                "infeasible_reason": invalid_reason(cols["invalid"][i], mem_cols["total"][i], cols["capacity"][i]),
                "step_time_s": cols["step_time_s"][i],
                "tokens_per_s": tokens_per_s,
                "samples_per_s": tokens_per_s / seq_len,
                "mfu": cols["mfu"][i],
                "hfu": cols["hfu"][i],
                "model_flops_per_step": flops,
                "cost_per_hour_usd": cols["cost_per_hour_usd"][i],
                "usd_per_million_tokens": cols["usd_per_million_tokens"][i],
                "memory_bytes_per_gpu": {**{f: mem_cols[f][i] for f in mem_cols}, "capacity": cols["capacity"][i]},
                "time_breakdown_s": {k: v[i] for k, v in time_cols.items()},
                "overlapped_comm_s": {k: v[i] for k, v in hidden_cols.items()},
                "bottleneck_shares": shares[i],
            }
            iv = step_iv[cols["hw"][i]]
            if iv is not None:  # the calibration level's interval on the step time; throughput = its inverse
                rec["interval"] = {"coverage": iv.coverage, "level": str(rec["calibration"].get("level")),
                                   "step_time_s": list(iv.of(cols["step_time_s"][i])),
                                   "tokens_per_s": list(iv.of_rate(tokens_per_s))}
            if met.train_tokens:
                hours = met.train_tokens / tokens_per_s / SECONDS_PER_HOUR
                gpus = cols["gpus"][i]
                rec["time_to_train"] = {
                    "hours": hours,
                    "gpu_hours": hours * gpus,
                    "cost_usd": run_cost_usd(hours, cols["cost_per_hour_usd"][i]),
                    "energy_mwh": energy_mwh(hours, gpus * cols["power"][i]),
                }
            out.append(rec)
    finally:
        if collecting:
            gc.enable()
    return out


def _trust(option: HardwareOption) -> dict[str, Any]:
    """The trust record io resolved for the option's calibration (io/calibration.py ``apply``), as JSON."""
    if option.calibration_record is None:
        raise ValueError(f"hardware option {option.name} carries no calibration record (io/calibration.apply adds it)")
    return option.calibration_record.model_dump()


def _step_interval(option: HardwareOption) -> Interval | None:
    """The option's step-time interval (its trust record's) as core/intervals.Interval; None without one."""
    iv = option.calibration_record.interval if option.calibration_record is not None else None
    return None if iv is None else Interval(iv.lo, iv.hi, iv.coverage, iv.runs)


def plan_dicts(plans: PlanArrays, systems: list[str]) -> list[dict[str, Any]]:
    """``plans.plan(i, system).model_dump()`` for every plan, built from whole columns (pydantic per plan costs
    ~40 us; the columns hold validated values already): the Plan defaults, overwritten by the array columns."""
    template = Plan().model_dump()
    columns: dict[str, list[Any]] = {}
    for name in template:
        col = getattr(plans, name, None)
        if name == "recompute":
            columns[name] = [RECOMPUTE_MODES[r] for r in plans.recompute.tolist()]
        elif isinstance(col, np.ndarray):
            columns[name] = [bool(v) for v in col.tolist()] if isinstance(template[name], bool) else col.tolist()
    columns["system"] = systems
    names = list(columns)
    return [{**template, **dict(zip(names, row, strict=True))} for row in zip(*columns.values(), strict=True)]


def _staged_at(
    model: Model, base: PlanArrays, layers: list[int], rc: list[int], stage_hw: list[int] | None = None
) -> TermsAt:
    """The terms of one uneven pipeline on other hardware (for the bottleneck attribution)."""
    p, n = model.problem, len(model.problem.hardware)

    def at(table: HardwareTable, blocks: int) -> dict[str, Arr]:
        times = [
            staged_terms(model.workload, p.training_task, p.stack, table, replace(base, hw=base.hw + b * n), layers,
                         rc, None if stage_hw is None else [h + b * n for h in stage_hw]).time
            for b in range(blocks)
        ]
        return {k: np.concatenate([t[k] for t in times]) for k in times[0]}

    return at


def staged_record(model: Model, plan: Plan) -> TrainingRecord:
    """The evaluate record of an uneven pipeline plan (per-stage layers and recompute)."""
    assert plan.stage_layers is not None and plan.stage_recompute is not None
    rc = [RECOMPUTE_MODES.index(r) for r in plan.stage_recompute]
    if plan.stage_systems is None:
        base = model.arrays([plan])
        terms = model.staged(base, list(plan.stage_layers), rc)
        at = _staged_at(model, base, list(plan.stage_layers), rc)
        rec = to_records(model, base, metrics(model, base, terms), at)[0]
    else:
        stage_hw = [model.system_index(name) for name in plan.stage_systems]
        base = PlanArrays.from_plans([plan], [stage_hw[0]])
        terms = model.staged(base, list(plan.stage_layers), rc, stage_hw)
        at = _staged_at(model, base, list(plan.stage_layers), rc, stage_hw)
        rec = to_records(model, base, metrics(model, base, terms), at)[0]
        _mixed_hardware(model, plan, stage_hw, rec)
    rec["plan"]["stage_layers"] = list(plan.stage_layers)
    rec["plan"]["stage_recompute"] = list(plan.stage_recompute)
    rec["plan"]["stage_systems"] = plan.stage_systems
    return rec


def _mixed_hardware(model: Model, plan: Plan, stage_hw: list[int], rec: TrainingRecord) -> None:
    """Hardware, price and supply of a pipeline whose stages run on different systems."""
    per_stage = int(Groups.of_plan(plan).stage)
    options = [model.problem.hardware[i] for i in stage_hw]
    systems = [o.system for o in model.problem.hardware]
    rates = stage_rates(np.array([np.nan]), systems, stage_hw, per_stage)  # the deployment's price and power only
    hourly = float(rates.usd_per_hour[0])
    use: dict[str, int] = {}
    for o in options:
        use[o.gpu.name] = use.get(o.gpu.name, 0) + per_stage
    rec["hardware"] = {"system": "+".join(dict.fromkeys(plan.stage_systems or [])),
                       "gpu": "+".join(use), "gpus": plan.gpus, "gpus_by_type": use}
    rec["cost_per_hour_usd"] = hourly
    rec["usd_per_million_tokens"] = usd_per_million_units(hourly, rec["tokens_per_s"])
    if "time_to_train" in rec:
        tt = rec["time_to_train"]
        tt["cost_usd"] = run_cost_usd(tt["hours"], hourly)
        tt["energy_mwh"] = energy_mwh(tt["hours"], float(rates.watts[0]))
    for o in model.problem.hardware:
        if o.supply is not None and use.get(o.gpu.name, 0) > o.supply and rec["feasible"]:
            rec["feasible"] = False
            rec["infeasible_reason"] = f"uses {use[o.gpu.name]} {o.gpu.name} GPUs; supply is {o.supply}"


def evaluate(problem: Problem, plans: list[Plan]) -> list[TrainingRecord]:
    """Evaluate public plans (uniform ones vectorised, uneven pipelines stage by stage), in order."""
    model = Model(problem)
    uniform = [i for i, p in enumerate(plans) if not p.uneven]
    records: dict[int, TrainingRecord] = {}
    if uniform:
        for i, rec in zip(uniform, to_records(model, model.arrays([plans[i] for i in uniform])), strict=True):
            records[i] = rec
    for i, p in enumerate(plans):
        if p.uneven:
            records[i] = staged_record(model, p)
    return [records[i] for i in range(len(plans))]
