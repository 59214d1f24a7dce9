"""The plan-settings registry: read off the plan models, so labels, CSV columns and plan columns follow a new
field without a hand-written list (issue 12: `ep` was missing from the Mixtral table and the sweep CSV)."""

from __future__ import annotations

from pydantic import Field

from madmax_opt.model.plan import KNOBS, PlanArrays
from madmax_opt.model.plan_settings import degree_settings, plan_text, settings
from madmax_opt.model.spec import Plan
from madmax_opt.search.serving_space import ServingPlan
from madmax_opt.studies.sweep_results import CSV_COLUMNS


def test_label_written_out_by_hand() -> None:
    plan = Plan(dp=64, tp=8, pp=8, vpp=4, zero=1, recompute="selective", sp=True, ep=4)
    assert plan_text(plan) == "dp64 tp8 pp8 vpp4 z1 rc=selective sp ep4"
    assert plan_text(Plan()) == "dp1 tp1 pp1"  # defaults left out, except the three degrees
    assert plan_text(None) == "-"


def test_serving_label_names_batch_precision_and_split() -> None:
    plan = ServingPlan(dp=4, tp=2, batch=256, precision="fp8", prefill_replicas=1)
    assert plan_text(plan, ServingPlan) == "dp4 tp2 pp1 batch256 precision=fp8 prefill1"


def test_uneven_split_is_in_the_label() -> None:
    plan = Plan(dp=2, pp=2, stage_layers=[3, 5], stage_recompute=["none", "full"])
    assert plan_text(plan) == "dp2 tp1 pp2 stages=3/5"


def test_training_columns_come_from_the_plan_model() -> None:
    scalar = [n for n, f in Plan.model_fields.items() if n not in ("system", "batch") and "list" not in str(f.annotation)]
    assert list(KNOBS) == list(degree_settings()) == scalar
    assert "ep" in KNOBS and "ep" in CSV_COLUMNS
    assert {f.name for f in PlanArrays.__dataclass_fields__.values()} == {*KNOBS, "hw"}
    assert "stage_layers" not in KNOBS  # per-stage lists are not plan columns


def test_a_new_field_is_a_new_setting() -> None:
    class Wider(Plan):
        dualpipe: bool = Field(False, description="a new schedule flag")

    names = [s.name for s in settings(Wider)]
    assert names[-1] == "dualpipe" and "dualpipe" in degree_settings(Wider)
    assert plan_text(Wider(dualpipe=True), Wider).endswith(" dualpipe")
