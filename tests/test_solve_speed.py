"""Issue 26, whole-process solve time: the shortcuts keep every answer.

- OR-Tools' CP-SAT module loads without pandas (search/ortools_import.py) and still solves, and its pandas helpers
  still work once called;
- a training or serving solve classifies its file without the DLRM loader (io/file_family.py);
- serving plans enumerated as columns (search/serving_space.py) equal the row-by-row build they replace, and the
  calibration resolved once per GPU type equals the per-option resolution;
- the table placement's quick proof without presolve, then with presolve, proves the same optimum as one run
  without presolve.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from madmax_opt.io.dlrm_problem import dlrm_models
from madmax_opt.io.file_family import dlrm_model_names, is_dlrm_data
from madmax_opt.io.problem import load_problem
from madmax_opt.model.serving_calibration import calibration_columns
from madmax_opt.search.serving_space import (
    BATCH_GRID,
    ServingModel,
    _serving_data,
    enumerate_serving,
    per_gpu_calibration,
)

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cp_model_without_pandas_solves_and_keeps_its_pandas_helpers() -> None:
    got = _run(
        "import sys\n"
        "from madmax_opt.search.ortools_import import load_cp_model\n"
        "cp_model = load_cp_model()\n"
        "print('pandas' in sys.modules)\n"
        "m = cp_model.CpModel(); x = m.new_int_var(0, 10, 'x'); y = m.new_int_var(0, 10, 'y')\n"
        "m.add(2 * x + 3 * y <= 12); m.maximize(x + y)\n"
        "s = cp_model.CpSolver(); st = s.solve(m)\n"
        "print(st == cp_model.OPTIMAL, int(s.objective_value))\n"
        "from ortools.sat.python import cp_model as again\n"
        "print(again is cp_model)\n"
        "try:\n"
        "    import pandas as pd\n"
        "except ImportError:\n"
        "    print('no pandas installed 2')\n"
        "else:\n"
        "    v = m.new_int_var_series('v', pd.Index(['a', 'b']), 0, 3)\n"
        "    print(type(v).__name__, len(v))\n"
    )
    # by hand: 2x + 3y <= 12 over integers, x + y largest at x = 6, y = 0 (6); pandas untouched until asked for
    lines = got.splitlines()
    assert lines[0] == "False"
    assert lines[1] == "True 6"
    assert lines[2] == "True"
    assert lines[3] in ("Series 2", "no pandas installed 2")


def test_dlrm_names_without_the_dlrm_loader() -> None:
    assert dlrm_model_names() == frozenset(dlrm_models())
    for name in dlrm_models():
        assert is_dlrm_data({"model": name})
    assert is_dlrm_data({"model": "dlrm-typo"}) and is_dlrm_data({"model": {"family": "dlrm"}})
    assert not is_dlrm_data({"model": "llama2-70b"}) and not is_dlrm_data({"model": {"family": "gpt"}})
    err = subprocess.run(
        [sys.executable, "-c",
         "import sys, runpy\n"
         "sys.argv = ['madmax-opt', 'solve', 'problems/llama2-70b-h100.yaml', '--json']\n"
         "try:\n"
         "    runpy.run_module('madmax_opt.cli.main', run_name='__main__')\n"
         "except SystemExit:\n"
         "    pass\n"
         "print([m for m in ('madmax_opt.io.dlrm_problem', 'ortools', 'pandas') if m in sys.modules], "
         "file=sys.stderr)\n"],
        capture_output=True, text=True, cwd=ROOT, timeout=120).stderr
    assert err.strip().splitlines()[-1] == "[]"  # a uniform training solve: no DLRM loader, no OR-Tools


def _rows_one_by_one(model: ServingModel) -> np.ndarray:
    """The row-by-row build (each shape, then each prefill split, then each batch up to what runs at once)."""
    base = enumerate_serving(model)  # its shapes: take the distinct (dp, tp, pp, precision, hw, ep) in order
    seen: dict[tuple[int, ...], None] = {}
    for i in range(len(base)):
        seen.setdefault((int(base.dp[i]), int(base.tp[i]), int(base.pp[i]), int(base.precision[i]),
                         int(base.hw[i]), int(base.ep[i])), None)
    from madmax_opt.model.inference import device, memory_bytes
    from madmax_opt.model.serving_workload import ServingArrays

    s = np.array(list(seen), dtype=np.int64)
    one = np.ones(len(s), dtype=np.int64)
    shapes = ServingArrays(dp=s[:, 0], tp=s[:, 1], pp=s[:, 2], batch=one, precision=s[:, 3],
                           prefill_dp=np.where(model.task.disaggregated, 1, 0) * one, hw=s[:, 4], ep=s[:, 5],
                           max_seqs=0 * one)
    capacity = model.table.hbm_bytes[shapes.hw] * (1.0 - model.problem.stack.memory_reserve_fraction)
    dev = device(model.workload, model.task, model.table, shapes, model.cal)
    _, _, max_batch = memory_bytes(model.workload, dev, capacity, model.cal.kv_full_reservation[shapes.hw])
    runs = np.minimum(max_batch, model.cal.default_max_num_seqs[shapes.hw])
    rows = []
    for i in range(len(s)):
        fits = int(min(runs[i], 1 << 30))
        batches = [b for b in BATCH_GRID if b <= max(fits, 1)] + ([fits] if fits > 1 and fits not in BATCH_GRID
                                                                  else [])
        for pre in (range(int(s[i, 0])) if model.task.disaggregated else [0]):
            rows += [(s[i, 0], s[i, 1], s[i, 2], b, s[i, 3], pre, s[i, 4], s[i, 5], 0) for b in batches]
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("name", ["serve-llama3-70b", "serve-llama2-70b-disaggregated", "serve-deepseek-v3"])
def test_serving_columns_equal_the_row_by_row_build(name: str) -> None:
    model = ServingModel(load_problem(ROOT / "problems" / f"{name}.yaml"))
    got = enumerate_serving(model)
    cols = np.stack([got.dp, got.tp, got.pp, got.batch, got.precision, got.prefill_dp, got.hw, got.ep,
                     got.max_seqs], axis=1)
    want = _rows_one_by_one(model)
    assert cols.shape == want.shape and (cols == want).all()
    if name == "serve-llama2-70b-disaggregated":
        assert int(got.prefill_dp.max()) > 0  # the prefill splits were enumerated


def test_calibration_once_per_gpu_equals_per_option() -> None:
    problem = load_problem(ROOT / "problems" / "serve-llama3-70b.yaml")
    model = ServingModel(problem)
    assert len({o.gpu.name for o in problem.hardware}) < len(problem.hardware)  # several options per GPU type
    catalog = model.catalog or _serving_data(problem).catalog
    want_cal, want_records = calibration_columns(problem.hardware, model.framework, catalog)
    got_cal, got_records = per_gpu_calibration(problem.hardware, model.framework, catalog)
    for f in want_cal.__dataclass_fields__:
        assert np.array_equal(getattr(got_cal, f), getattr(want_cal, f)), f
    assert got_records == want_records
    got_records[0]["gpu"] = "changed"  # each option's record is its own object
    assert got_records[1]["gpu"] != "changed"


def test_placement_quick_then_presolved_proof_equals_one_proof() -> None:
    """DLRM-I on 128 ZionEX GPUs (heterogeneous tables; CP-SAT beats greedy by 8.6 %): the solve's quick run is not
    enough, the presolved rest proves the optimum that one run without presolve proves."""
    from madmax_opt.io.dlrm_problem import load_dlrm_problem
    from madmax_opt.model.dlrm import layout_of, lower
    from madmax_opt.model.dlrm_dense import dense_terms, enumerate_dense
    from madmax_opt.model.dlrm_embedding import embedding_options, phase_weights
    from madmax_opt.search.cpsat import OPTIMAL, CpSatOptions
    from madmax_opt.search.placement import (
        QUICK_PROOF_LIMIT,
        PlacementModel,
        _phase,
        greedy_placement,
        solve_placement,
    )
    from madmax_opt.search.placement_ints import int_objective, int_tables

    problem = load_dlrm_problem(ROOT / "problems" / "dlrm" / "dlrm-i-zionex.yaml")
    lay = layout_of(problem.hardware[0], problem.stack)
    dt = dense_terms(lower(problem.model), problem.task, problem.stack, lay,
                     enumerate_dense(problem.space, problem.model, lay))
    budget = float((lay.capacity_bytes - dt.memory_bytes)[dt.invalid == 0].max())
    opts = embedding_options(problem.model, problem.task, lay, ("table_wise", "column_wise", "table_row_wise",
                                                               "row_wise", "data_parallel"),
                             tuple(problem.space.column_splits), budget)
    it = int_tables(opts, lay, phase_weights(problem.task), budget)
    pm = PlacementModel(it)
    greedy = greedy_placement(it)
    status, solver = _phase(pm, greedy, cpsat=CpSatOptions(), deterministic_limit=5.0, portfolio=False)
    assert solver.deterministic_time > QUICK_PROOF_LIMIT  # the quick run alone would not prove it
    assert status == OPTIMAL
    res = solve_placement(it)
    assert res is not None and res.status == "optimal"
    assert res.objective == round(solver.objective_value) == int_objective(it, res.shards)[0]
    assert res.objective < int_objective(it, greedy)[0]
