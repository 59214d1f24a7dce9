"""Embedding-table placement: CP-SAT against brute force, a hand-computed optimum, greedy, memory and solve time.

Exactness: on random small instances (<= 8 tables, <= 4 GPUs, random shardings allowed, random memory budgets,
training and inference) the CP-SAT objective equals the minimum of a brute force that enumerates every option of
every table over the same integer coefficients (1 worker, fixed seed, status OPTIMAL). Every returned plan is
re-checked for memory with the float evaluator (bytes, not the rounded MB).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from conftest import toy_gpu, toy_system
from madmax_opt.core.units import NS
from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict
from madmax_opt.model.dlrm import layout_of
from madmax_opt.model.dlrm_embedding import (
    TERM_INDEX,
    embedding_options,
    embedding_times,
    phase_weights,
    placement_objective_s,
)
from madmax_opt.model.dlrm_spec import SHARDINGS, DLRMModel, DLRMStack, DLRMTask, TableGroup
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.spec import Tier
from madmax_opt.search.dlrm_search import solve_dlrm
from madmax_opt.search.placement import PlacementModel, greedy_placement, solve_placement
from madmax_opt.search.placement_bound import lower_bound, model_variables
from madmax_opt.search.placement_brute import brute_force_placement, table_choices
from madmax_opt.search.placement_ints import int_objective, int_tables

MAX_COMBINATIONS = 60_000  # brute-force size per instance (keeps the default suite fast)


def toy_option(gpus: int, node: int, rng: np.random.Generator) -> HardwareOption:
    tiers = [Tier(name="nvl", size=node, bw=float(rng.choice([50e9, 200e9])), latency_s=float(rng.choice([0, 5e-6])),
                  efficiency=0.5),
             Tier(name="net", size=None, bw=float(rng.choice([5e9, 25e9])), latency_s=float(rng.choice([0, 20e-6])),
                  efficiency=0.8)]
    return HardwareOption(toy_system(tiers), toy_gpu(), gpus)


def random_instance(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    gpus, node = [(2, 2), (3, 4), (4, 2), (4, 4), (4, 2)][int(rng.integers(5))]
    shardings = sorted(set(rng.choice(list(SHARDINGS), size=int(rng.integers(1, 5)), replace=False)) | {"table_wise"})
    lay = layout_of(toy_option(gpus, node, rng), DLRMStack())
    task = DLRMTask(global_batch=int(rng.choice([256, 1024, 4096])) * 12, kind=str(rng.choice(["train", "inference"])))
    n_tables = int(rng.integers(2, 9))
    while True:
        tables = [TableGroup(name=f"t{i}", rows=int(rng.integers(1_000, 3_000_000)), dim=int(rng.choice([8, 16, 64])),
                             pooling=float(rng.integers(1, 60)), precision=str(rng.choice(["fp16", "fp32"])))
                  for i in range(n_tables)]
        model = DLRMModel(name="toy", tables=tables, dense_features=16, bottom_mlp={"layers": 2, "width": 32},
                          top_mlp={"layers": 2, "width": 32}, interaction="cat", dense_precision="bf16")
        opts = embedding_options(model, task, lay, tuple(shardings), (2,))
        it = int_tables(opts, lay, phase_weights(task), 1e18)
        if np.prod([float(len(c)) for c in table_choices(it)]) <= MAX_COMBINATIONS:
            break
        n_tables -= 1
    biggest = float(opts.coef[:, TERM_INDEX["memory"], 0].max())
    budget = float(rng.choice([0.5, 1.0, 2.0, 10.0])) * biggest * n_tables / gpus + 1e6
    return model, task, lay, opts, int_tables(opts, lay, phase_weights(task), budget)


SEEDS = range(70)


def test_enough_nontrivial_instances() -> None:
    """The bar: >= 50 random instances with a placement to find, each >= 2 tables on >= 2 GPUs."""
    feasible = 0
    for seed in SEEDS:
        model, _, lay, _, it = random_instance(seed)
        assert len(model.tables) >= 2 and lay.gpus >= 2
        feasible += brute_force_placement(it) is not None
    assert feasible >= 50


@pytest.mark.parametrize("seed", SEEDS)
def test_solver_matches_brute_force(seed: int) -> None:
    _, task, lay, opts, it = random_instance(seed)
    bf = brute_force_placement(it)
    res = solve_placement(it, time_limit_s=30.0, workers=1)
    if bf is None:
        assert res is None
        return
    assert res is not None and res.status == "optimal"
    assert res.objective == bf[0]
    assert res.bound == res.objective
    assert int_objective(it, res.shards) == (res.objective, True)
    # memory in bytes, float evaluator: never above the budget the integers were built from
    times = embedding_times(opts, res.shards, lay)
    assert times.memory_bytes.max() <= it.capacity_mb * 1e6
    # float objective within the per-coefficient rounding (0.5 ns per shard per maximum)
    shards = int(res.shards.count.sum())
    assert abs(placement_objective_s(times, task) - res.objective / NS) <= 0.5e-9 * shards * 40 + 1e-15
    if res.greedy_objective is not None:
        assert res.objective <= res.greedy_objective


def test_hint_is_complete_and_equals_greedy() -> None:
    """With every variable fixed to the greedy hint the model is feasible with greedy's integer objective."""
    from ortools.sat.python import cp_model

    for seed in range(10):
        *_, it = random_instance(seed)
        greedy = greedy_placement(it)
        if greedy is None:
            continue
        pm = PlacementModel(it)
        pm.hint(greedy)
        solver = cp_model.CpSolver()
        solver.parameters.fix_variables_to_their_hinted_value = True
        solver.parameters.num_workers = 1
        assert solver.solve(pm.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        assert round(solver.objective_value) == int_objective(it, greedy)[0]


def test_identical_tables_optimum_by_hand() -> None:
    """8 identical 1M-row tables on 4 GPUs (2 nodes of 2), training, B = 4096 (b = 1024): the proven optimum is the
    balanced table-wise plan (2 tables per GPU), whose cost is worked out here from the formulas alone."""
    tiers = [Tier(name="nvl", size=2, bw=200e9, latency_s=10e-6, efficiency=0.5),
             Tier(name="net", size=None, bw=25e9, latency_s=20e-6, efficiency=0.8)]
    lay = layout_of(HardwareOption(toy_system(tiers), toy_gpu(), 4), DLRMStack())
    model = DLRMModel(name="toy", tables=[TableGroup(name="t", count=8, rows=1_000_000, dim=64, pooling=20)],
                      dense_features=16, bottom_mlp={"layers": 2, "width": 32}, top_mlp={"layers": 2, "width": 32},
                      dense_precision="bf16")
    task = DLRMTask(global_batch=4096)
    opts = embedding_options(model, task, lay)
    it = int_tables(opts, lay, phase_weights(task), 1e12)
    res = solve_placement(it, time_limit_s=30.0)
    assert res is not None and res.status == "optimal"
    B, b, P, de, x = 4096, 1024, 20, 128, 8
    hbm, w0, w1 = 1e12, 1e11, 2e10
    lf = 2 * B * (P * (de + x) + de) / hbm  # two tables per GPU
    lb = 2 * B * (P * (2 * de + 8 + x) + de) / hbm
    ids, pooled = b * (P * x + 4), b * de
    c_in = max(2 * ids / w0, 2 * 2 * ids / w1) + 10e-6 + 20e-6  # owner receives from 1 node-mate, 2 remote GPUs
    c_out = max(2 * pooled / w0, 2 * 2 * pooled / w1) + 10e-6 + 20e-6
    expected = lf + lb + c_in + 2 * c_out
    assert res.objective / NS == pytest.approx(expected, abs=40e-9)
    assert res.greedy_objective == res.objective  # greedy balances identical tables perfectly


@pytest.mark.parametrize(("model", "gpus"), [("dlrm-a", 128), ("dlrm-i", 128)])
def test_paper_models_at_128_gpus(model: str, gpus: int) -> None:
    """Proven optimal within the 30 s budget, never worse than greedy, memory within capacity."""
    p = dlrm_problem_from_dict({"model": model, "hardware": {"system": "zionex", "gpus": gpus},
                                "task": {"global_batch": 65536}})
    lay = layout_of(p.hardware[0], p.stack)
    opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
    it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
    t0 = time.perf_counter()
    res = solve_placement(it, time_limit_s=30.0)
    assert time.perf_counter() - t0 < 30.0
    assert res is not None and res.status == "optimal" and res.gap == 0.0
    assert res.greedy_objective is not None and res.objective <= res.greedy_objective
    assert embedding_times(opts, res.shards, lay).memory_bytes.max() <= lay.capacity_bytes
    assert int(res.shards.count.sum()) == p.model.n_tables  # table-wise: one shard per table


def test_solver_beats_greedy_when_tables_do_not_divide() -> None:
    """512 DLRM-I tables on 96 GPUs: greedy leaves 32 GPUs with 6 tables and 64 with 5; the solver rebalances."""
    p = dlrm_problem_from_dict({"model": "dlrm-i", "hardware": {"system": "zionex", "gpus": 96},
                                "task": {"global_batch": 61440}})
    lay = layout_of(p.hardware[0], p.stack)
    opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
    it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
    res = solve_placement(it, time_limit_s=30.0)
    assert res is not None and res.greedy_objective is not None
    assert res.objective < res.greedy_objective
    assert res.bound <= res.objective


def test_dlrm_search_respects_memory() -> None:
    """DLRM-A small on 32 GPUs: the returned plan fits (float evaluator), and so does the baseline."""
    p = dlrm_problem_from_dict({"model": "dlrm-a-small", "hardware": {"system": "zionex", "gpus": 32},
                                "task": {"global_batch": 8192}})
    best, results = solve_dlrm(p, time_limit_s=30.0)
    for rec in (best, results[0].baseline):
        assert rec is not None and rec["feasible"]
        mem = rec["memory_bytes_per_gpu"]
        assert mem["total"] <= mem["capacity"]
    assert best["step_time_s"] <= results[0].baseline["step_time_s"]  # type: ignore[index]


def test_does_not_fit_is_infeasible() -> None:
    """DLRM-F's 64 tables of 732 M rows x 256 x fp16 = 24 TB cannot fit on 64 x 40 GB."""
    from madmax_opt.core.errors import InfeasibleError

    p = dlrm_problem_from_dict({"model": "dlrm-f", "hardware": {"system": "zionex", "gpus": 64},
                                "task": {"global_batch": 4096}})
    with pytest.raises(InfeasibleError, match="no placement of the tables fits"):
        solve_dlrm(p, time_limit_s=5.0)


@pytest.mark.slow
def test_solver_matches_brute_force_eight_tables() -> None:
    """8 tables on 4 GPUs in 2 nodes (table-wise, table-row-wise, row-wise): 7^8 = 5.8 M combinations."""
    rng = np.random.default_rng(11)
    lay = layout_of(toy_option(4, 2, rng), DLRMStack())
    tables = [TableGroup(name=f"t{i}", rows=int(rng.integers(1_000, 3_000_000)), dim=16,
                         pooling=float(rng.integers(1, 60))) for i in range(8)]
    model = DLRMModel(name="toy", tables=tables, dense_features=16, bottom_mlp={"layers": 2, "width": 32},
                      top_mlp={"layers": 2, "width": 32}, dense_precision="bf16")
    task = DLRMTask(global_batch=4096)
    opts = embedding_options(model, task, lay, ("table_wise", "table_row_wise", "row_wise"))
    it = int_tables(opts, lay, phase_weights(task), 1e18)
    bf = brute_force_placement(it)
    res = solve_placement(it, time_limit_s=60.0)
    assert bf is not None and res is not None and res.status == "optimal" and res.objective == bf[0]


@pytest.mark.slow
def test_heterogeneous_tables_beat_greedy() -> None:
    """50 heterogeneous tables (dlrm_report.synthetic_model) on 8 GPUs: >= 20 % below greedy (measured 44.6 %)."""
    from madmax_opt.report.dlrm_report import synthetic_model

    model = synthetic_model(50)
    p = dlrm_problem_from_dict({"model": model.model_dump(), "hardware": {"system": "zionex", "gpus": 8},
                                "task": {"global_batch": 65536}})
    lay = layout_of(p.hardware[0], p.stack)
    opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
    it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
    res = solve_placement(it, time_limit_s=120.0, deterministic_limit=20.0)  # reproducible; ~20 s here
    assert res is not None and res.gain_vs_greedy is not None
    assert res.gain_vs_greedy >= 0.20
    assert res.bound <= res.objective
    assert embedding_times(opts, res.shards, lay).memory_bytes.max() <= lay.capacity_bytes


def _greedy_by_rule(it: Any) -> list[tuple[int, int, int]] | None:
    """greedy_placement's rule written out over numpy arrays: tables largest first (ties by group), each to the GPU
    of least load (own lookup + table-wise communication terms) among those with memory room, lowest index on ties."""
    opts = it.opts
    tw = {o.group: i for i, o in enumerate(opts.options) if o.sharding == "table_wise"}
    own = [TERM_INDEX[k] for k in ("lookup_fwd", "lookup_bwd", "tw_in.recv_intra", "tw_in.recv_inter",
                                   "tw_out.send_intra", "tw_out.send_inter")]
    order = sorted((-float(opts.coef[tw[j], TERM_INDEX["memory"], 0]), j) for j in tw for _ in range(opts.counts[j]))
    if len(order) != sum(opts.counts):
        return None
    load, mem = np.zeros(it.layout.gpus), np.zeros(it.layout.gpus, dtype=np.int64)
    placed = np.zeros((len(opts.options), it.layout.gpus), dtype=np.int64)
    for _, j in order:
        o = tw[j]
        room = mem + it.coef[o, TERM_INDEX["memory"], 0] <= it.capacity_mb
        if not room.any():
            return None
        g = int(np.argmin(np.where(room, load, np.inf)))
        load[g] += float(opts.coef[o, own, 0].sum())
        mem[g] += it.coef[o, TERM_INDEX["memory"], 0]
        placed[o, g] += 1
    return [(int(o), int(g), int(placed[o, g])) for o, g in zip(*np.nonzero(placed), strict=True)]


def test_greedy_follows_its_rule() -> None:
    """The heap-based greedy places every table where the rule written out places it (random instances, tight and
    loose memory)."""
    found = 0
    for seed in range(40):
        *_, it = random_instance(seed)
        got = greedy_placement(it)
        want = _greedy_by_rule(it)
        assert (got is None) == (want is None), seed
        if got is not None:
            found += 1
            assert list(zip(got.option.tolist(), got.location.tolist(), got.count.tolist(), strict=True)) == want, seed
    assert found >= 20


def identical_instance(seed: int) -> Any:
    """Random identical tables (one group, a multiple of the GPU count) on 2-4 GPUs: greedy deals them evenly."""
    rng = np.random.default_rng(seed)
    gpus, node = [(2, 2), (4, 2), (4, 4)][int(rng.integers(3))]
    lay = layout_of(toy_option(gpus, node, rng), DLRMStack())
    task = DLRMTask(global_batch=int(rng.choice([256, 1024, 4096])) * 12, kind=str(rng.choice(["train", "inference"])))
    shardings = sorted(set(rng.choice(list(SHARDINGS), size=int(rng.integers(1, 5)), replace=False)) | {"table_wise"})
    count = gpus * int(rng.integers(1, 3)) if gpus < 4 else 4
    table = TableGroup(name="t", count=count, rows=int(rng.integers(1_000, 3_000_000)), dim=int(rng.choice([8, 16])),
                       pooling=float(rng.integers(1, 60)), precision=str(rng.choice(["fp16", "fp32"])))
    model = DLRMModel(name="toy", tables=[table], dense_features=16, bottom_mlp={"layers": 2, "width": 32},
                      top_mlp={"layers": 2, "width": 32}, interaction="cat", dense_precision="bf16")
    opts = embedding_options(model, task, lay, tuple(shardings), (2,))
    return int_tables(opts, lay, phase_weights(task), 1e18)


def test_lower_bound_is_valid() -> None:
    """The averaging bound (search/placement_bound.py) never exceeds the brute-force optimum (heterogeneous and
    identical tables, with and without the greedy plan's lanes); on identical tables it proves greedy optimal
    often, and then solve_placement returns greedy's plan as optimal without CP-SAT."""
    proved = 0
    for seed in SEEDS:
        for it in (random_instance(seed)[-1], identical_instance(seed)):
            bf = brute_force_placement(it)
            if bf is None:
                continue
            greedy = greedy_placement(it)
            assert lower_bound(it) <= bf[0], seed
            if greedy is None:
                continue
            bound = lower_bound(it, greedy)
            assert bound <= bf[0], seed
            if bound >= int_objective(it, greedy)[0]:
                proved += 1
                res = solve_placement(it)
                assert res is not None and res.status == "optimal" and res.objective == bf[0], seed
                assert res.bound == res.objective and res.variables == model_variables(it)
                for a, b in ((res.shards.option, greedy.option), (res.shards.location, greedy.location),
                             (res.shards.count, greedy.count)):
                    assert a.tolist() == b.tolist(), seed
    assert proved >= 10


def test_model_variables_counted() -> None:
    """model_variables counts exactly the variables PlacementModel builds (random instances, the paper models)."""
    instances = [random_instance(seed)[-1] for seed in range(30)] + [identical_instance(s) for s in range(30)]
    for model, gpus in (("dlrm-a", 128), ("dlrm-i", 96)):
        p = dlrm_problem_from_dict({"model": model, "hardware": {"system": "zionex", "gpus": gpus},
                                    "task": {"global_batch": 61440}})
        lay = layout_of(p.hardware[0], p.stack)
        opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
        instances.append(int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes))
    for i, it in enumerate(instances):
        assert model_variables(it) == len(PlacementModel(it).model.proto.variables), i


def test_improved_hint_places_every_table_and_beats_greedy() -> None:
    """DLRM-I on 96 GPUs: the extra 32 tables row-sharded inside the nodes start CP-SAT below greedy, every table
    placed once, memory within capacity; a group dealt evenly (DLRM-I on 128 GPUs) gets no candidate."""
    from madmax_opt.search.placement_hint import improved_hint

    for gpus, better in ((96, True), (128, False)):
        p = dlrm_problem_from_dict({"model": "dlrm-i", "hardware": {"system": "zionex", "gpus": gpus},
                                    "task": {"global_batch": 61440}})
        lay = layout_of(p.hardware[0], p.stack)
        opts = embedding_options(p.model, p.task, lay, capacity_bytes=lay.capacity_bytes)
        it = int_tables(opts, lay, phase_weights(p.task), lay.capacity_bytes)
        greedy = greedy_placement(it)
        assert greedy is not None
        hint = improved_hint(it, int_objective(it, greedy)[0], greedy_placement)
        assert (hint is not None) == better
        if hint is not None:
            obj, shards = hint
            assert int_objective(it, shards) == (obj, True) and obj < int_objective(it, greedy)[0]
            split = np.array([opts.options[o].split for o in shards.option.tolist()])
            assert int((shards.count / split).sum()) == p.model.n_tables
            res = solve_placement(it)
            assert res is not None and res.status == "optimal" and res.objective <= obj
