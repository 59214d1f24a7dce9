"""Registries are the only lists (issue 22 item 4): a knob declared on a plan model reaches every table, CSV and
refusal through model/plan_settings.py; an objective registered once in model/objectives.py (value and integer
unit per family) is searched by the training and serving searches and named in their summaries."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import Field, create_model

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.io.limits import bounds
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.model import objectives as registry
from madmax_opt.model.objectives import IntegerUnit, Objective, Rates
from madmax_opt.model.plan_settings import (
    PARALLEL_DEGREES,
    degree_settings,
    parallel_degrees,
    plan_text,
    settings,
    shared_degrees,
    training_only_settings,
)
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan, System, TrainingDegree
from madmax_opt.report.fleet_report import PLAN_COLUMNS
from madmax_opt.search.serving import solve_result, solve_serving
from madmax_opt.search.serving_space import TRAINING_KNOBS, ServingModel
from madmax_opt.search.serving_space import admissible as serving_admissible
from madmax_opt.search.solver import admissible, candidates, solve
from madmax_opt.search.space import enumerate_plans
from madmax_opt.studies.bench_solver import KNOBS
from madmax_opt.studies.sensitivity import optimum_unchanged
from madmax_opt.studies.sweep_results import CSV_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def test_a_knob_declared_on_the_plan_model_reaches_labels_columns_and_serving_refusals() -> None:
    hsdp = create_model("HsdpPlan", __base__=Plan,
                        hsdp=(TrainingDegree, Field(1, description="HSDP: replicas of the sharded model")))
    assert parallel_degrees(hsdp) == (*PARALLEL_DEGREES, "hsdp")  # a process group (sized like a GPU count)
    assert "hsdp" not in shared_degrees(hsdp)  # a serving plan does not share it
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
    assert {d: bounds()[d].limit for d in PARALLEL_DEGREES} == dict.fromkeys(PARALLEL_DEGREES, bounds()["gpus"].limit)


def test_the_bounds_table_in_the_docs_is_the_bounds() -> None:
    """docs/limits.md lists every bounded field once with its limit (degrees from the registry included)."""
    table = {}
    for row in (ROOT / "docs" / "limits.md").read_text().splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                table[name] = float(cells[1].replace(",", ""))
    assert table == {name: b.limit for name, b in bounds().items()}


J_PER_KWH = 3.6e6
# A new per-system input, declared only here: the grid's carbon intensity (g CO2 per kWh of wall energy). It is a
# field of the system (as model/spec.py would declare it), read by the objective through Rates.per_deployment: no
# search file knows about it.
CarbonSystem = create_model("CarbonSystem", __base__=System,
                            grid_g_per_kwh=(float, Field(400.0, ge=0.0, description="grid carbon intensity")))


def with_grid(problem: Problem, g_per_kwh: dict[str, float]) -> Problem:
    """The problem with each system's grid intensity set (as data/systems.yaml would give it)."""
    hardware = tuple(dataclasses.replace(o, system=CarbonSystem(**o.system.model_dump(),
                                                                grid_g_per_kwh=g_per_kwh[o.system.name]))
                     for o in problem.hardware)
    return dataclasses.replace(problem, hardware=hardware, objective="carbon")


@pytest.fixture
def carbon(monkeypatch: pytest.MonkeyPatch) -> Objective:
    """A carbon objective registered in the one registry only (value and integer units per family)."""
    obj = Objective("carbon", "grams of CO2 per token", "g",  # type: ignore[arg-type]
                    lambda r: r.per_deployment(lambda s: s.power_w_per_gpu * s.grid_g_per_kwh / J_PER_KWH)
                    * r.seconds_per_unit,
                    IntegerUnit(1e6, "the carbon per step of the best plan", "g", 1e6, "ug per step",
                                "task.global_batch"),
                    IntegerUnit(1e9, "the carbon per output token of the best plan", "g", 1e9, "ng per output token",
                                "objective", per_step=False))
    monkeypatch.setitem(registry.OBJECTIVES, "carbon", obj)
    return obj


TWO_SYSTEMS = {"model": "llama2-7b", "hardware": [{"system": "dgx-h100", "gpus": [8, 16]},
                                                  {"system": "dgx-a100", "gpus": [8, 16]}],
               "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64}}


@pytest.mark.parametrize("grid", [{"dgx-h100": 20.0, "dgx-a100": 800.0}, {"dgx-h100": 800.0, "dgx-a100": 20.0}])
def test_a_registered_objective_with_a_new_system_input_is_searched_by_training(
    carbon: Objective, grid: dict[str, float]
) -> None:
    problem = with_grid(problem_from_dict(TWO_SYSTEMS), grid)
    out = solve(problem)
    model = Model(problem)
    c = candidates(model, enumerate_plans(problem))
    ok = admissible(model, c)
    # written out by hand from the catalog: GPUs x W per GPU x g per kWh / (J per kWh) x rounded step s, in ug per
    # step, rounded once
    names = [o.system.name for o in problem.hardware]
    watts = np.array([o.system.power_w_per_gpu for o in problem.hardware])[c.plans.hw]
    g_per_kwh = np.array([grid[n] for n in names])[c.plans.hw]
    step_s = c.step_us / US
    ug = np.rint(c.met.terms.gpus * watts * g_per_kwh / J_PER_KWH * step_s * 1e6).astype(np.int64)
    idx = np.flatnonzero(ok)
    best = idx[np.lexsort((idx, ug[idx]))][0]
    assert out.objective == ug[best]
    assert out.candidates.plans.plan(out.top[0]) == c.plans.plan(int(best))
    # the input decides: the plan runs on the system with the cleaner grid (20 vs 800 g/kWh outweighs any speed gap)
    assert names[int(c.plans.hw[best])] == min(grid, key=grid.__getitem__)


def test_a_registered_objective_is_searched_by_serving(carbon: Objective) -> None:
    base = load_problem(ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml")
    problem = with_grid(base, {o.system.name: 300.0 for o in base.hardware})
    model = ServingModel(problem)
    out = solve_serving(problem, model=model)
    c = out.candidates
    watts = np.array([o.system.power_w_per_gpu for o in problem.hardware])[c.plans.hw] * c.plans.gpus
    s_per_token = 1.0 / np.maximum(c.terms.output_tokens_per_s, 1e-30)
    ng = np.rint(watts * s_per_token * 300.0 / J_PER_KWH * 1e9)
    ok = np.flatnonzero(serving_admissible(model, c))
    assert out.top[0] == ok[np.lexsort((ok, ng[ok]))][0]
    assert solve_result(problem, 1, 60.0, 1)["solver"]["objective_unit"] == "ng per output token"


def test_rates_are_built_from_the_deployment_only() -> None:
    """Rates carry the systems and the GPUs on each, never a priced quantity: a new catalog input reaches every
    search without a change to the places that build them (the counts of docs/extending.md)."""
    assert [f.name for f in dataclasses.fields(Rates)] == [
        "seconds_per_unit", "systems", "parts", "total_units", "throughput_per_gpu"]
    builders = sorted(str(p.relative_to(ROOT / "src" / "madmax_opt")) for p in (ROOT / "src").rglob("*.py")
                      if re.search(r"\b(Rates|uniform_rates|stage_rates)\(", p.read_text(encoding="utf-8")))
    # the searches that build them (no more: a new one is a place to check)
    assert builders == ["analysis/evaluator.py", "model/objectives.py", "search/dlrm_search.py", "search/robust.py",
                        "search/serving.py", "search/serving_space.py", "search/solver.py", "search/stage_compositions.py"]


def test_what_an_objective_reads_is_asked_of_its_formula(carbon: Objective) -> None:
    """Sensitivity re-solves a power or price variant only where the objective reads that field: energy and the
    registered carbon read the power, cost the price, the time objectives neither (the table by hand)."""
    base = with_grid(problem_from_dict(TWO_SYSTEMS), {"dgx-h100": 300.0, "dgx-a100": 300.0})
    reads = {name: (not optimum_unchanged(dataclasses.replace(base, objective=name), "power"),
                    not optimum_unchanged(dataclasses.replace(base, objective=name), "price"))
             for name in registry.OBJECTIVES}
    assert reads == {"throughput": (False, False), "cost": (False, True), "time_to_train": (False, False),
                     "energy": (True, False), "carbon": (True, False)}
