"""One step-time form (model/step_time.py), three readers: on random uneven plans the numpy step time
(training.staged_terms), the CP-SAT objective of the fixed assignment (stages.stage_model) and the lower bounds
(stages._lower_bounds_us, stage_bounds.strong_bounds) agree: CP-SAT = the form over the rounded stage times, numpy
within the rounding of those times, every bound at most the value."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from ortools.sat.python import cp_model

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.spec import min_stage_layers
from madmax_opt.model.step_time import step_form
from madmax_opt.search import stage_compositions, stages
from madmax_opt.search.stage_bounds import strong_bounds

LLAMA = {  # Llama-2 70B (80 layers) on 48 H100s: pp 2, 3, 6, every vpp (tests/test_stage_bounds.py)
    "model": "llama2-70b",
    "hardware": {"system": "dgx-h100", "gpus": 48},
    "task": {"seq_len": 4096, "global_batch": 96},
    "space": {"tp": 8, "cp": 1, "zero": [1, 3], "sp": True, "mbs": 1, "uneven_stages": True},
}
MIXED = {  # A100s and up to 8 H100s, each stage on either (tests/test_mixed_bounds.py)
    "model": {"layers": 10, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 32000},
    "hardware": [{"system": "dgx-a100", "gpus": 16}, {"system": "dgx-h100", "gpus": 16, "supply": 8}],
    "task": {"seq_len": 2048, "global_batch": 32},
    "space": {"dp": [1], "tp": 4, "pp": [2, 4], "cp": 1, "zero": [0, 1], "sp": True, "recompute": ["none", "full"],
              "uneven_stages": True, "mixed_stages": True},
}


def test_form_by_hand() -> None:
    """p = 4, v = 2, m = 8: T = 8 t_max + 3/2 t_mean + dp + opt; p v T = 64 t_max + 3 sum t + 8 dp + 8 opt."""
    form = step_form(8.0, 4.0, 2.0)
    t = {"compute": np.array([3.0]), "overhead": np.array([1.0])}  # bottleneck stage: 4 s per micro-batch
    terms = form.terms(t, np.array([2.0]), np.array([0.5]), np.array([0.25]))
    assert {k: float(v[0]) for k, v in terms.items()} == {
        "compute": 24.0, "overhead": 8.0, "bubble": 3.0, "dp_comm": 0.5, "optimizer": 0.25}
    assert {k: float(v[0]) for k, v in form.integer_coefficients().items()} == {
        "stage_max": 64.0, "stage_sum": 3.0, "dp_max": 8.0, "optimizer_max": 8.0}
    values = {"stage_max": np.array([4.0]), "stage_sum": np.array([8.0]), "dp_max": np.array([0.5]),
              "optimizer_max": np.array([0.25])}
    assert float(form.integer_value(values)[0]) == 8 * sum(terms[k][0] for k in terms)  # p v x T
    assert float(form.mean_bound(np.array([8.0]))[0]) == (8.0 + 1.5) * 2.0  # t_max = t_mean = 2


def _random_split(rng: np.random.Generator, layers: int, p: int, v: int) -> list[int] | None:
    fewest = [min_stage_layers(s, p, v) for s in range(p)]
    spare = layers - sum(fewest)
    if spare < 0:
        return None
    cuts = np.sort(rng.integers(0, spare + 1, size=p - 1))
    return [f + int(d) for f, d in zip(fewest, np.diff(np.concatenate([[0], cuts, [spare]])), strict=True)]


def _supply(model: Model, bases: Any, hws: list[int]) -> list[tuple[list[int], Any]] | None:
    if not model.problem.space.mixed_stages:
        return None
    per_base = [stage_compositions.stage_supply(model, bases.take([j]), hws) for j in range(len(bases))]
    return [(g, np.array([s[i][1] for s in per_base])) for i, (g, _) in enumerate(per_base[0])]


@pytest.mark.parametrize(("data", "seed"), [(LLAMA, 0), (MIXED, 1)])
def test_numpy_cp_sat_and_bounds_agree_on_random_plans(data: dict[str, Any], seed: int) -> None:
    model = Model(problem_from_dict(data))
    rng = np.random.default_rng(seed)
    bases = stages._bases(model)
    modes = sorted(set(stages.enumerate_plans(model.problem).recompute.tolist()))
    hws = stages.stage_hardware(model, bases.take([0]))
    lb_us, total_us = stages._lower_bounds_us(model, bases)
    strong = strong_bounds(model, bases, total_us, modes, hw_choices=hws if len(hws) > 1 else None,
                           supply=_supply(model, bases, hws))
    layers, checked = model.workload.layers, 0
    for j in rng.integers(0, len(bases), size=60).tolist():  # random bases, a random plan on each
        base = bases.take([j])
        p, v = int(base.pp[0]), int(base.vpp[0])
        cand = stages._candidates(model, base, modes, hws)
        split = _random_split(rng, layers, p, v)
        if split is None:
            continue
        rc = rng.choice(modes, size=p).tolist()
        hw = rng.choice(hws, size=p).tolist()
        supply = stage_compositions.stage_supply(model, base, hws)  # stages per GPU type within its supply (mixed)
        if any(sum(h in group for h in hw) > allowed for group, allowed in supply):
            continue
        rows = []
        for s in range(p):
            hit = np.flatnonzero((cand["stage"] == s) & (cand["layers"] == split[s]) & (cand["recompute"] == rc[s])
                                 & (cand["hw"] == hw[s]))
            rows.extend(hit.tolist())
        if len(rows) < p:  # a stage does not fit in memory
            continue
        # numpy: the evaluator's staged terms
        t_np = float(model.staged(base, split, rc, hw if len(hws) > 1 else None).step_time_s[0]) * US
        # CP-SAT: the stage model with this assignment fixed
        mdl, x, objective = stages.stage_model(cand, np.arange(len(cand["stage"])), p, layers, supply, vpp=v)
        for i in rows:
            mdl.add(x[i] == 1)
        mdl.minimize(objective)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        assert solver.solve(mdl) == cp_model.OPTIMAL
        pv_t = solver.objective_value
        # the form by hand over the rounded rows: m t_max + (p - 1)/v t_mean + dp_max + opt_max (us)
        m = float(cand["n_micro"][0])
        t_us, dp_us, opt_us = (cand[k][rows] for k in ("t_us", "dp_us", "opt_us"))
        by_hand = m * t_us.max() + (p - 1) / v * t_us.mean() + dp_us.max() + opt_us.max()
        assert pv_t / (p * v) == pytest.approx(by_hand, rel=1e-12)
        # numpy vs the rounded form: each rounded row is within 0.5 us, weighted by its coefficient / (p v)
        tolerance_us = 0.5 * (m + (p - 1) / v + 2.0)
        assert abs(pv_t / (p * v) - t_np) <= tolerance_us + 1e-6
        assert lb_us[j] <= t_np * (1 + 1e-12)  # linear bound: on T itself
        assert strong[j] <= pv_t  # strong bound: on p v T over the rounded rows
        checked += 1
    assert checked >= 12
