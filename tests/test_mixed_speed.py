"""Issue 26, the mixed-pipeline example under 0.5 s: CP-SAT runs overlapped with the uneven search's own work
(search/stage_overlap.py) and the direct count of stage_bounds._leading on small arrays change no result: the same
plan, step time, counters and bounds as the search on one thread, and the same counts as the bisection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search import stage_bounds, stages
from madmax_opt.search.solver import solve_records
from madmax_opt.search.stage_overlap import Deferred, Lookahead

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "problems" / "gpt3-175b-mixed-pipeline.yaml"


def _summary(data: dict[str, Any]) -> tuple[Any, ...]:
    out, rec = solve_records(problem_from_dict(data))
    u = out.uneven
    assert u is not None
    return (rec[0]["plan"], rec[0]["step_time_s"], u.step_us, u.status, u.bases_solved, u.bases_pruned, u.booleans,
            u.objective, u.best_bound, out.objective, out.best_bound)


@pytest.mark.parametrize("resolve_after", [0, stages.RESOLVE_AFTER])
def test_overlap_changes_no_result(monkeypatch: pytest.MonkeyPatch, resolve_after: int) -> None:
    """The example (three improving CP-SAT models and a re-solve): overlapped (the re-solve deferred at once, so
    that earlier re-solves are stopped, or after RESOLVE_AFTER models) = on one thread, counters included."""
    data = yaml.safe_load(EXAMPLE.read_text())
    monkeypatch.setattr(stages, "RESOLVE_AFTER", resolve_after)
    started: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    overlapped = _summary(data)
    assert "uneven-lookahead" in started and "uneven-deferred" in started
    monkeypatch.setattr(stages, "OVERLAP", False)
    started.clear()
    assert _summary(data) == overlapped
    assert "uneven-lookahead" not in started and "uneven-deferred" not in started


def test_lookahead_runs_tasks_during_and_stops_between_them() -> None:
    done: list[int] = []

    def slow(i: int) -> None:
        time.sleep(0.02)
        done.append(i)

    look = Lookahead(lambda: [lambda i=i: slow(i) for i in range(50)])  # type: ignore[misc]
    with look.during():
        time.sleep(0.05)
    count = len(done)
    assert 1 <= count < 50 and done == list(range(count))  # in order, stopped after the one under way
    time.sleep(0.05)
    assert len(done) == count  # nothing runs after during() returned
    with Lookahead(None).during():
        pass


def test_lookahead_task_error_is_left_to_the_search() -> None:
    done: list[int] = []

    def fail() -> None:
        raise ValueError("computed again by the search")

    with Lookahead(lambda: [fail, lambda: done.append(1)]).during():
        time.sleep(0.01)
    assert done == []  # the helper stopped at the error, silently


def test_deferred_result_and_error() -> None:
    assert Deferred(lambda: 41 + 1).result() == 42

    def fail() -> int:
        raise KeyError("x")

    with pytest.raises(KeyError):
        Deferred(fail).result()


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
