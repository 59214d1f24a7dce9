"""The DLRM option floor (search/dlrm_bound.py) and the search that prunes options with it (dlrm_search.solve_dlrm).

- The forms: the largest forward x backward form equals the step of model/dlrm_dense.step_terms on random dense
  terms and embedding times (training and inference, DDP / FSDP, pipelined input dist or not): the identity the
  bound rests on, checked against the step code itself.
- The floor is below every plan: every placement of small random instances (enumerated like the placement brute
  force) under every dense plan, priced by the float evaluator; and below each example option's searched optimum.
- Pruning never changes the answer: every example problem (and cost / energy objectives on the cloud catalogue)
  solved with and without it give the same best record and the same per-option records wherever the averaging
  bound proves the placement without CP-SAT; a pruned option's floor is above the best and below its optimum.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict, load_dlrm_problem
from madmax_opt.model.dlrm import lower
from madmax_opt.model.dlrm_dense import DenseTerms, dense_terms, enumerate_dense, step_terms, step_time_s
from madmax_opt.model.dlrm_embedding import EmbeddingTimes, ShardArrays, embedding_times
from madmax_opt.model.dlrm_spec import DLRMSpace, DLRMStack, DLRMTask
from madmax_opt.search import dlrm_search
from madmax_opt.search.dlrm_bound import step_floor_s, step_forms
from madmax_opt.search.dlrm_search import objective_value, prepare_option, search_option, solve_dlrm
from madmax_opt.search.placement_brute import table_choices
from test_placement import random_instance

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "problems" / "dlrm").glob("dlrm-*.yaml"))
MAX_PLACEMENTS = 1_500  # per instance: every placement priced in Python


def _random_dense(rng: np.random.Generator, n: int) -> DenseTerms:
    def r(zero_share: float = 0.3) -> np.ndarray:
        x = rng.uniform(0.0, 5e-3, n)
        return np.where(rng.random(n) < zero_share, 0.0, x)

    return DenseTerms(bottom_fwd_s=r(), bottom_bwd_s=r(), top_fwd_s=r(), top_bwd_s=r(), tp_comm_s=r(), moe_a2a_s=r(),
                      sync_s=r(), fsdp_fwd_s=r(0.5), optimizer_s=r(), memory={"w": r()},
                      invalid=np.zeros(n, dtype=np.int64), fwd_flops_per_gpu=r())


@pytest.mark.parametrize("kind", ["train", "inference"])
@pytest.mark.parametrize("pipelined", [False, True])
def test_forms_give_the_step_exactly(kind: str, pipelined: bool) -> None:
    rng = np.random.default_rng(7)
    task, stack = DLRMTask(global_batch=1024, kind=kind), DLRMStack(pipeline_input_dist=pipelined)
    for _ in range(200):
        dense = _random_dense(rng, 16)
        comp = np.where(rng.random(5) < 0.2, 0.0, rng.uniform(0.0, 8e-3, 5))  # lf, lb, cin, cout, dp
        emb = EmbeddingTimes(lookup_fwd_s=comp[0], lookup_bwd_s=comp[1], input_s=comp[2], output_s=comp[3],
                             dp_allreduce_s=comp[4], per_collective_s={}, memory_bytes=np.zeros(1),
                             totals=np.zeros(1))
        if kind == "inference":
            comp = comp * np.array([1, 0, 1, 1, 0])  # step_terms reads no lb or dp in inference
        step = step_time_s(step_terms(dense, emb, stack, task)[0])
        weights, consts = step_forms(dense, stack, task)
        forms = (weights @ comp)[:, None] + consts
        np.testing.assert_allclose(forms.max(axis=0), step, rtol=1e-12, atol=1e-15)


def _every_placement(opts, it) -> list[ShardArrays]:  # type: ignore[no-untyped-def]
    out = []
    for combo in itertools.product(*table_choices(it)):
        rows: dict[tuple[int, int], int] = {}
        for o, locs in combo:
            for g in locs:
                rows[o, g] = rows.get((o, g), 0) + 1
        keys = sorted(rows)
        out.append(ShardArrays(np.array([k[0] for k in keys]), np.array([k[1] for k in keys]),
                               np.array([rows[k] for k in keys])))
    return out


def test_floor_is_below_every_placement_and_dense_plan() -> None:
    """Small random instances: the floor <= the step of every (placement, valid dense plan), memory ignored; it
    is tight enough to matter (within 25 % of the true minimum on most instances)."""
    checked = tight = 0
    for seed in range(60):
        model, task, lay, opts, it = random_instance(seed)
        if np.prod([float(len(c)) for c in table_choices(it)]) > MAX_PLACEMENTS:
            continue
        stack = DLRMStack(pipeline_input_dist=bool(seed % 2))
        dense = enumerate_dense(DLRMSpace(), model, lay)
        dt = dense_terms(lower(model), task, stack, lay, dense)
        valid = np.flatnonzero(dt.invalid == 0)
        if len(valid) == 0:
            continue
        floor = step_floor_s(opts, lay, dt, valid, stack, task)
        best = min(float(step_time_s(step_terms(dt, embedding_times(opts, p, lay), stack, task)[0])[valid].min())
                   for p in _every_placement(opts, it))
        assert floor <= best, (seed, floor, best)
        checked += 1
        tight += floor >= 0.75 * best
    assert checked >= 20 and tight >= checked // 2, (checked, tight)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_floor_is_below_each_example_option(path: Path) -> None:
    problem = load_dlrm_problem(path)
    for hw in range(len(problem.hardware)):
        prep = prepare_option(problem, hw)
        res = search_option(problem, hw)
        if isinstance(prep, dlrm_search.OptionResult) or res.record is None:
            continue
        assert prep.floor_s(problem) <= res.record["step_time_s"], (path.stem, hw)


def _timeless(rec):  # type: ignore[no-untyped-def]
    """A record without its placement solve's wall time."""
    if rec is None or "placement_solver" not in rec:
        return rec
    return {**rec, "placement_solver": {k: v for k, v in rec["placement_solver"].items() if k != "wall_s"}}


def _unpruned(problem, monkeypatch):  # type: ignore[no-untyped-def]
    """solve_dlrm with every option searched (a floor of zero prunes nothing)."""
    with monkeypatch.context() as m:
        m.setattr(dlrm_search.PreparedOption, "floor_s", lambda self, problem: 0.0)
        return solve_dlrm(problem)


def _cloud(objective: str) -> object:
    data = {"model": "dlrm-a", "hardware": [{"system": "cloud-a-p5", "gpus": [256, 512]},
                                            {"system": "cloud-b-nd96asr-v4", "gpus": [128, 256]},
                                            {"system": "cloud-a-p4de", "gpus": [64, 128]}],
            "task": {"global_batch": 65536, "train_samples": 1e9}, "objective": objective}
    return dlrm_problem_from_dict(data)


@pytest.mark.parametrize("case", [*(p.stem for p in EXAMPLES), "cloud-cost", "cloud-energy"])
def test_pruning_keeps_the_answer(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _cloud(case.split("-")[1]) if case.startswith("cloud") else load_dlrm_problem(
        ROOT / "problems" / "dlrm" / f"{case}.yaml")
    best, results = solve_dlrm(problem)
    every_best, every = _unpruned(problem, monkeypatch)
    assert _timeless(best) == _timeless(every_best)
    assert all(r.status != "pruned" for r in every)
    for r, full in zip(results, every, strict=True):
        if r.status == "pruned":  # a feasible plan's record (or none), its floor above the best and the optimum
            assert r.floor_s is not None and r.floor_s <= full.record["step_time_s"]
            assert r.record is None or r.record["step_time_s"] >= full.record["step_time_s"]
            assert dlrm_search.objective_of_step(problem, r.hw, r.floor_s) > objective_value(problem, best)
        else:  # searched, or proven by the averaging bound without CP-SAT: the same record
            assert r.status == full.status and _timeless(r.record) == _timeless(full.record)


def test_dlrm_i_prunes_96_gpus() -> None:
    """The example that motivated the floor: 512 tables do not divide over 96 GPUs (CP-SAT needed to prove its
    placement), but its floor is above the 128-GPU optimum, so no CP-SAT model is built; its row reports the
    greedy start's plan (no better than the optimum there) with the floor."""
    problem = load_dlrm_problem(ROOT / "problems" / "dlrm" / "dlrm-i-zionex.yaml")
    result = dlrm_search.dlrm_solve_result(problem, 30.0, 1)
    rows = {o["hardware"]: o for o in result["options"]}
    assert result["status"] == "optimal" and result["best"]["hardware"]["gpus"] == 128
    row = rows["zionexx96"]
    assert row["status"] == "pruned" and row["feasible"] and row["step_time_s"] is not None
    assert result["best"]["step_time_s"] < row["step_time_floor_s"] <= row["step_time_s"]
    assert rows["zionexx128"]["status"] == "optimal"


def test_solve_prints_each_option_and_how_it_was_settled() -> None:
    """The human output of a DLRM problem with several options lists each, the pruned one with its floor (the
    same floats as --json, printed in ms)."""
    from cli_helpers import run_main

    path = str(ROOT / "problems" / "dlrm" / "dlrm-i-zionex.yaml")
    shown = run_main("solve", path)
    assert shown.returncode == 0, shown.stderr
    rows = {o["hardware"]: o for o in json.loads(run_main("solve", path, "--json").stdout)["options"]}
    text = " ".join(shown.stdout.split())
    assert "best plan per hardware option" in text and "optimal (best)" in text
    assert f"pruned: >= {rows['zionexx96']['step_time_floor_s'] * 1e3:,.2f} ms per step" in text
    assert f"{rows['zionexx96']['step_time_s'] * 1e3:,.2f}" in text
