"""PNG plots: the files exist, have the expected size, and carry content (colours of the plotted categories)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import ProblemFactory
from madmax_opt.analysis.evaluator import Model, evaluate
from madmax_opt.analysis.trace import simulate
from madmax_opt.model.spec import Plan
from madmax_opt.report.plots import (
    MEMORY_COLORS,
    TERM_COLORS,
    gantt_figure,
    memory_figure,
    plan_figures,
    step_time_figure,
    top_k_figure,
)

mpimg = pytest.importorskip("matplotlib.image")

PLANS = [
    Plan(tp=2, pp=4, mbs=1, recompute="none"),
    Plan(tp=4, pp=2, vpp=2, mbs=1, recompute="selective", sp=True),
    Plan(tp=8, mbs=2, recompute="full"),
]


def _image(path: Path) -> np.ndarray:
    assert path.exists() and path.stat().st_size > 15_000, path
    return np.asarray(mpimg.imread(path))


def _has_colour(img: np.ndarray, hex_colour: str, min_pixels: int = 50) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img[..., :3] - rgb).max(axis=-1) < 0.02).sum()) >= min_pixels


@pytest.fixture
def records(make_problem: ProblemFactory) -> list[dict]:
    return evaluate(make_problem(gpus=8, global_batch=32), PLANS)


def test_step_time_and_memory_bars(records: list[dict], tmp_path: Path) -> None:
    img = _image(step_time_figure(records, tmp_path / "t.png"))
    assert img.shape[0] > 250 and img.shape[1] > 900
    assert _has_colour(img, TERM_COLORS["compute"], 2000)
    assert _has_colour(img, TERM_COLORS["tp_comm"])  # tp > 1 everywhere: exposed TP collectives
    assert _has_colour(img, TERM_COLORS["bubble"])  # pipelines: a bubble
    img = _image(memory_figure(records, tmp_path / "m.png"))
    assert _has_colour(img, MEMORY_COLORS["weights"]) and _has_colour(img, MEMORY_COLORS["activations"])
    assert _has_colour(img, "#C44E52", 20)  # the capacity marker


def test_top_k_and_plan_figures(records: list[dict], tmp_path: Path) -> None:
    img = _image(top_k_figure(records, tmp_path / "k.png"))
    assert img.shape[1] > img.shape[0] > 400  # two panels side by side
    paths = plan_figures(records, tmp_path / "plots", top_k=True)
    assert [p.name for p in paths] == ["step_time.png", "memory.png", "top_k.png"]
    assert [p.name for p in plan_figures(records[:1], tmp_path / "one", top_k=True)] == ["step_time.png",
                                                                                       "memory.png"]


def test_gantt_png(make_problem: ProblemFactory, tmp_path: Path) -> None:
    problem = make_problem(gpus=16, global_batch=32)
    sim = simulate(Model(problem), Plan(tp=2, pp=4, dp=2, mbs=1, zero=1, recompute="full"))
    img = _image(gantt_figure(sim, tmp_path / "g.png"))
    # one row per stream of each stage: compute, TP, gradient reduction, p2p x 4 stages
    assert img.shape[0] > 400 and img.shape[1] > 1200
    for cat in ("compute", "recompute", "tp_comm", "dp_comm", "pp_comm"):
        assert _has_colour(img, TERM_COLORS[cat], 10), cat
