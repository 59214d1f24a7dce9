"""Human output: rich tables of evaluations and solver results (human units only here, at the edge)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.records import TrainingRecord
from madmax_opt.core.units import GB
from madmax_opt.model.plan_settings import plan_text


def _ms(x: float) -> str:
    return f"{x * 1e3:,.1f}"


def calibration_text(rec: TrainingRecord) -> str:
    """How much to trust a record: its (GPU, framework) calibration and that calibration's held-out error."""
    cal = rec.get("calibration")
    if not cal:
        return "-"
    if cal["status"] != "calibrated":
        level = cal.get("level") or "prior"
        how = "prior efficiencies" if level == "prior" else f"{level}, pooled fit on {cal['runs']} runs"
        return f"[yellow]uncalibrated[/yellow] ({cal['gpu']} / {cal['framework']}: {how})"
    loso = cal.get("loso_median_err")
    held = f", held-out median error {loso:.1%}" if loso is not None else ""
    return f"{cal['gpu']} / {cal['framework']}: {cal['runs']} runs{held}"


def metric_table(title: str, plan_label: str, hw: Mapping[str, Any]) -> Table:
    """The two-column metric / value table of one plan, titled 'TITLE: PLAN on N x GPU (SYSTEM)' (every family)."""
    t = Table(title=f"{title}: {plan_label} on {hw['gpus']} x {hw['gpu']} ({hw['system']})", header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    return t


def evaluation_table(rec: TrainingRecord, title: str = "plan") -> Table:
    t = metric_table(title, plan_text(rec["plan"]), rec["hardware"])
    if not rec["feasible"]:
        t.add_row("[red]infeasible[/red]", rec["infeasible_reason"])
    t.add_row("step time (ms)", _ms(rec["step_time_s"]))
    if "interval" in rec:  # the calibration level's interval (residuals of its runs)
        iv = rec["interval"]
        lo, hi = iv.get("step_time_s", [0.0, 0.0])
        t.add_row(f"  {iv['coverage']:.0%} interval (ms)", f"{_ms(lo)} - {_ms(hi)}")
    t.add_row("tokens/s", f"{rec['tokens_per_s']:,.0f}")
    t.add_row("samples/s", f"{rec['samples_per_s']:,.2f}")
    t.add_row("MFU / HFU", f"{rec['mfu']:.1%} / {rec['hfu']:.1%}")
    t.add_row("calibration", calibration_text(rec))
    t.add_row("$ / hour", f"{rec['cost_per_hour_usd']:,.2f}")
    t.add_row("$ / M tokens", f"{rec['usd_per_million_tokens']:,.4f}")
    if "time_to_train" in rec:
        tt = rec["time_to_train"]
        t.add_row("time to train (h)", f"{tt['hours']:,.1f}")
        t.add_row("GPU-hours / $ / MWh", f"{tt['gpu_hours']:,.0f} / {tt['cost_usd']:,.0f} / {tt['energy_mwh']:,.1f}")
    t.add_section()
    step = rec["step_time_s"] or 1.0
    for k, v in rec["time_breakdown_s"].items():
        if v > 0:
            t.add_row(f"  {k} (ms)", f"{_ms(v)}  ({v / step:.1%})")
    for k, v in rec["overlapped_comm_s"].items():
        if v > 0:
            t.add_row(f"  {k} overlapped (ms)", _ms(v))
    t.add_section()
    mem = rec["memory_bytes_per_gpu"]
    for k in ("weights", "gradients", "optimizer", "activations", "temporary", "total", "capacity"):
        t.add_row(f"  memory {k} (GB)", f"{mem[k] / GB:,.2f}")
    return t


def interval_lines(records: list[TrainingRecord]) -> list[str]:
    """One caption line per calibration level among ``records``: the factors of its step-time interval."""
    levels: dict[str, tuple[float, float, float, list[int]]] = {}
    for i, r in enumerate(records):
        if "interval" in r:
            iv, st = r["interval"], r["step_time_s"]
            lo, hi = iv.get("step_time_s", [st, st])
            levels.setdefault(iv["level"], (iv["coverage"], lo / st, hi / st, []))[3].append(i + 1)
    return [f"{cov:.0%} interval of the step time: x{lo:.2f} - x{hi:.2f} (plans {', '.join(map(str, plans))}; "
            f"calibration {level})" for level, (cov, lo, hi, plans) in levels.items()]


def plans_table(records: list[TrainingRecord], title: str) -> Table:
    # readable at 80 columns: numbers never cut (no_wrap, two-line headers), text columns wrap (fold a long name)
    t = Table(title=title, header_style="bold")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("hardware", overflow="fold", min_width=8)  # system names up to 8 characters stay whole
    t.add_column("plan", overflow="fold", min_width=7)
    for col in ("step\nms", "tokens/s", "MFU", "mem\nGB", "$/M\ntok"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("ok", no_wrap=True)  # feasible: yes or no; why not is in the caption, which wraps
    for i, r in enumerate(records):
        t.add_row(
            str(i + 1),
            f"{r['hardware']['system']} x{r['hardware']['gpus']}"
            + (" [yellow]uncalibrated[/yellow]" if r.get("calibration", {}).get("status") == "uncalibrated" else ""),
            plan_text(r["plan"]),
            _ms(r["step_time_s"]),
            f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}",
            f"{r['memory_bytes_per_gpu']['total'] / GB:.1f}",
            f"{r['usd_per_million_tokens']:.3f}",
            "yes" if r["feasible"] else "no",
        )
    why = [f"plan {i + 1} infeasible: {r['infeasible_reason']}" for i, r in enumerate(records) if not r["feasible"]]
    why += interval_lines(records)
    if why:
        t.caption, t.caption_justify = "\n".join(why), "left"
    return t


def options_table(rows: list[dict[str, Any]], objective: str, serving: bool, online: bool = False) -> Table:
    """Co-design: the best plan on each system of the problem and how far its objective is from the optimum
    (``solve`` output ``options``); systems without an admissible plan say why in the caption."""
    t = Table(title=f"best plan per system (objective: {objective})", header_style="bold")
    t.add_column("system", no_wrap=True, min_width=max(len(r["system"]) for r in rows))  # names stay whole
    t.add_column("GPUs", justify="right", no_wrap=True)
    t.add_column("plan", overflow="fold", min_width=7)
    metrics = ("max rate\nreq/s", "req/s\nper GPU") if online else (
        ("tok/s\nper GPU", "TPOT\nms") if serving else ("tokens/s", "step\nms"))
    for col in (*metrics, "$/h" if online else "$/M\ntok", "vs\noptimum"):
        t.add_column(col, justify="right", no_wrap=True)
    why = []
    for r in rows:
        b = r["best"]
        if b is None:
            t.add_row(r["system"], "-", "[red]none[/red] (see below)", "-", "-", "-", "-")
            why.append(f"{r['system']}: no admissible plan: {r['reason']}")
            continue
        if online:
            first = (f"{b['max_rate']:,.2f}", f"{b['max_rate_per_gpu']:,.3f}")
            money = f"{b['cost_per_hour_usd']:,.2f}"
        else:
            first = (f"{b['output_tokens_per_s_per_gpu']:,.1f}", f"{b['tpot_s'] * 1e3:,.1f}") if serving else (
                f"{b['tokens_per_s']:,.0f}", _ms(b["step_time_s"]))
            money = f"{b['usd_per_million_tokens']:.3f}"
        gap = "optimum" if r["vs_optimum"] <= 1e-9 else f"+{r['vs_optimum']:.1%}"
        t.add_row(r["system"], str(b["hardware"]["gpus"]), plan_text(b["plan"]), *first, money, gap)
    from madmax_opt.model.objectives import objective as registered

    unit = "GPU-seconds per request at the arrival rate" if online else registered(objective).minimises
    note = f"vs optimum: this system's best / the optimum - 1, in {unit} (minimised)"
    t.caption, t.caption_justify = "\n".join([note, *why]), "left"
    return t


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, dict) and "dp" in v:  # a plan
        return plan_text(v)
    if isinstance(v, float):
        return f"{v:,.6g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def verify_table(report: Mapping[str, Any]) -> Table:
    """``madmax-opt verify``: the solver's answer beside brute force's (keys solver_X / brute_force_X side by side),
    the other facts of the check above them."""
    agree = report.get("agree")
    title = "verify: " + ("[green]the solver's optimum equals brute force[/green]" if agree else
                          "[red]the solver's optimum is worse than brute force[/red]")
    t = Table(title=title, header_style="bold")
    t.add_column("quantity", no_wrap=True)
    t.add_column("solver", overflow="fold")
    t.add_column("brute force", overflow="fold")
    pairs = [k.removeprefix("solver_") for k in report if k.startswith("solver_")]
    for k, v in report.items():
        if k == "agree" or k.startswith(("solver_", "brute_force_")):
            continue
        t.add_row(k.replace("_", " "), _value_text(v), "")
    t.add_section()
    for k in pairs:
        name = k.replace("_", " ") + (" value" if k in report else "")  # 'objective' above names it
        t.add_row(name, _value_text(report[f"solver_{k}"]), _value_text(report.get(f"brute_force_{k}", "-")))
    return t


def print_evaluations(records: list[TrainingRecord], console: Console) -> None:
    if len(records) == 1:
        console.print(evaluation_table(records[0]))
        return
    console.print(plans_table(records, "evaluated plans"))
    for i, r in enumerate(records):
        console.print(evaluation_table(r, title=f"plan {i + 1}"))


def robust_text(robust: dict[str, Any]) -> str:
    """One line: which candidates the error bars cannot tell from the best, and the best worst case
    (search/robust.py; candidates = the top plans, then each system's best)."""
    from madmax_opt.model.objectives import objective  # the registry's text for the best worst case

    k = robust["robust_choice"]
    if k is None:
        return "robust choice: no feasible plan"
    same = ", ".join(str(i + 1) for i in robust["indistinguishable_from_best"])
    how = " (chosen: --robust)" if robust["best_chosen_by"] == "robust worst case" else " (solve --robust picks it)"
    return (f"within the error bars of the best: candidate(s) {same} of {len(robust['value'])}; best worst case: "
            f"candidate {k + 1} ({objective(robust['objective']).worst_case(robust['worst_case'][k])}){how}")


def search_text(s: Mapping[str, Any]) -> str:
    """Which search ran, from the solve JSON's ``solver`` object: an exact sort of enumerated plans, or CP-SAT."""
    if s.get("method") == "enumeration":
        if "kept" in s:  # training: the space streamed, each option's best kept by the exact bound
            return (f"enumeration of {s['candidates']:,} plans ({s['admissible']:,} admissible candidates kept by "
                    "the per-option bound), exact sort")
        return f"enumeration of {s['candidates']:,} plans ({s['admissible']:,} admissible), exact sort"
    if s.get("method") == "dynamic-programme":
        return (f"bounds and dynamic programmes over {s['candidates']:,} pipeline bases (exact; no CP-SAT model "
                "needed)")
    return f"CP-SAT: candidates {s['candidates']:,}   Booleans {s['booleans']}"


def print_solution(result: dict[str, Any], console: Console) -> None:
    s = result["solver"]
    console.print(
        f"[bold]status:[/bold] {result['status']}   objective {s['objective']} (bound {s['best_bound']}, "
        f"gap {s['gap']:.3g})   {s.get('search', 'uniform')} search, {search_text(s)}   wall {s['wall_s']:.3f} s"
        + (f" (all searches {s['total_wall_s']:.3f} s)" if s.get("total_wall_s", s["wall_s"]) != s["wall_s"] else "")
    )
    console.print(evaluation_table(result["best"], title="best plan"))
    if result.get("options"):
        console.print(options_table(result["options"], result["objective"], serving=False))
    if len(result["top"]) > 1:
        console.print(plans_table(result["top"], f"top {len(result['top'])} plans"))
    if result.get("robust"):
        console.print(robust_text(result["robust"]), soft_wrap=True)
    if result.get("baseline"):
        console.print(evaluation_table(result["baseline"], title="baseline"))
        if result.get("speedup_vs_baseline"):
            console.print(f"[bold]speedup over baseline: {result['speedup_vs_baseline']:.2f}x[/bold]")
