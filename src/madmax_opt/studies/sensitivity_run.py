"""Sensitivity of the optimum to the hardware, the solves: re-solve per (parameter, factor), with the plan
re-optimised (studies/sensitivity.py reports the study and re-exports these names).

For every hardware parameter (``derive.PARAMETERS``) and factor, every hardware option of the problem is scaled
(``derive.derive_variant``) and the problem solved again (``solver.solve_records``). Reported per variant: the
optimum's throughput and cost, its gain over the base optimum, the marginal gain over the next factor closer to
1.0 and the elasticity d ln(throughput) / d ln(parameter) between them, the plan change, the gain the base plan
alone would get on the new hardware (no re-optimisation), and the bottleneck shares of the new optimum.

Work shared between variants: the problem is enumerated once and the plans that no hardware parameter can make
valid (divisibility rules that depend only on plan, model and task) are dropped once; every variant but the
NVLink-domain ones (whose TP choices and TP/domain rule change) re-uses that list. The workload is lowered per
variant: it costs microseconds, so sharing it does not pay.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from madmax_opt.analysis.evaluator import Model, metrics, staged_record, to_records
from madmax_opt.analysis.records import Record
from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.core.units import J_PER_KWH
from madmax_opt.io import calibration
from madmax_opt.io.derive import HARDWARE_PARAMETERS, PARAMETERS, derive_variant, parameter_value
from madmax_opt.io.yaml_files import shorten
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.objectives import reads_system_field
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import GPU, Plan, System
from madmax_opt.model.training import MEMORY_REASON
from madmax_opt.search.family import family_of
from madmax_opt.search.solver import solve_records
from madmax_opt.search.space import enumerate_plans

DEFAULT_FACTORS: tuple[float, ...] = (0.5, 2.0, 4.0)
# A what-if factor moves one datasheet figure; 1/1000 to 1000x spans any GPU generation step (V100 -> B200 peak
# bf16: ~18x) many times over, while 1e308 would overflow the cost model (inf x 0 = NaN step times). Each factor is
# one solve per parameter, so the list is bounded too.
FACTOR_RANGE: tuple[float, float] = (1e-3, 1e3)
MAX_FACTORS = 50


def check_study(params: Sequence[str], factors: Sequence[float]) -> None:
    """One-line errors for a parameter or factor list a study cannot mean: unknown or repeated names, factors
    outside FACTOR_RANGE (or not finite), repeated factors, more than MAX_FACTORS."""
    for name in params:
        if name not in PARAMETERS:
            raise ProblemError(f"unknown parameter {shorten(repr(name))}; allowed: {', '.join(PARAMETERS)}",
                               field="--params")
    twice = sorted({n for n in params if list(params).count(n) > 1})
    if twice:
        raise ProblemError(f"{', '.join(twice)} listed twice; allowed: each parameter once", field="--params")
    if len(factors) > MAX_FACTORS:
        raise ProblemError(f"{len(factors):,} factors; allowed: at most {MAX_FACTORS} (each one is a solve per "
                           "parameter)", field="--factors")
    low, high = FACTOR_RANGE
    for f in factors:
        if not (math.isfinite(f) and low <= f <= high):
            raise ProblemError(f"factor {f:g} is out of range; allowed: numbers from {low:g} to {high:g}",
                               field="--factors")
    if len(set(factors)) != len(factors):
        raise ProblemError(f"a factor is listed twice ({', '.join(f'{f:g}' for f in factors)}); allowed: each "
                           "factor once", field="--factors")


# ------------------------------------------------------------------------------------------- variants


def variant_problem(
    problem: Problem,
    scale: dict[str, float] | None = None,
    values: dict[str, float] | None = None,
    field: str = "variant",
) -> Problem:
    """``problem`` with every hardware option derived by ``scale`` / ``values`` (see ``derive.derive_variant``)."""
    derived: dict[tuple[int, int], tuple[System, GPU]] = {}  # one derivation per distinct (system, GPU)
    options = []
    for o in problem.hardware:
        key = (id(o.system), id(o.gpu))
        if key not in derived:
            derived[key] = derive_variant(o.system, o.gpu, scale=scale, values=values, file=problem.source,
                                          field=field)
        system, gpu = derived[key]
        option = HardwareOption(system, gpu, o.gpus, o.supply)
        options.append(calibration.with_record(option, problem.stack.framework))  # the derived GPU's trust record
    return dataclasses.replace(problem, hardware=tuple(options))


def shared_plans(problem: Problem) -> PlanArrays:
    """The enumerated plans that some hardware variant may accept: valid or over memory capacity only.

    Every other validity rule depends only on the plan, the model and the task, except the TP / NVLink-domain rule,
    and NVLink-domain variants enumerate their own plans.
    """
    model = Model(problem)
    plans = enumerate_plans(problem)
    invalid = metrics(model, plans).terms.invalid
    return plans.take(np.flatnonzero((invalid == 0) | (invalid == MEMORY_REASON)))


@dataclasses.dataclass
class Variant:
    param: str
    factor: float
    status: str  # ok | infeasible | not_applicable
    reason: str | None = None
    value: float | None = None  # the parameter's new value (SI) on the first hardware option
    record: Record | None = None  # the re-optimised optimum
    fixed_plan: Record | None = None  # the base optimum's plan on this hardware, not re-optimised
    kwh_per_million_tokens: float | None = None
    wall_s: float = 0.0
    solved: bool = True  # False: the base optimum carried over (the parameter cannot change the optimum)


@dataclasses.dataclass
class Study:
    problem: Problem
    params: list[str]
    factors: list[float]
    base: Variant
    variants: list[Variant]
    wall_s: float
    solves: int

    def tokens_per_s(self, v: Variant) -> float | None:
        return None if v.record is None else throughput(v.record)

    def gain(self, v: Variant) -> float | None:
        """Throughput of the re-optimised variant over the base optimum, minus 1."""
        t, b = self.tokens_per_s(v), self.tokens_per_s(self.base)
        return None if t is None or b is None else t / b - 1.0

    def fixed_plan_gain(self, v: Variant) -> float | None:
        b = self.tokens_per_s(self.base)
        if v.fixed_plan is None or b is None or not v.fixed_plan["feasible"]:
            return None
        return throughput(v.fixed_plan) / b - 1.0

    def previous(self, v: Variant) -> Variant:
        """The variant of the same parameter with the next factor closer to 1.0 (the base for factor 1)."""
        same = [w for w in self.variants if w.param == v.param and w.status == "ok"]
        closer = [w for w in same if (1.0 <= w.factor < v.factor) or (v.factor < w.factor <= 1.0)]
        return max(closer, key=lambda w: abs(math.log(w.factor)), default=self.base)

    def marginal(self, v: Variant) -> tuple[float | None, float | None]:
        """(T(f)/T(f_prev) - 1, ln(T(f)/T(f_prev)) / ln(f/f_prev)): marginal gain and elasticity."""
        prev = self.previous(v)
        t, tp = self.tokens_per_s(v), self.tokens_per_s(prev)
        if t is None or tp is None or v.factor == prev.factor:
            return None, None
        return t / tp - 1.0, math.log(t / tp) / math.log(v.factor / prev.factor)


def run_sensitivity(
    problem: Problem,
    params: Sequence[str] = HARDWARE_PARAMETERS,
    factors: Sequence[float] = DEFAULT_FACTORS,
    *,
    time_limit_s: float = 60.0,
    workers: int = 1,
    jobs: int = 1,
    share_plans: bool = True,
    on_variant: Callable[[Variant], None] | None = None,
) -> Study:
    """Solve ``problem`` and one variant per (parameter, factor) (factor 1.0 is the base itself).

    ``jobs`` > 1 solves the variants in that many processes (each CP-SAT with ``workers`` workers; the results do
    not depend on it). ``share_plans=False`` enumerates every variant afresh (to measure what the sharing saves).
    ``on_variant`` is called with the base and then each variant as it is done (the CLI's progress bar)."""
    t0 = time.perf_counter()
    check_study(params, factors)
    plans = shared_plans(problem) if share_plans and not is_serving(problem) else None
    kwargs: dict[str, Any] = {"time_limit_s": time_limit_s, "workers": workers}
    done = on_variant or (lambda v: None)
    base = _solve_variant(problem, "base", 1.0, plans, kwargs, base_record=None)
    done(base)
    grid = [(name, f) for name in params for f in factors]
    variants: list[Variant] = []
    if jobs > 1 and len(grid) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_solve_variant, problem, n, f, plans, kwargs, base.record) for n, f in grid]
            for fut in futures:
                variants.append(fut.result())
                done(variants[-1])
    else:
        for n, f in grid:
            variants.append(_solve_variant(problem, n, f, plans, kwargs, base_record=base.record))
            done(variants[-1])
    solves = 1 + sum(v.status != "not_applicable" and v.solved for v in variants)
    return Study(problem, list(params), list(factors), base, variants, time.perf_counter() - t0, solves)


def _solve_variant(
    problem: Problem,
    param: str,
    factor: float,
    plans: PlanArrays | None,
    kwargs: dict[str, Any],
    base_record: Record | None,
) -> Variant:
    t0 = time.perf_counter()
    v = Variant(param, factor, "ok")
    if param == "base":
        vp = problem
    else:
        try:
            vp = variant_problem(problem, scale={param: factor}, field=f"{param} x{factor:g}")
        except ProblemError as exc:
            v.status, v.reason = "not_applicable", str(exc).split(": ", 2)[-1]
            return v
        first = vp.hardware[0]
        v.value = parameter_value(param, first.system, first.gpu)
    if base_record is not None:
        v.fixed_plan = fixed_plan_record(problem, vp, base_record)
    if v.fixed_plan is not None and optimum_unchanged(problem, param):
        v.record, v.solved = v.fixed_plan, False
    else:
        try:
            v.record = solve_optimum(vp, None if param == "nvlink_domain" else plans, kwargs)
        except InfeasibleError as exc:
            v.status, v.reason = "infeasible", str(exc)
    if v.record is not None:
        v.kwh_per_million_tokens = _kwh_per_million_tokens(vp, v.record)
    v.wall_s = time.perf_counter() - t0
    return v


def optimum_unchanged(problem: Problem, param: str) -> bool:
    """Whether the base optimum's plan is provably the variant's: the parameter enters no time term, no validity
    rule, no constraint (power; price without a budget) and not the objective (asked of the registry's formula:
    energy reads the power, cost the price), so every candidate keeps its integer objective and the solver its
    choice; only the record's cost / energy fields change."""
    field = {"power": "power_w_per_gpu", "price": "price_per_gpu_hour"}.get(param)
    if field is None:
        return False
    cons = problem.constraints
    if param == "price" and (cons.max_cost_per_hour is not None or cons.budget_usd is not None):
        return False
    return not reads_system_field(problem.objective, [o.system for o in problem.hardware], field)


def throughput(rec: Record) -> float:
    """Training: tokens/s; serving: output tokens/s (every serving plan uses all GPUs of its option)."""
    return float(rec["tokens_per_s"] if "tokens_per_s" in rec else rec["output_tokens_per_s"])


def is_serving(problem: Problem) -> bool:
    """Whether the problem's plans are serving plans (search/family.py)."""
    return family_of(problem).serving


def solve_optimum(problem: Problem, plans: PlanArrays | None, kwargs: dict[str, Any]) -> Record:
    """The optimum's record: ``solver.solve_records`` for training, ``serving.solve_serving`` for inference."""
    if not is_serving(problem):
        return solve_records(problem, plans=plans, **kwargs)[1][0]
    from madmax_opt.search import serving  # the inference stack, only when asked for

    model = serving.ServingModel(problem)
    outcome = serving.solve_serving(problem, model=model, **kwargs)
    records = serving.serving_records(model, outcome.candidates, outcome.top)
    serving.cross_check(outcome, records, problem.objective)
    return records[0].to_json()


def _option_index(problem: Problem, rec: Record) -> int | None:
    """The hardware option of a plan on one system; None for a mixed-stage plan (it uses several options)."""
    hw = rec["hardware"]
    return next((i for i, o in enumerate(problem.hardware) if o.system.name == hw["system"] and o.gpus == hw["gpus"]),
                None)


def fixed_plan_record(problem: Problem, vp: Problem, base_record: Record) -> Record:
    """The base optimum's plan evaluated on the variant's hardware (same option, same knobs)."""
    i = _option_index(problem, base_record)
    names = {o.system.name: w.system.name for o, w in zip(problem.hardware, vp.hardware, strict=True)}
    fields = dict(base_record["plan"])
    fields["system"] = vp.hardware[i].system.name if i is not None else names[fields["system"]]
    if is_serving(vp):
        from madmax_opt.search import serving

        knobs = {k: v for k, v in fields.items() if k in serving.ServingPlan.model_fields}
        return serving.evaluate_serving(vp, [serving.ServingPlan(**knobs)])[0].to_json()
    if fields.get("stage_systems"):
        fields["stage_systems"] = [names[s] for s in fields["stage_systems"]]
    plan = Plan(**fields)
    model = Model(vp)
    if plan.uneven:
        return staged_record(model, plan)
    assert i is not None, "a uniform plan runs on one hardware option"
    return to_records(model, PlanArrays.from_plans([plan], [i]))[0]


def _kwh_per_million_tokens(problem: Problem, rec: Record) -> float:
    """Energy per token: GPUs x wall power per GPU / throughput (a mixed-stage plan: each stage's GPUs at its
    system's power)."""
    stages = rec["plan"].get("stage_systems")
    if stages:
        power = {o.system.name: o.system.power_w_per_gpu for o in problem.hardware}
        watts = sum(rec["hardware"]["gpus"] / len(stages) * power[s] for s in stages)
    else:
        i = _option_index(problem, rec)
        assert i is not None, "a uniform plan runs on one hardware option"
        o = problem.hardware[i]
        watts = o.gpus * o.system.power_w_per_gpu
    return watts / throughput(rec) * 1e6 / J_PER_KWH
