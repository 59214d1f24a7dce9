"""Serving records as rich tables (one plan, the Pareto front, a solve result) and the serving plan files that
``madmax-opt evaluate`` reads (report/families.py prints their records)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.serving_records import ServingRecord
from madmax_opt.model.plan_settings import plan_text
from madmax_opt.report.report import metric_table, search_text


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f}"


def record_table(rec: ServingRecord, title: str = "plan") -> Table:
    t = metric_table(title, plan_text(rec.plan), rec.hardware.model_dump())
    if not rec.feasible:
        t.add_row("[red]infeasible[/red]", str(rec.infeasible_reason))
    t.add_row("TTFT (ms)", _ms(rec.ttft_s))
    t.add_row("TPOT (ms)", _ms(rec.tpot_s))
    iv = rec.interval  # the calibration level's interval (held-out residuals of that level)
    if iv is not None and iv.tpot_s is not None:
        t.add_row(f"  {iv.coverage:.0%} interval (ms, {iv.level})", f"{_ms(iv.tpot_s[0])} - {_ms(iv.tpot_s[1])}")
    t.add_row("output tokens/s", f"{rec.output_tokens_per_s:,.0f}")
    t.add_row("output tokens/s per GPU", f"{rec.output_tokens_per_s_per_gpu:,.1f}")
    if iv is not None and iv.output_tokens_per_s_per_gpu is not None:
        lo, hi = iv.output_tokens_per_s_per_gpu
        t.add_row(f"  {iv.coverage:.0%} interval ({iv.level})", f"{lo:,.1f} - {hi:,.1f}")
    t.add_row("max batch per replica (KV cache)", f"{rec.max_batch:,}")
    t.add_row("running batch (offered)", f"{rec.running_batch:,} ({rec.plan.batch:,})")
    if rec.queue_wait_s > 0:
        t.add_row("queue wait (ms, in TTFT)", _ms(rec.queue_wait_s))
    cal = rec.calibration
    t.add_row(
        "calibration",
        f"{cal['gpu']} / {cal['framework']}: "
        + (
            f"{cal['runs']} runs, LOSO median {cal['loso_median_err']:.0%}"
            if cal["status"] == "calibrated" and cal["loso_median_err"] is not None
            else f"{cal['runs']} runs, uncalibrated on {', '.join(cal['uncalibrated_on'])} (LOSO median "
            f"{cal['loso_median_err']:.0%})"
            if cal.get("uncalibrated_on") and cal["loso_median_err"] is not None
            else f"{cal['level']} (uncalibrated)"
        ),
    )
    t.add_row("KV cache per GPU (GB)", f"{rec.kv_cache_bytes_per_gpu / 1e9:,.2f}")
    t.add_row("$ / M output tokens", f"{rec.usd_per_million_tokens:,.4f}")
    t.add_section()
    for k, v in rec.tpot_breakdown_s.items():
        if v > 0:
            t.add_row(f"  TPOT {k} (ms)", _ms(v))
    t.add_section()
    for k, v in rec.memory_bytes_per_gpu.items():
        t.add_row(f"  memory {k} (GB)", f"{v / 1e9:,.2f}")
    return t


def pareto_table(rows: list[ServingRecord], title: str = "throughput vs latency (Pareto front)") -> Table:
    t = Table(title=title, header_style="bold")
    # at 80 columns numbers never wrap and the plan folds rather than losing its last words ("precision=...")
    for col in ("TPOT\nms", "TTFT\nms", "tok/s\nper GPU", "tok/s", "hardware", "plan", "targets"):
        left = col in ("hardware", "plan")
        t.add_column(col, justify="left" if left else "right", no_wrap=not left, overflow="fold" if left else "ellipsis")
    for r in rows:
        t.add_row(
            _ms(r.tpot_s),
            _ms(r.ttft_s),
            f"{r.output_tokens_per_s_per_gpu:,.1f}",
            f"{r.output_tokens_per_s:,.0f}",
            f"{r.hardware.system} x{r.hardware.gpus}",
            plan_text(r.plan),
            "met" if r.meets_targets else "-",
        )
    return t


def print_records(records: list[ServingRecord], console: Console) -> None:
    for i, r in enumerate(records):
        console.print(record_table(r, title=f"plan {i + 1}" if len(records) > 1 else "plan"))


def print_result(result: dict[str, Any], console: Console) -> None:
    """A serving ``solve --json`` object as tables; its records are read back as ``ServingRecord`` s."""
    s = result["solver"]
    console.print(
        f"[bold]status:[/bold] {result['status']}   objective {s['objective']} {s['objective_unit']}   "
        f"{search_text(s)}   wall {s['wall_s']:.3f} s"
    )
    console.print(record_table(ServingRecord.model_validate(result["best"]), title="best plan"))
    if result.get("options"):
        from madmax_opt.report.report import options_table

        console.print(options_table(result["options"], result["objective"], serving=True))
    for i, r in enumerate(result["top"][1:], start=2):
        console.print(record_table(ServingRecord.model_validate(r), title=f"plan {i}"))
    console.print(pareto_table([ServingRecord.model_validate(r) for r in result["pareto"]]))
    if result.get("baseline"):
        console.print(record_table(ServingRecord.model_validate(result["baseline"]), title="baseline"))
        if result.get("speedup_vs_baseline"):
            console.print(f"[bold]speedup over baseline: {result['speedup_vs_baseline']:.2f}x[/bold]")


# ------------------------------------------------------------------------------------------ evaluate


def load_serving_plans(path: Path) -> tuple[list[Any], bool]:
    """Plans of an inference problem (ServingPlan keys: + precision, prefill_replicas); whether it was a list."""
    from madmax_opt.core.errors import ProblemError
    from madmax_opt.io.validate import validate
    from madmax_opt.io.yaml_files import read_yaml
    from madmax_opt.search.serving import ServingPlan

    data = read_yaml(path, what="plan file")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        keys = ", ".join(ServingPlan.model_fields)
        raise ProblemError(
            f"expected a plan; allowed: a mapping with keys {{{keys}}} or a non-empty list of them",
            file=str(path),
        )
    plans = [
        validate(ServingPlan, x, file=str(path), prefix=f"[{i}]" if isinstance(data, list) else "")
        for i, x in enumerate(items)
    ]
    return plans, isinstance(data, list)
