"""Sensitivity of the optimum to the hardware: re-solve per (parameter, factor), with the plan re-optimised.

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
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from madmax_opt.analysis.attribution import main_bottleneck
from madmax_opt.analysis.evaluator import Model, metrics, staged_record, to_records
from madmax_opt.analysis.records import Record
from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.core.units import J_PER_KWH
from madmax_opt.io import calibration
from madmax_opt.io.derive import HARDWARE_PARAMETERS, PARAMETERS, derive_variant, parameter_value
from madmax_opt.io.yaml_files import shorten
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.plan_settings import plan_text
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
    rule and no constraint (power, or price without a cost objective or budget), so every candidate keeps its
    integer objective and the solver its choice; only the record's cost / energy fields change."""
    cons = problem.constraints
    unused_price = problem.objective != "cost" and cons.max_cost_per_hour is None and cons.budget_usd is None
    unused_power = problem.objective != "energy"  # the energy objective reads the power (model/objectives.py)
    return (param == "power" and unused_power) or (param == "price" and unused_price)


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


# ------------------------------------------------------------------------------------------- reports


def plan_change(base: Record | None, rec: Record | None) -> str:
    """The knobs that differ: 'tp 2->4, pp 4->2'; 'same' when none does."""
    if base is None or rec is None:
        return "-"
    a, b = base["plan"], rec["plan"]
    keys = [k for k in dict.fromkeys([*a, *b]) if k != "system"]  # every plan setting; hardware is below
    changes = [f"{k} {a.get(k)}->{b.get(k)}" for k in keys if a.get(k) != b.get(k)]
    if base["hardware"]["gpus"] != rec["hardware"]["gpus"] or base["hardware"]["gpu"].split("+")[0] != rec[
        "hardware"
    ]["gpu"].split("+")[0]:
        changes.insert(0, f"hardware {base['hardware']['gpu']}x{base['hardware']['gpus']}->"
                          f"{rec['hardware']['gpu']}x{rec['hardware']['gpus']}")
    return ", ".join(changes) or "same"


def human_value(param: str, value: float | None) -> str:
    if value is None:
        return "-"
    unit, div = PARAMETERS[param].human
    return f"{value / div:.4g} {unit}".strip()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def variant_row(study: Study, v: Variant) -> dict[str, Any]:
    """One row of the JSON table."""
    marginal, elasticity = study.marginal(v)
    rec = v.record
    return {
        "param": v.param,
        "factor": v.factor,
        "status": v.status,
        "reason": v.reason,
        "value": v.value,
        "value_human": human_value(v.param, v.value) if v.param in PARAMETERS else None,
        "tokens_per_s": study.tokens_per_s(v),
        "gain": study.gain(v),
        "marginal_gain": marginal,
        "elasticity": elasticity,
        "fixed_plan_gain": study.fixed_plan_gain(v),
        "cost_per_hour_usd": None if rec is None else rec["cost_per_hour_usd"],
        "usd_per_million_tokens": None if rec is None else rec["usd_per_million_tokens"],
        "kwh_per_million_tokens": v.kwh_per_million_tokens,
        "plan": None if rec is None else rec["plan"],
        "plan_change": plan_change(study.base.record, rec),
        "bottleneck_shares": None if rec is None else rec.get("bottleneck_shares"),
        "solved": v.solved,
        "wall_s": v.wall_s,
    }


def to_json(study: Study) -> dict[str, Any]:
    b = study.base
    return {
        "problem": study.problem.source,
        "objective": study.problem.objective,
        "params": study.params,
        "factors": study.factors,
        "base": {
            "status": b.status,
            "reason": b.reason,
            "record": b.record,
            "kwh_per_million_tokens": b.kwh_per_million_tokens,
        },
        "variants": [variant_row(study, v) for v in study.variants],
        "wall_s": study.wall_s,
        "solves": study.solves,
    }


def bottleneck(rec: Record | None) -> str:
    """The main bottleneck of a record ('-' where the record has no attribution, e.g. serving)."""
    shares = None if rec is None else rec.get("bottleneck_shares")
    return "-" if not shares else main_bottleneck(shares)


def unit(study: Study) -> str:
    return throughput_unit(study.problem)


def throughput_unit(problem: Problem) -> str:
    return "output tokens/s" if is_serving(problem) else "tokens/s"


def base_summary(study: Study) -> str:
    b = study.base.record
    if b is None:
        return f"Base problem: no feasible plan ({study.base.reason})."
    hw = b["hardware"]
    text = (f"Base optimum on {hw['gpus']} x {hw['gpu']} ({hw['system']}): {plan_text(b['plan'])}, "
            f"{throughput(b):,.0f} {unit(study)}")
    if "mfu" in b:
        text += f", MFU {b['mfu']:.1%}"
    text += f", ${b['usd_per_million_tokens']:.3f} per M tokens"
    if b.get("bottleneck_shares"):
        text += ". Bottleneck shares: " + ", ".join(
            f"{c} {x:.0%}" for c, x in b["bottleneck_shares"].items() if x >= 0.005
        )
    return text + "."


def to_markdown(study: Study, title: str | None = None, png: str | None = None) -> str:
    lines = [f"# {title or 'Hardware sensitivity: ' + study.problem.source}", "", base_summary(study), ""]
    lines += [
        f"{study.solves} solves in {study.wall_s:.2f} s (power and price, which no time term, rule or constraint "
        "uses here, keep the base plan without a solve). Gain = re-optimised throughput / base optimum - 1; "
        "marginal = over the next factor closer to 1 (elasticity = d ln throughput / d ln parameter between them); "
        "fixed plan = the base plan on the new hardware, not re-optimised ('-': it no longer fits).",
        "",
    ]
    if png:
        lines += [f"![tornado]({png})", ""]
    lines += [
        f"| parameter | factor | value | {unit(study)} | gain | marginal | elasticity | fixed plan | $/M tok | "
        "kWh/M tok | plan | plan change | main bottleneck |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in study.variants:
        r = variant_row(study, v)
        if v.record is None:
            lines.append(f"| {v.param} | {v.factor:g} | {r['value_human'] or '-'} | {v.status}: {v.reason} "
                         "| - | - | - | - | - | - | - | - | - |")
            continue
        el = "-" if r["elasticity"] is None else f"{r['elasticity']:.2f}"
        lines.append(
            f"| {v.param} | {v.factor:g} | {r['value_human']} | {r['tokens_per_s']:,.0f} | {_pct(r['gain'])} | "
            f"{_pct(r['marginal_gain'])} | {el} | {_pct(r['fixed_plan_gain'])} | "
            f"{r['usd_per_million_tokens']:.3f} | {r['kwh_per_million_tokens']:.2f} | {plan_text(v.record['plan'])} | "
            f"{r['plan_change']} | "
            f"{bottleneck(v.record)} |"
        )
    return "\n".join(lines) + "\n"


def cost_change(study: Study, v: Variant) -> float | None:
    """$ per million tokens of the re-optimised variant over the base optimum's, minus 1."""
    b = study.base.record
    if v.record is None or b is None:
        return None
    return float(v.record["usd_per_million_tokens"]) / float(b["usd_per_million_tokens"]) - 1.0


def tornado_png(study: Study, path: Path, title: str | None = None) -> Path | None:
    """Tornado chart: per parameter and factor, the re-optimised throughput gain (left) and the change of $ per
    million tokens (right); the parameter with the largest throughput swing on top."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # optional dependency (madmax-opt[plot])
        return None
    params = [p for p in study.params if any(study.gain(v) is not None for v in study.variants if v.param == p)]
    if not params:
        return None

    def swing(p: str) -> tuple[float, float]:
        rows = [v for v in study.variants if v.param == p and study.gain(v) is not None]
        gains = [study.gain(v) or 0.0 for v in rows]
        costs = [abs(cost_change(study, v) or 0.0) for v in rows]
        return max(gains) - min(min(gains), 0.0), max(costs)

    params.sort(key=swing)
    factors = sorted(study.factors)
    height = 0.8 / len(factors)
    fig, axes = plt.subplots(1, 2, sharey=True, figsize=(11.0, 0.3 * len(params) * max(1.0, len(factors) / 1.5) + 1.5),
                             gridspec_kw={"width_ratios": [3, 2]})
    cmap = plt.get_cmap("coolwarm")
    for ax, metric, label in (
        (axes[0], study.gain, f"re-optimised {unit(study)} vs base optimum (%)"),
        (axes[1], lambda v: cost_change(study, v), "$ per million tokens vs base optimum (%)"),
    ):
        for j, f in enumerate(factors):
            ys, xs = [], []
            for i, p in enumerate(params):
                x = next((metric(v) for v in study.variants if v.param == p and v.factor == f), None)
                if x is not None:
                    ys.append(i - 0.4 + (j + 0.5) * height)
                    xs.append(100.0 * x)
            tone = 0.5 + 0.5 * math.copysign(min(abs(math.log2(f)) / 2.0, 1.0), math.log2(f)) if f != 1 else 0.5
            ax.barh(ys, xs, height=height * 0.9, color=cmap(tone), edgecolor="black", linewidth=0.4, label=f"x{f:g}")
            for y, x in zip(ys, xs, strict=True):
                if abs(x) >= 0.5:
                    ax.annotate(f"{x:+.0f}%", (x, y), xytext=(3 if x > 0 else -3, 0), textcoords="offset points",
                                ha="left" if x > 0 else "right", va="center", fontsize=7)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.margins(x=0.15)
        ax.set_xlabel(label, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(params)), params)
    axes[0].legend(title="factor", fontsize=8, loc="lower right")
    fig.suptitle(title or f"Hardware sensitivity: {Path(study.problem.source).name}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_study(study: Study, out_dir: Path, stem: str, title: str | None = None) -> list[Path]:
    """``stem``.json, ``stem``.md and (with matplotlib) ``stem``.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = tornado_png(study, out_dir / f"{stem}.png", title)
    md = out_dir / f"{stem}.md"
    md.write_text(to_markdown(study, title, png.name if png else None))
    js = out_dir / f"{stem}.json"
    js.write_text(json.dumps(to_json(study), indent=2) + "\n")
    return [p for p in (md, js, png) if p is not None]




# ------------------------------------------------------------------------------------------- command


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ProblemError(f"{shorten(repr(text))} is not a comma-separated list of numbers; allowed: e.g. 0.5,2,4",
                           field=option) from None
    if not values:
        raise ProblemError("empty list; allowed: e.g. 0.5,2,4", field=option)
    return values


