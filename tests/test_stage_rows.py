"""Issue 26 speed work on the uneven-stage rows, checked against the plain computations it replaces:
stage_rows.candidates broadcasts the layer costs of each (recompute, hardware) over the stages and layer counts, and
every row must be bitwise the row of the fully expanded evaluation (one layer_costs row per candidate);
stage_bounds._leading counts the entries within tau of monotone rows by bisection, as the plain sums do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.units import US
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.pipeline import stage_in_flight
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import min_stage_layers
from madmax_opt.model.training import layer_costs, stage_costs
from madmax_opt.search.stage_bounds import _leading
from madmax_opt.search.stage_rows import candidates
from madmax_opt.search.stages import _bases, stage_hardware


def _expanded(model: Model, base: PlanArrays, modes: list[int], hws: list[int]) -> dict[str, Any]:
    """The candidate rows with one layer_costs row per (stage, layers, recompute, hardware)."""
    p, layers = int(base.pp[0]), model.workload.layers
    s, n, r, w = (a.ravel() for a in np.meshgrid(np.arange(p), np.arange(1, layers - p + 2), np.array(modes),
                                                 np.array(hws), indexing="ij"))
    rows = base.take(np.zeros(len(s), dtype=np.int64))
    rows = PlanArrays(**{**rows.__dict__, "recompute": r.astype(np.int64), "hw": w.astype(np.int64)})
    pr = model.problem
    lc = layer_costs(model.workload, pr.training_task, pr.stack, model.table, rows)
    sf = s.astype(np.float64)
    sc = stage_costs(lc, pr.stack, model.table.hbm_bw[rows.hw], n.astype(np.float64), (sf == 0) * 1.0,
                     (sf == p - 1) * 1.0, stage_in_flight(sf, lc.n_micro, float(p), float(base.vpp[0])))
    fits = sc.memory.total <= model.table.hbm_bytes[rows.hw] * (1.0 - pr.stack.memory_reserve_fraction)
    fits &= n >= np.array([min_stage_layers(int(i), p, int(base.vpp[0])) for i in range(p)])[s]
    return {"stage": s[fits], "layers": n[fits], "recompute": r[fits], "hw": w[fits],
            "t_us": np.rint(sc.per_micro_batch_s * US)[fits], "dp_us": np.rint(sc.dp_exposed_s * US)[fits],
            "opt_us": np.rint(sc.optimizer_s * US)[fits], "n_micro": lc.n_micro[:1]}


@pytest.mark.parametrize(("model", "hardware", "space"), [
    ({"layers": 12, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 128000},
     {"system": "dgx-a100", "gpus": 64},
     {"tp": [2, 4], "pp": [2, 4], "vpp": [1, 2], "zero": [0, 1, 2, 3], "mbs": [1, 2]}),
    ("mixtral-8x7b", {"system": "dgx-h100", "gpus": 64},
     {"tp": [1, 2], "pp": [2, 4], "ep": [1, 2, 4], "zero": [0, 1, 3], "mbs": 1}),
    ("gpt3-175b", [{"system": "dgx-h100", "gpus": 256, "supply": 128}, {"system": "dgx-a100", "gpus": 256}],
     {"tp": 8, "pp": [8, 16], "vpp": [1, 2], "mixed_stages": True}),
])
def test_candidates_bitwise_equal_expanded(model: Any, hardware: Any, space: dict[str, Any]) -> None:
    problem = problem_from_dict({"model": model, "hardware": hardware,
                                 "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64},
                                 "space": {**space, "uneven_stages": True}})
    mdl = Model(problem)
    bases = _bases(mdl)
    assert len(bases) > 0
    modes = [0, 1, 2]
    for j in np.linspace(0, len(bases) - 1, min(len(bases), 12)).astype(int).tolist():
        base = bases.take([j])
        hws = stage_hardware(mdl, base)
        got, want = candidates(mdl, base, modes, hws), _expanded(mdl, base, modes, hws)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), (j, k)


def test_leading_counts_equal_the_sums() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = (int(rng.integers(1, 5)), *rng.integers(1, 5, size=int(rng.integers(1, 3))), int(rng.integers(1, 40)))
        g = rng.integers(0, 20, size=shape).astype(np.float64)
        g[rng.random(shape) < 0.3] = np.inf
        suffix = np.minimum.accumulate(g[..., ::-1], axis=-1)[..., ::-1]  # nondecreasing, as in least_max
        prefix = np.minimum.accumulate(g, axis=-1)  # nonincreasing
        tau = rng.integers(-1, 22, size=shape[0]).astype(np.float64)
        tau[rng.random(shape[0]) < 0.2] = np.inf
        t = tau.reshape(-1, *([1] * (g.ndim - 1)))
        assert np.array_equal(_leading(suffix, tau, within=True), (suffix <= t).sum(axis=-1))
        assert np.array_equal(_leading(prefix, tau, within=False), (prefix > t).sum(axis=-1))
