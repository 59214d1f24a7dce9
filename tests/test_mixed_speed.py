"""Issue 26, the mixed-pipeline example fast: the uneven search's two passes (the first without CP-SAT, its dynamic
programme's splits as incumbents; stages.DEFER) and the direct count of stage_bounds._leading on small arrays change
no optimum: the same objective and bound as the one-pass search, which solves every model it meets with CP-SAT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search import stage_bounds, stage_split_bound, stages
from madmax_opt.search.solver import solve_records
from test_mixed_bounds import CASES, _counting

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml"


def _outcome(data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, defer: bool,
             exact: bool = True) -> tuple[Any, list[int], Any]:
    """(solve outcome, one entry per CP-SAT model solved, the best record) with ``stages.DEFER`` = ``defer``, the
    split bound's exact maxima on or off."""
    calls = _counting(monkeypatch)
    monkeypatch.setattr(stages, "DEFER", defer)
    if not exact:
        monkeypatch.setattr(stage_split_bound, "EXACT_COMBOS", 0)
    out, rec = solve_records(problem_from_dict(data))
    monkeypatch.undo()
    return out, calls, rec[0]


def test_two_passes_find_the_one_pass_optimum_without_cp_sat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example, the split bound's maxima by their means: the one-pass search solves 4 CP-SAT models (3 improving
    plans, then a proof); the two-pass search reaches the same optimum by its dynamic programmes alone and solves one
    (a proof). With the maxima exact (the default) the proof needs no model either."""
    data = yaml.safe_load(EXAMPLE.read_text())
    two, two_calls, two_rec = _outcome(data, monkeypatch, True, exact=False)
    one, one_calls, one_rec = _outcome(data, monkeypatch, False, exact=False)
    exact, exact_calls, exact_rec = _outcome(data, monkeypatch, True)
    assert two.uneven.status == one.uneven.status == exact.uneven.status == "optimal"
    assert two.objective == one.objective == exact.objective and two.best_bound == one.best_bound
    assert (len(two_calls), len(one_calls), len(exact_calls)) == (1, 4, 0)
    assert two_rec["plan"] == exact_rec["plan"]  # the first pass's split, proven by CP-SAT or by the exact maxima
    # equal objectives, to the microsecond rounding of the rows (stage_rows.rounding_us)
    tol = two.uneven.tolerance_s(512 / (two_rec["plan"]["dp"] * two_rec["plan"]["mbs"]), two_rec["plan"]["pp"])
    assert abs(two_rec["step_time_s"] - one_rec["step_time_s"]) <= 2 * tol


@pytest.mark.parametrize("objective", ["throughput", "cost"])
def test_two_passes_equal_one_pass_on_small_mixed_problems(monkeypatch: pytest.MonkeyPatch, objective: str) -> None:
    """Three small mixed problems (tests/test_mixed_bounds.py), throughput and cost (a CP-SAT model per composition):
    the same objective, bound and status as the one-pass search without the exact maxima (CP-SAT decides)."""
    models = 0
    for case in CASES:
        data = {**case, "objective": objective}
        two, _, _ = _outcome(data, monkeypatch, True)
        one, one_calls, _ = _outcome(data, monkeypatch, False, exact=False)
        models += len(one_calls)
        assert (two.objective, two.best_bound, two.uneven.status) == (one.objective, one.best_bound, one.uneven.status)
    assert models  # the reference is CP-SAT's


@pytest.mark.parametrize("within", [True, False])
def test_leading_direct_equals_bisection(monkeypatch: pytest.MonkeyPatch, within: bool) -> None:
    rng = np.random.default_rng(7)
    for shape in [(5, 3, 11), (4, 2, 3, 9), (1, 1, 1)]:
        a = rng.integers(0, 50, shape).astype(np.float64)
        a[rng.random(shape) < 0.2] = np.inf
        a = np.sort(a, axis=-1) if within else -np.sort(-a, axis=-1)
        tau = rng.integers(-5, 55, shape[0]).astype(np.float64)
        direct = stage_bounds._leading(a, tau, within=within)
        monkeypatch.setattr(stage_bounds, "DIRECT_LEADING", 0)
        assert np.array_equal(direct, stage_bounds._leading(a, tau, within=within))
        monkeypatch.undo()


def test_prefetch_finds_every_extension_cp_model_imports() -> None:
    from madmax_opt.search import ortools_import as oi

    paths = [oi._helper_path(m) for m in oi.EXTENSIONS]
    assert all(p is not None and p.is_file() and p.name.startswith(m.rsplit(".", 1)[1])
               for p, m in zip(paths, oi.EXTENSIONS, strict=True))


def _least_max_by_bisection(g: np.ndarray, layers: int, weight: np.ndarray | None = None) -> np.ndarray:
    """stage_bounds.least_max as it was (a bisection over tau of its three conditions): the reference."""
    w = np.ones(g.shape[1]) if weight is None else np.asarray(weight, dtype=np.float64)
    suffix = np.minimum.accumulate(g[..., ::-1], axis=2)[..., ::-1]
    prefix = np.minimum.accumulate(g, axis=2)

    def fits(tau: np.ndarray) -> np.ndarray:
        most = stage_bounds._leading(suffix, tau, within=True) - 1
        fewest = stage_bounds._leading(prefix, tau, within=False)
        has = np.all((most >= 0) | (w == 0), axis=1)
        return has & (most @ w >= layers) & (fewest @ w <= layers)

    return stage_bounds._bisect(g.reshape(len(g), -1), fits)


@pytest.mark.parametrize("seed", range(6))
def test_least_max_thresholds_equal_bisection(seed: int) -> None:
    """Random integer stage rows with gaps (inf), stages weighted like strong_bounds' kinds (1, p - 2, 1; p = 2:
    a middle weight of 0) or alike: the thresholds give the bisection's tau, inf included."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        items, stages, layers = int(rng.integers(1, 6)), int(rng.integers(1, 5)), int(rng.integers(2, 12))
        g = rng.integers(0, 30, (items, stages, layers + 1)).astype(np.float64)
        g[rng.random(g.shape) < rng.choice([0.1, 0.5, 0.9])] = np.inf
        g[:, :, 0] = np.inf  # no row of 0 layers
        weight = None
        if stages == 3 and rng.random() < 0.7:
            weight = np.array([1.0, float(rng.integers(0, 6)), 1.0])
        assert np.array_equal(stage_bounds.least_max(g, layers, weight), _least_max_by_bisection(g, layers, weight))
