"""``madmax-opt evaluate PROBLEM --plan PLAN --ops``: where one layer's time goes, op by op (``model/ops.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.errors import ProblemError
from madmax_opt.core.units import MB, US
from madmax_opt.io.plans import load_plans
from madmax_opt.io.problem import load_problem
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.ops import PASSES, Op, layer_ops
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import COMM_INTERFERENCE, LAYER_TERMS, layer_costs


class OpRow(BaseModel):
    """One op of one layer, one micro-batch, on one GPU (JSON record of ``evaluate --ops --json``)."""

    op: str
    pass_: str = Field(serialization_alias="pass")
    term: str
    roofline: str
    flops: float
    bytes: float
    time_s: float


class LayerOpsRecord(BaseModel):
    """The op table of one plan, and the per-layer terms it sums to (``training.LayerCosts``, exposed)."""

    plan: Plan
    stages: list[int] | None = None  # uneven pipeline: the stages (from 0) whose layers this table prices
    ops: list[OpRow]
    terms_s: dict[str, float]  # LAYER_TERMS per layer per micro-batch, as priced (collectives: exposed part)
    hidden_s: dict[str, float]  # collectives overlapped with compute
    wgrad_s: float  # weight-gradient GEMMs, added once per trainable layer
    extras_s: dict[str, float]  # per micro-batch, outside the layers: embedding, LM head + loss, pipeline p2p


def _tier(op: Op, problem: Problem, hw: int) -> str:
    """The network tier a collective's group fits in: the innermost domain holding ranks x stride GPUs."""
    if op.ranks is None or op.stride is None or float(op.ranks[0]) <= 1.0:
        return ""
    span = float(op.ranks[0] * op.stride[0])
    tiers = problem.hardware[hw].system.tiers
    return next((t.name for t in tiers if t.size is not None and span <= t.size), tiers[-1].name)


def layer_ops_records(model: Model, plan: Plan) -> list[LayerOpsRecord]:
    """The op tables of ``plan``: one, or for an uneven pipeline one per distinct (stage system, recompute)."""
    hw = model.problem.hw_index(plan)
    if plan.stage_layers is None or plan.stage_recompute is None:
        return [layer_ops_record(model, plan, hw)]
    stages: dict[tuple[int, str], list[int]] = {}
    for i, rc in enumerate(plan.stage_recompute):
        stage_hw = hw if plan.stage_systems is None else model.system_index(plan.stage_systems[i])
        stages.setdefault((stage_hw, rc), []).append(i)
    flat = {"stage_layers": None, "stage_recompute": None, "stage_systems": None}
    return [
        layer_ops_record(model, plan.model_copy(update={**flat, "recompute": rc,
                                                        "system": model.problem.hardware[h].system.name}), h, ids)
        for (h, rc), ids in stages.items()
    ]


def layer_ops_record(model: Model, plan: Plan, hw: int, stages: list[int] | None = None) -> LayerOpsRecord:
    """The op table of ``plan``'s layer on hardware option ``hw``, nonzero rows only, with the LayerCosts terms."""
    problem, wl, table = model.problem, model.workload, model.table
    arrays = PlanArrays.from_plans([plan], [hw])
    ops = layer_ops(wl, problem.training_task, problem.stack, table, arrays)
    lc = layer_costs(wl, problem.training_task, problem.stack, table, arrays)
    rows = []
    for r in sorted(ops.rows, key=lambda r: PASSES.index(r.pass_)):  # stable: table order inside a pass
        if float(r.time_s[0]) == 0.0 and float(r.flops[0]) == 0.0:
            continue
        tier = _tier(r, problem, hw)
        roofline = r.roofline if r.roofline != "collective" else f"collective {r.group}" + (f" @ {tier}" if tier else "")
        rows.append(OpRow(op=r.name, pass_=r.pass_, term=r.term, roofline=roofline, flops=float(r.flops[0]),
                          bytes=float(r.bytes[0]), time_s=float(r.time_s[0])))
    return LayerOpsRecord(
        plan=plan,
        stages=stages,
        ops=rows,
        terms_s={k: float(np.asarray(lc.time[k])[0]) for k in LAYER_TERMS},
        hidden_s={k: float(np.asarray(v)[0]) for k, v in lc.hidden.items()},
        wgrad_s=float(np.asarray(lc.wgrad_s)[0]),
        extras_s={"embedding (first stage)": float(lc.emb_time_s[0]),
                  "lm head + loss (last stage)": float(lc.head_time_s[0]),
                  "pipeline p2p (every stage)": float(lc.pp_comm_s[0])},
    )


def print_layer_ops(rec: LayerOpsRecord, console: Console) -> None:
    total = sum(r.time_s for r in rec.ops) or 1.0
    knobs = ", ".join(f"{k}={v}" for k, v in rec.plan.model_dump(exclude_none=True).items())
    where = "" if rec.stages is None else f" (stages {', '.join(map(str, rec.stages))})"
    t = Table(title=f"One layer{where}, one micro-batch, one GPU: {knobs}")
    # at 80 columns the words that tell rows apart stay whole: numbers never wrap, op and roofline fold (no "…")
    t.add_column("op", overflow="fold", min_width=11)
    t.add_column("pass", no_wrap=True)
    t.add_column("roofline", overflow="fold")
    for col in ("GFLOP", "MB", "time\nus", "% of\ntime"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rec.ops:
        t.add_row(r.op, r.pass_, r.roofline, f"{r.flops / 1e9:,.1f}", f"{r.bytes / MB:,.1f}",
                  f"{r.time_s * US:,.1f}", f"{100.0 * r.time_s / total:.1f}")
    console.print(t)
    terms = ", ".join(f"{k} {v * US:,.1f}" for k, v in rec.terms_s.items())
    hidden = ", ".join(f"{k} {v * US:,.1f}" for k, v in rec.hidden_s.items() if v > 0.0) or "none"
    console.print(f"layer terms (us, as priced; collectives exposed): {terms}")
    console.print(f"hidden under compute (us): {hidden}; an overlapped collective still slows the GEMMs under it "
                  f"by {COMM_INTERFERENCE:.0%} of its time (in tp_comm)")
    console.print(f"weight-gradient GEMMs: + {rec.wgrad_s * US:,.1f} us per trainable layer (bwd-weight rows; "
                  "compute holds fwd + bwd-input)")
    extras = ", ".join(f"{k} {v * US:,.1f}" for k, v in rec.extras_s.items())
    console.print(f"outside the layers, per micro-batch (us): {extras}")


def evaluate_ops_command(path: Path, plan_path: Path, json_out: bool, plot: Path | None, console: Console) -> None:
    """The op table of each plan in ``plan_path`` (rich tables, or JSON records with ``json_out``)."""
    if plot is not None:
        raise ProblemError("--plot draws the evaluation; with --ops there is nothing to plot", file=str(path),
                           field="--plot")
    model = Model(load_problem(path))
    records = [r for p in load_plans(plan_path, model.problem) for r in layer_ops_records(model, p)]
    if json_out:  # one table gives one object, more (plans, uneven stages) a list in plan and stage order
        dumped = [r.model_dump(mode="json", by_alias=True) for r in records]
        one = len(dumped) == 1 and not isinstance(read_yaml(plan_path), list)
        print(json.dumps(dumped[0] if one else dumped, indent=2))
        return
    for rec in records:
        print_layer_ops(rec, console)
