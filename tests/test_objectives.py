"""The objective registry: one definition per objective, honoured by every search path (property tests against
brute force with the objective's formula written out independently here)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import run_main
from madmax_opt.analysis.evaluator import Model, evaluate
from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.objectives import OBJECTIVES, ObjectiveName, Rates, energy_mwh, objective_values
from madmax_opt.model.spec import Plan
from madmax_opt.search.solver import (
    ROUNDING_TOLERANCE_S,
    admissible,
    brute_force_order,
    candidates,
    solve,
    solve_records,
)
from madmax_opt.search.space import enumerate_plans
from madmax_opt.search.stages import _bases, _candidates, stage_hardware
from strategies import small_hardware, small_models

ALL = list(OBJECTIVES)
POWER = {name: s.power_w_per_gpu for name, s in catalog.systems().items()}
PRICE = {name: s.price_per_gpu_hour for name, s in catalog.systems().items()}


# ------------------------------------------------------------------------------------------- the registry


def test_registry_names_are_the_problem_file_literal() -> None:
    assert list(get_args(ObjectiveName)) == ALL == ["throughput", "cost", "time_to_train", "energy"]


def test_formulas_by_hand() -> None:
    # 2 s per token on 4 GPUs at $9/GPU-h and 500 W per GPU ($36/h, 2 kW), 1000 tokens to train
    system = catalog.systems()["dgx-h100"].model_copy(update={"price_per_gpu_hour": 9.0, "power_w_per_gpu": 500.0})
    r = Rates(np.array([2.0]), (system,), ((np.array([0]), np.array([4.0])),), 1000.0)
    assert (r.gpus[0], r.usd_per_hour[0], r.watts[0]) == (4.0, 36.0, 2000.0)
    assert objective_values("throughput", r)[0] == 2.0
    assert objective_values("cost", r)[0] == pytest.approx(36.0 / 3600.0 * 2.0)  # $0.02 per token
    assert objective_values("time_to_train", r)[0] == 2000.0  # s
    assert objective_values("energy", r)[0] == 4000.0  # J per token
    per_gpu = Rates(r.seconds_per_unit, r.systems, r.parts, None, throughput_per_gpu=True)
    assert objective_values("throughput", per_gpu)[0] == 8.0  # GPU-s per token


LLAMA = {"model": "llama2-7b", "hardware": {"system": "dgx-h100", "gpus": 8},
         "task": {"seq_len": 2048, "global_batch": 64}}


def test_energy_mwh_by_hand_and_in_time_to_train_records() -> None:
    assert energy_mwh(720.0, 8 * 1250.0) == pytest.approx(7.2)  # a month (720 h) at 10 kW = 7,200 kWh
    (rec,) = evaluate(problem_from_dict({**LLAMA, "task": {**LLAMA["task"], "train_tokens": 1e9}}), [Plan(dp=8)])
    hours = 1e9 / rec["tokens_per_s"] / 3600.0
    assert rec["time_to_train"]["energy_mwh"] == pytest.approx(hours * 8 * POWER["dgx-h100"] / 1e6, rel=1e-12)


def test_unknown_objective_is_one_line_listing_the_registry(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**LLAMA, "objective": "speed"}))
    out = run_main("solve", path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "objective" in out.stderr and all(name in out.stderr for name in ALL)


def test_time_to_train_does_not_apply_to_serving() -> None:
    data = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": [1, 2]},
            "task": {"kind": "inference", "prompt_len": 512, "output_len": 128}, "objective": "time_to_train"}
    with pytest.raises(ProblemError, match="allowed for inference: throughput, cost, energy") as exc:
        problem_from_dict(data)
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------ independent formulas, from records / metrics


def _value(objective: str, step_s: Any, tokens_per_step: float, usd_per_hour: Any, watts: Any,
           train_tokens: float | None) -> Any:
    """Each objective written out again from its definition (not through the registry)."""
    if objective == "throughput":
        return step_s  # at fixed tokens per step: max tokens/s <=> min step time
    if objective == "cost":
        return usd_per_hour / 3600.0 * step_s  # $ per step
    if objective == "energy":
        return watts * step_s  # J per step
    assert train_tokens is not None
    return train_tokens / tokens_per_step * step_s  # s of training


# ------------------------------------------------------------------------------------------- uniform plans


@st.composite
def uniform_problems(draw: Any) -> dict[str, Any]:
    objective = draw(st.sampled_from(ALL))
    task: dict[str, Any] = {"seq_len": draw(st.sampled_from([512, 2048])),
                            "global_batch": draw(st.sampled_from([16, 64]))}
    if objective == "time_to_train":
        task["train_tokens"] = 1e9
    data: dict[str, Any] = {"model": draw(small_models([4, 8])), "hardware": draw(small_hardware(3)), "task": task,
                            "space": {"mbs": [1, 2]}, "objective": objective}
    if draw(st.booleans()):
        data["constraints"] = {"max_gpus": draw(st.sampled_from([8, 16]))}
    return data


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=uniform_problems())
def test_uniform_optimum_is_the_brute_force_optimum_of_its_objective(data: dict[str, Any]) -> None:
    problem = problem_from_dict(data)
    model = Model(problem)
    c = candidates(model, enumerate_plans(problem))
    ok = admissible(model, c)
    if not ok.any():
        with pytest.raises(InfeasibleError):
            solve(problem, model=model, plans=c.plans)
        return
    out = solve(problem, model=model, plans=c.plans, top_k=3)
    obj = c.objective(problem.objective)
    order = brute_force_order(model, c, problem.objective)
    assert out.status == "optimal" and out.objective == int(obj[order[0]])
    assert out.top == [int(i) for i in order[:3]]  # top-k by the same objective, ties by enumeration order
    met = c.met
    gpus = met.terms.gpus.astype(float)
    value = _value(problem.objective, met.step_time_s, met.terms.tokens_per_step, met.cost_per_hour,
                   gpus * met.power_w_per_gpu, met.train_tokens)
    best = float(value[ok].min())
    got = float(value[out.top[0]])
    # the solver ranks rounded steps (<= 8 x 0.5 us each) and rounded objective units: a float gap within those
    tol = best * 2 * ROUNDING_TOLERANCE_S / float(met.step_time_s[ok].min()) + 1e-9 * best
    assert best - 1e-12 <= got <= best + tol


# ------------------------------------------------------------------------------ uneven and mixed stages


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    return [tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
            for cuts in itertools.combinations(range(1, total), parts - 1)]


def _staged_brute_force(model: Model, objective: str) -> tuple[float, float]:
    """(best objective value, its step time) over every uniform plan and every split x recompute x stage system."""
    pr = model.problem
    tokens = pr.training_task.global_batch * model.workload.seq_len
    c = candidates(model, enumerate_plans(pr))  # the whole space
    ok = admissible(model, c)
    met = c.met
    uni = _value(objective, met.step_time_s, tokens, met.cost_per_hour,
                 met.terms.gpus * met.power_w_per_gpu, pr.training_task.train_tokens)
    best, best_t = (float(uni[ok].min()), float(met.step_time_s[ok][np.argmin(uni[ok])])) if ok.any() else (np.inf,
                                                                                                              np.inf)
    bases = _bases(model)
    for j in range(len(bases)):
        base = bases.take([j])
        p, per_stage = int(base.pp[0]), int(base.dp[0] * base.tp[0] * base.cp[0])
        hws = stage_hardware(model, base)
        cand = _candidates(model, base, [0], hws)
        key = {(int(s), int(n), int(h)): i for i, (s, n, h) in
               enumerate(zip(cand["stage"], cand["layers"], cand["hw"], strict=True))}
        m = round(float(cand["n_micro"][0]))
        for split in _compositions(model.workload.layers, p):
            for hw in itertools.product(hws, repeat=p):
                rows = [key.get((s, n, h)) for s, (n, h) in enumerate(zip(split, hw, strict=True))]
                if any(i is None for i in rows):
                    continue
                use = [pr.hardware[h].gpu.name for h in hw]  # GPUs per type within its supply
                if any(o.supply is not None and per_stage * use.count(o.gpu.name) > o.supply for o in pr.hardware):
                    continue
                t = [float(cand["t_us"][i]) for i in rows]
                step_us = (p * m * max(t) + (p - 1) * sum(t)) / p + max(float(cand["dp_us"][i]) for i in rows) \
                    + max(float(cand["opt_us"][i]) for i in rows)
                systems = [pr.hardware[h].system.name for h in hw]
                usd = per_stage * sum(PRICE[s] for s in systems)
                watts = per_stage * sum(POWER[s] for s in systems)
                v = _value(objective, step_us / 1e6, tokens, usd, watts, pr.training_task.train_tokens)
                if v < best:
                    best, best_t = float(v), step_us / 1e6
    return best, best_t


@st.composite
def staged_problems(draw: Any) -> dict[str, Any]:
    pp = draw(st.sampled_from([2, 3]))
    objective = draw(st.sampled_from(ALL))
    # H100 is faster, A100 cheaper per GPU-hour; a supply on the second system forces mixed pipelines to mix
    systems = draw(st.sampled_from([["dgx-a100", "dgx-h100"], ["dgx-h100", "dgx-a100"], ["dgx-a100"]]))
    task: dict[str, Any] = {"seq_len": 2048, "global_batch": draw(st.sampled_from([8, 16]))}
    if objective == "time_to_train":
        task["train_tokens"] = 1e10
    return {
        "model": {"layers": draw(st.sampled_from([4, 5, 6])), "hidden": 2048, "heads": 16, "ffn": 8192,
                  "vocab": draw(st.sampled_from([32000, 128000]))},
        "hardware": [{"system": s, "gpus": 4 * pp, **({"supply": 4 * (pp - 1)} if i and draw(st.booleans()) else {})}
                     for i, s in enumerate(systems)],
        "task": task,
        "space": {"dp": 1, "tp": 4, "pp": pp, "vpp": 1, "cp": 1, "mbs": 1, "zero": 0, "sp": True,
                  "recompute": "none", "uneven_stages": True, "mixed_stages": len(systems) > 1 and draw(st.booleans())},
        "stack": {"flash_attention": True},
        "objective": objective,
    }


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=staged_problems())
def test_uneven_and_mixed_optimum_is_the_brute_force_optimum_of_its_objective(data: dict[str, Any]) -> None:
    problem = problem_from_dict(data)
    model = Model(problem)
    best, best_t = _staged_brute_force(model, problem.objective)
    if not np.isfinite(best):
        with pytest.raises(InfeasibleError):
            solve_records(problem)
        return
    _, recs = solve_records(problem)
    rec = recs[0]
    plan = rec["plan"]
    systems = plan["stage_systems"] or [plan["system"]] * plan["pp"]
    per_stage = plan["dp"] * plan["tp"] * plan["cp"]
    watts = per_stage * sum(POWER[s] for s in systems)
    tokens = problem.training_task.global_batch * model.workload.seq_len
    got = _value(problem.objective, rec["step_time_s"], tokens, rec["cost_per_hour_usd"], watts,
                 problem.training_task.train_tokens)
    m = problem.training_task.global_batch // per_stage
    # rounding: stage times (1 us each, m + p - 1 times) and the margin an uneven plan must win by
    tol_s = 3 * (m + plan["pp"] + 2) * 0.5e-6 + 2 * ROUNDING_TOLERANCE_S
    assert abs(got - best) <= best * tol_s / best_t + 1e-12, (plan, got, best)


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pp", [pytest.param(8, id="pp8"), pytest.param(None, id="full", marks=pytest.mark.slow)])
def test_mixed_pipeline_cost_ranks_by_cost(pp: int | None) -> None:
    """Reproducer (issue 12): `objective: cost` on the mixed-pipeline example returned an uneven plan at $2.936 per
    M tokens ranked above a uniform plan at $2.832. Now the first plan is the cheapest: no worse than the cheapest
    uniform plan (brute force) and ranked by cost."""
    data = yaml.safe_load((ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml").read_text())
    data["objective"] = "cost"
    if pp is not None:
        data["space"]["pp"] = pp
    problem = problem_from_dict(data)
    model = Model(problem)
    c = candidates(model, enumerate_plans(problem))
    ok = admissible(model, c)
    cheapest_uniform = float(c.met.usd_per_million_tokens[ok].min())
    out, recs = solve_records(problem, top_k=2)
    costs = [r["usd_per_million_tokens"] for r in recs]
    assert costs == sorted(costs)
    assert costs[0] <= cheapest_uniform * (1 + 1e-6)
    assert out.uneven is not None and out.uneven.status in ("optimal", "no-improvement")


# ------------------------------------------------------------------------------------------------ serving


@st.composite
def serving_problems(draw: Any) -> dict[str, Any]:
    heads = draw(st.sampled_from([8, 16]))
    task: dict[str, Any] = {"kind": "inference", "prompt_len": draw(st.sampled_from([256, 2048])),
                            "output_len": draw(st.sampled_from([64, 256])),
                            "precision": draw(st.sampled_from(["bf16", ["bf16", "int8"]]))}
    if draw(st.booleans()):
        task["tpot_s"] = draw(st.sampled_from([0.005, 0.02]))
    return {
        "model": {"layers": draw(st.sampled_from([4, 8])), "hidden": heads * 128, "heads": heads, "kv_heads": 2,
                  "ffn": 4 * heads * 128, "ffn_kind": "swiglu", "vocab": 32000},
        "hardware": [{"gpu": draw(st.sampled_from(["h100-sxm", "a100-80gb", "b200"])), "gpus": [1, 2, 8]},
                     {"gpu": draw(st.sampled_from(["a100-40gb", "mi300x"])), "gpus": [4]}],
        "task": task,
        "objective": draw(st.sampled_from([n for n, o in OBJECTIVES.items() if not o.needs_total_units])),
    }


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=serving_problems())
def test_serving_optimum_is_the_brute_force_optimum_of_its_objective(data: dict[str, Any]) -> None:
    from madmax_opt.search import serving

    problem = problem_from_dict(data)
    model = serving.ServingModel(problem)
    c = serving.candidates(model)
    ok = serving.admissible(model, c)
    if not ok.any():
        with pytest.raises(InfeasibleError):
            serving.solve_serving(problem, model=model, plans=c.plans)
        return
    out = serving.solve_serving(problem, model=model, plans=c.plans)
    tps = c.terms.output_tokens_per_s
    gpus = c.plans.gpus.astype(float)
    watts = gpus * np.array([o.system.power_w_per_gpu for o in problem.hardware])[c.plans.hw]
    value, unit = {  # per output token, written out: GPU-s (throughput per GPU), $, J; and the integer unit
        "throughput": (gpus / tps, 1e9),
        "cost": (c.cost_per_hour / 3600.0 / tps, 1e12),
        "energy": (watts / tps, 1e6),
    }[problem.objective]
    best = float(value[ok].min())
    got = float(value[out.top[0]])
    assert out.status == "optimal"
    assert best - 1e-15 <= got <= best + 1.0 / unit  # both sides rounded once to the integer unit



@pytest.mark.parametrize(("objective", "label"), [("throughput", "GPU-ns per token"),
                                                  ("cost", "uUSD per million tokens"),
                                                  ("energy", "uJ per output token")])
def test_serving_summary_names_the_integer_unit_of_its_objective(objective: str, label: str) -> None:
    """The integer column's unit, written out: J x 1e6 per output token is uJ (was labelled GPU-ns, issue 22)."""
    from madmax_opt.search import serving

    problem = problem_from_dict({
        "model": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 2, "ffn": 4096, "ffn_kind": "swiglu",
                  "vocab": 32000},
        "hardware": {"gpu": "h100-sxm", "gpus": [1, 2]},
        "task": {"kind": "inference", "prompt_len": 256, "output_len": 64, "precision": "bf16"},
        "objective": objective,
    })
    out = serving.solve_result(problem, top_k=1, time_limit=10.0, workers=1)
    assert out["solver"]["objective_unit"] == label


# ---------------------------------------------------------------------------------------- DLRM placement


@pytest.mark.parametrize("objective", ALL)
@pytest.mark.parametrize("hardware", [
    [{"system": "zionex", "gpus": [8, 16]}, {"system": "dgx-h100", "gpus": 8}],
    [{"system": "dgx-a100", "gpus": 16}, {"system": "zionex", "gpus": 8}],
], ids=["zionex-h100", "a100-zionex"])
def test_dlrm_optimum_is_the_best_option_by_its_objective(objective: str, hardware: list[dict[str, Any]]) -> None:
    """Across hardware options the returned plan minimises the objective (each option's plan: its best dense plan
    with CP-SAT placements, which test_placement checks against brute force)."""
    from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict
    from madmax_opt.search.dlrm_search import dlrm_status, solve_dlrm

    problem = dlrm_problem_from_dict({"model": "dlrm-a-small", "hardware": hardware,
                                      "task": {"global_batch": 8192, "train_samples": 1e9}, "objective": objective})
    best, results = solve_dlrm(problem, time_limit_s=10.0)
    power = {o.name: o.gpus * o.system.power_w_per_gpu for o in problem.hardware}

    def value(rec: dict[str, Any]) -> float:  # per sample: s, $, s of training, J
        hw = rec["hardware"]
        s_per_sample = 1.0 / rec["samples_per_s"]
        return {"throughput": s_per_sample, "cost": rec["cost_per_hour_usd"] / 3600.0 * s_per_sample,
                "time_to_train": 1e9 * s_per_sample, "energy": power[f"{hw['system']}x{hw['gpus']}"] * s_per_sample,
                }[objective]

    records = [r.record for r in results if r.record is not None]
    assert len(records) >= 2 and value(best) == min(value(r) for r in records)
    assert dlrm_status(results) == "optimal"


# ----------------------------------------------------------------------------------- sweeps and sensitivity


def test_sweep_rows_are_solved_with_their_objective(tmp_path: Path) -> None:
    """Every (problem, objective) row of a sweep is the brute-force optimum of that objective."""
    from madmax_opt.studies.sweep import run_sweep
    from madmax_opt.studies.sweep_results import read_rows
    from madmax_opt.studies.sweep_spec import RESULTS_FILE, load_sweep

    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "models": ["llama2-7b"], "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64,
                                          "train_tokens": 1e9},
        "hardware": [{"system": "dgx-h100", "gpus": [8, 16]}], "objectives": ALL}))
    sweep = load_sweep(sweep_file)
    run_sweep(sweep, tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out" / RESULTS_FILE)
    assert sorted({c.label["objective"] for c in sweep.combinations}) == sorted(ALL)
    for c in sweep.combinations:
        row = rows[c.key]
        assert row["status"] == "ok" and row["result"]["objective"] == c.label["objective"]
        problem = problem_from_dict(c.problem)
        model = Model(problem)
        cands = candidates(model, enumerate_plans(problem))
        ok = admissible(model, cands)
        met = cands.met
        value = _value(problem.objective, met.step_time_s, met.terms.tokens_per_step, met.cost_per_hour,
                       met.terms.gpus * met.power_w_per_gpu, met.train_tokens)
        best = row["result"]["best"]
        got = _value(problem.objective, best["step_time_s"], met.terms.tokens_per_step, best["cost_per_hour_usd"],
                     best["hardware"]["gpus"] * POWER["dgx-h100"], met.train_tokens)
        assert float(value[ok].min()) <= got <= float(value[ok].min()) * (1 + 1e-6)


def test_sensitivity_re_solves_power_under_the_energy_objective() -> None:
    """Power enters no time term, so it cannot move a throughput optimum; under `objective: energy` it can."""
    from madmax_opt.studies.sensitivity import optimum_unchanged

    energy = problem_from_dict({**LLAMA, "objective": "energy"})
    assert not optimum_unchanged(energy, "power")
    assert optimum_unchanged(problem_from_dict(LLAMA), "power")
