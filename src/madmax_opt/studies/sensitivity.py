"""Sensitivity of the optimum to the hardware: the study's reports (JSON, markdown, tornado chart) and its
command-line parsing. What is solved per (parameter, factor) and what the variants share is described in
studies/sensitivity_run.py, which holds the solves (re-exported here)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from madmax_opt.analysis.attribution import main_bottleneck
from madmax_opt.analysis.records import Record
from madmax_opt.core.errors import ProblemError
from madmax_opt.io.derive import HARDWARE_PARAMETERS, PARAMETERS  # noqa: F401 (HARDWARE_PARAMETERS: re-export)
from madmax_opt.io.yaml_files import shorten
from madmax_opt.model.plan_settings import plan_text
from madmax_opt.model.problem import Problem
from madmax_opt.studies.sensitivity_run import (  # noqa: F401 (re-exported: the study's solves)
    DEFAULT_FACTORS,
    FACTOR_RANGE,
    MAX_FACTORS,
    Study,
    Variant,
    _kwh_per_million_tokens,
    check_study,
    fixed_plan_record,
    is_serving,
    optimum_unchanged,
    run_sensitivity,
    shared_plans,
    solve_optimum,
    throughput,
    variant_problem,
)

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


