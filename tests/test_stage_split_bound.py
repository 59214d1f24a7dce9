"""The split bound (search/stage_split_bound.py) never proves a limit that a split meets: on random row sets it is
checked against every split by enumeration, and it does prove limits just below the optimum when the rows allow it
(issue 26: it skips most of the uneven search's CP-SAT infeasibility proofs)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from madmax_opt.io.problem import load_problem
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.solver import solve_records
from madmax_opt.search.stage_split_bound import SplitProofs, split_bound

COEFF = {"stage_max": 24, "stage_sum": 2, "dp_max": 3, "optimizer_max": 3}  # p v m, p - 1, p v, p v at p 3, v 1


def _rows(rng: np.random.Generator, p: int, layers: int) -> dict[str, np.ndarray]:
    """Random rows per (stage, layers 1..L-p+1, hardware 0/1), time and DP sync growing with the layers."""
    s, n, h = (a.ravel() for a in np.meshgrid(np.arange(p), np.arange(1, layers - p + 2), np.arange(2), indexing="ij"))
    keep = rng.random(len(s)) < 0.8
    per_layer = np.where(h == 1, 7.0, 10.0) + rng.integers(0, 3, len(s))
    return {"stage": s[keep], "layers": n[keep], "hw": h[keep],
            "t": (n * per_layer + rng.integers(0, 20, len(s)))[keep].astype(np.float64),
            "dp": (n * rng.integers(1, 6, len(s)))[keep].astype(np.float64),
            "opt": rng.integers(0, 5, len(s))[keep].astype(np.float64)}


def _optimum(r: dict[str, np.ndarray], p: int, layers: int, groups: list[tuple[list[int], int, int]]) -> float:
    """The least p v T over every split (one row per stage), by enumeration; inf when none."""
    best = np.inf
    per_stage = [np.flatnonzero(r["stage"] == s) for s in range(p)]
    for pick in itertools.product(*per_stage):
        rows = np.array(pick)
        if r["layers"][rows].sum() != layers:
            continue
        on = [int(np.isin(r["hw"][rows], hws).sum()) for hws, _, _ in groups]
        if any(not lo <= k <= hi for k, (_, lo, hi) in zip(on, groups, strict=True)):
            continue
        value = (COEFF["stage_max"] * r["t"][rows].max() + COEFF["stage_sum"] * r["t"][rows].sum()
                 + COEFF["dp_max"] * r["dp"][rows].max() + COEFF["optimizer_max"] * r["opt"][rows].max())
        best = min(best, float(value))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_split_bound_proves_only_limits_no_split_meets(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p, layers = 3, int(rng.integers(6, 10))
    r = _rows(rng, p, layers)
    if any(not np.any(r["stage"] == s) for s in range(p)):
        pytest.skip("a stage without rows")
    groups = [([1], 0, int(rng.integers(0, 3)))] if seed % 3 else ([([1], 1, 1)] if seed % 2 else [])
    opt = _optimum(r, p, layers, groups)
    proved_below = 0
    for limit in (opt - 1, opt, opt + 1, opt - 50, 0.9 * opt) if np.isfinite(opt) else (10**6,):
        got, _ = split_bound(r["stage"], r["layers"], r["t"], r["dp"], r["opt"], r["hw"], p, layers, COEFF,
                             int(limit), groups)
        if limit >= opt:
            assert not got, f"limit {limit} is met by a split of p v T {opt}"
        proved_below += got
    assert proved_below >= 1  # at least the far limits (0.9 x the optimum, or no split at all) are proved


@pytest.mark.parametrize("seed", range(24))
def test_split_bound_proves_the_limit_just_below_the_optimum(seed: int) -> None:
    """With at most one limited GPU type the split bound is exact once the DP and optimizer maxima are taken exactly
    (_exact_maxima): the limit one below the enumerated optimum is proved, the optimum itself is not."""
    rng = np.random.default_rng(100 + seed)
    p, layers = 3, int(rng.integers(6, 10))
    r = _rows(rng, p, layers)
    groups = [([1], 0, int(rng.integers(0, 3)))] if seed % 3 else ([([1], 1, 1)] if seed % 2 else [])
    opt = _optimum(r, p, layers, groups)
    if not np.isfinite(opt) or any(not np.any(r["stage"] == s) for s in range(p)):
        pytest.skip("no split")
    args = (r["stage"], r["layers"], r["t"], r["dp"], r["opt"], r["hw"], p, layers, COEFF)
    assert split_bound(*args, int(opt) - 1, groups)[0]
    assert not split_bound(*args, int(opt), groups)[0]


def test_no_split_holds_the_layers() -> None:
    """Rows whose layers cannot sum to L: every limit is proved."""
    stage, layers_of = np.array([0, 1]), np.array([1, 1])
    t = np.array([5.0, 5.0])
    zero = np.zeros(2)
    assert split_bound(stage, layers_of, t, zero, zero, np.zeros(2, dtype=np.int64), 2, 5, COEFF, 10**9, [])[0]


def test_mixed_pipeline_example_same_plan_with_fewer_cp_sat_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """problems/gpt3-175b-mixed-pipeline.yaml: the same objective and status with the split bound and the proofs
    reused across bases as without them, from fewer CP-SAT models (13 before issue 26's change). Without the split
    bound, the first pass finds no split of its own (its dynamic programme is the split bound's): CP-SAT finds the
    incumbents, and may return another split of the same objective."""
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "gpt3-175b-mixed-pipeline.yaml")

    def run() -> tuple[Any, list[Any], int]:
        opts = CpSatOptions()
        outcome, recs = solve_records(problem, top_k=2, cpsat=opts)
        return outcome, recs, len(opts.solved)

    fast, fast_recs, fast_models = run()
    monkeypatch.setattr(SplitProofs, "excludes", lambda *_args, **_kw: False)
    slow, slow_recs, slow_models = run()
    assert [r["plan"] for r in fast_recs[1:]] == [r["plan"] for r in slow_recs[1:]]  # the best uniform plan
    assert (fast.status, fast.objective) == (slow.status, slow.objective)
    assert fast.uneven is not None and slow.uneven is not None
    assert (fast.uneven.status, fast.uneven.objective) == (slow.uneven.status, slow.uneven.objective)
    assert fast_models < slow_models


@pytest.mark.parametrize("seed", range(12))
def test_a_returned_split_is_one_row_per_stage_within_every_limit(seed: int) -> None:
    """When the bound cannot exclude the limit, the split it returns (CP-SAT's hint) is a split that meets it."""
    rng = np.random.default_rng(seed)
    p, layers = 3, int(rng.integers(6, 10))
    r = _rows(rng, p, layers)
    groups = [([1], 0, int(rng.integers(1, 3)))] if seed % 2 else [([1], 1, 1)]
    opt = _optimum(r, p, layers, groups)
    if not np.isfinite(opt):
        pytest.skip("no split")
    limit = int(opt * 1.05)
    excluded, rows = split_bound(r["stage"], r["layers"], r["t"], r["dp"], r["opt"], r["hw"], p, layers, COEFF, limit,
                                 groups)
    assert not excluded
    if rows is not None:
        assert sorted(r["stage"][rows].tolist()) == list(range(p))
        assert r["layers"][rows].sum() == layers
        assert all(lo <= np.isin(r["hw"][rows], hws).sum() <= hi for hws, lo, hi in groups)
        value = (COEFF["stage_max"] * r["t"][rows].max() + COEFF["stage_sum"] * r["t"][rows].sum()
                 + COEFF["dp_max"] * r["dp"][rows].max() + COEFF["optimizer_max"] * r["opt"][rows].max())
        assert opt <= value <= limit
