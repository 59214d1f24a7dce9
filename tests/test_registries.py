"""Registries are the only lists (issue 22 item 4): a knob declared on a plan model reaches every table, CSV and
refusal through model/plan_settings.py; an objective registered once in model/objectives.py (value and integer
unit per family) is searched by the training and serving searches and named in their summaries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from pydantic import Field, PositiveInt, create_model

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.model import objectives as registry
from madmax_opt.model.objectives import IntegerUnit, Objective, Rates
from madmax_opt.model.plan_settings import (
    degree_settings,
    plan_text,
    settings,
    training_only_settings,
)
from madmax_opt.model.spec import Plan
from madmax_opt.report.fleet_report import PLAN_COLUMNS
from madmax_opt.search.serving import solve_result, solve_serving
from madmax_opt.search.serving_space import TRAINING_KNOBS, ServingModel
from madmax_opt.search.serving_space import admissible as serving_admissible
from madmax_opt.search.solver import admissible, candidates, solve
from madmax_opt.search.space import enumerate_plans
from madmax_opt.studies.bench_solver import KNOBS
from madmax_opt.studies.sweep_results import CSV_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def test_a_knob_declared_on_the_plan_model_reaches_labels_columns_and_serving_refusals() -> None:
    hsdp = create_model("HsdpPlan", __base__=Plan,
                        hsdp=(PositiveInt, Field(1, description="HSDP: replicas of the sharded model")))
    assert [s.name for s in settings(hsdp)][-1] == "hsdp"
    assert "hsdp" in degree_settings(hsdp)  # an array column of the plan (CSV, plan arrays, sensitivity)
    assert plan_text({"dp": 8, "tp": 2, "pp": 1, "hsdp": 4}, hsdp) == "dp8 tp2 pp1 hsdp4"
    assert plan_text({"dp": 8, "tp": 2, "pp": 1, "hsdp": 1}, hsdp) == "dp8 tp2 pp1"  # at its default: left out
    assert "hsdp" in training_only_settings(hsdp)  # a serving plan refuses it


def test_every_knob_list_is_the_registry() -> None:
    """The consumers read the registry: a field added to Plan is in each of them without another edit."""
    degrees = degree_settings()
    assert [c for c in CSV_COLUMNS if c in degrees] == list(degrees)  # the sweep CSV
    assert degrees == PLAN_COLUMNS  # the fleet CSV (its ep column was once always empty)
    assert tuple(d for d in degrees if d != "ep") == KNOBS  # bench-solver's exhaustive peer (a dense model)
    assert training_only_settings() == TRAINING_KNOBS  # serving refusals


CARBON_G_PER_J = 400.0 / 3.6e6  # 400 g CO2 per kWh of wall energy: a dummy grid intensity for the test


@pytest.fixture
def carbon(monkeypatch: pytest.MonkeyPatch) -> Objective:
    """A carbon objective registered in the one registry only (value and integer units per family)."""
    obj = Objective("carbon", "grams of CO2 per token", "g",  # type: ignore[arg-type]
                    lambda r: r.watts * r.seconds_per_unit * CARBON_G_PER_J,
                    IntegerUnit(1e6, "the carbon per step of the best plan", "g", 1e6, "ug per step",
                                "task.global_batch"),
                    IntegerUnit(1e9, "the carbon per output token of the best plan", "g", 1e9, "ng per output token",
                                "objective", per_step=False))
    monkeypatch.setitem(registry.OBJECTIVES, "carbon", obj)
    return obj


def test_a_registered_objective_is_searched_by_training(carbon: Objective) -> None:
    problem = problem_from_dict({"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": [8, 16]},
                                 "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64}})
    problem = dataclasses.replace(problem, objective="carbon")
    out = solve(problem)
    model = Model(problem)
    c = candidates(model, enumerate_plans(problem))
    ok = admissible(model, c)
    # written out by hand: wall W x rounded step s x g/J, in micrograms per step, rounded once
    step_s = c.step_us / US
    ug = np.rint(c.met.terms.gpus * c.met.power_w_per_gpu * step_s * CARBON_G_PER_J * 1e6).astype(np.int64)
    idx = np.flatnonzero(ok)
    best = idx[np.lexsort((idx, ug[idx]))][0]
    assert out.objective == ug[best]
    assert out.candidates.plans.plan(out.top[0]) == c.plans.plan(int(best))


def test_a_registered_objective_is_searched_by_serving(carbon: Objective) -> None:
    problem = load_problem(ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml")
    problem = dataclasses.replace(problem, objective="carbon")
    model = ServingModel(problem)
    out = solve_serving(problem, model=model)
    c = out.candidates
    r = c.rates()
    ng = np.rint(np.asarray(r.watts * r.seconds_per_unit, dtype=np.float64) * CARBON_G_PER_J * 1e9)
    ok = np.flatnonzero(serving_admissible(model, c))
    assert out.top[0] == ok[np.lexsort((ok, ng[ok]))][0]
    assert solve_result(problem, 1, 60.0, 1)["solver"]["objective_unit"] == "ng per output token"
    assert isinstance(r, Rates)
