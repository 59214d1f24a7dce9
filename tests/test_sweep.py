"""Sweeps: validation before work, results equal to direct solves, resume after SIGINT/SIGTERM and torn writes,
failing problems recorded, a dead worker isolated, Ray == local, and the report's Pareto front and metrics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from madmax_opt.analysis.evaluator import evaluate
from madmax_opt.core.errors import InfeasibleError, ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.spec import Plan
from madmax_opt.report.sweep_commands import write_report
from madmax_opt.report.sweep_report import pareto_front, point
from madmax_opt.search.result import solve_result
from madmax_opt.studies.sweep import run_local, run_sweep
from madmax_opt.studies.sweep_results import comparable, read_rows, solve_one
from madmax_opt.studies.sweep_spec import RESULTS_FILE, load_sweep

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from madmax_opt.cli.main import main; main()"]
TASK = {"kind": "pretrain", "seq_len": 2048, "global_batch": 512, "train_tokens": 1.0e11}

SMALL = {  # 12 problems, one of them out of memory (Llama-2 70B on 64 V100-16GB)
    "description": "test sweep",
    "models": ["llama-7b", "llama2-70b"],
    "task": TASK,
    "hardware": [{"gpu": "h100-sxm", "gpus": [64, 128]}, {"system": "cloud-a-p3-16xlarge", "gpus": 64}],
    "objectives": ["throughput", "cost"],
}
# 120 problems for the interrupt tests: 2 models x 6 systems x 10 sizes
SYSTEMS_6 = ["dgx-a100", "dgx-h100", "dgx-v100", "cloud-a-p4d", "cloud-b-nd96asr-v4", "mi300x-platform"]
MEDIUM = {
    "models": ["llama-7b", "llama2-13b"],
    "task": TASK,
    "hardware": [{"system": s, "gpus": [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]} for s in SYSTEMS_6],
}


def write_sweep(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def result_lines(outdir: Path) -> list[dict[str, Any]]:
    """Every line of results.jsonl parsed; fails on a torn or corrupt line."""
    text = (outdir / RESULTS_FILE).read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("small")
    sweep_file = write_sweep(d / "small.yaml", SMALL)
    run_sweep(load_sweep(sweep_file), d / "out", workers=1)
    return sweep_file, d / "out"


@pytest.fixture(scope="module")
def medium_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The medium sweep run once without interruption (2 local workers): the rows every resumed run must equal."""
    d = tmp_path_factory.mktemp("medium")
    sweep_file = write_sweep(d / "medium.yaml", MEDIUM)
    run = run_sweep(load_sweep(sweep_file), d / "out", workers=2)
    assert run.solved == 120 and not run.interrupted
    return sweep_file, {k: comparable(r) for k, r in read_rows(d / "out" / RESULTS_FILE).items()}


# ------------------------------------------------------------------------------------------ expansion


def test_expansion_crosses_everything_with_stable_distinct_keys(tmp_path: Path) -> None:
    data = SMALL | {
        "hardware": [
            {"gpu": "h100-sxm", "gpus": [64, 128]},
            {"system": "cloud-a-p4*", "gpus": {"start": 64, "stop": 128, "step": 64}},
        ]
    }
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", data))
    labels = [c.label for c in sweep.combinations]
    # 2 models x (dgx-h100 + cloud-a-p4d + cloud-a-p4de) x 2 sizes x 2 objectives
    assert len(labels) == 2 * 3 * 2 * 2
    assert {lab["system"] for lab in labels} == {"dgx-h100", "cloud-a-p4d", "cloud-a-p4de"}
    assert len({(lab["model"], lab["system"], lab["gpus"], lab["objective"]) for lab in labels}) == 24
    keys = [c.key for c in sweep.combinations]
    assert len(set(keys)) == 24
    assert keys == [c.key for c in load_sweep(tmp_path / "s.yaml").combinations]  # stable
    changed = load_sweep(write_sweep(tmp_path / "t.yaml", data | {"space": {"tp": [1, 2]}}))
    assert not set(keys) & {c.key for c in changed.combinations}  # another space is another problem
    every = load_sweep(
        write_sweep(
            tmp_path / "all.yaml",
            SMALL | {"hardware": [{"system": "all", "gpus": 64}], "objectives": ["throughput"]},
        )
    )
    assert {c.label["system"] for c in every.combinations} == set(catalog.systems())


def test_deadline_and_budget_reach_the_problems_as_written(tmp_path: Path) -> None:
    cons = {"deadline_hours": 100.0, "budget_usd": 50_000.0, "min_throughput": 1000.0}
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", SMALL | {"constraints": cons}))
    for c in sweep.combinations:  # the problem enforces each (tests/test_budget.py) and names the one that binds
        assert c.problem["constraints"] == cons


def test_every_checked_in_sweep_file_validates() -> None:
    files = sorted((ROOT / "problems" / "sweeps").glob("*.yaml"))
    assert files
    for f in files:
        assert load_sweep(f).combinations


# ------------------------------------------------------------------------------------------ validation

BAD = [
    ({"hardware": [{"system": "dgx-h999", "gpus": 64}]}, "hardware[0].system", "unknown system 'dgx-h999'"),
    ({"hardware": [{"system": "cloud-z*", "gpus": 64}]}, "hardware[0].system", "unknown system 'cloud-z*'"),
    ({"hardware": [{"gpu": "h999", "gpus": 64}]}, "hardware[0].gpu", "unknown gpu 'h999'"),
    ({"models": []}, "models", "empty"),
    ({"models": ["llama-7b", "gpt-5"]}, "models[1]", "unknown model 'gpt-5'"),
    ({"hardware": [{"system": "dgx-h100", "gpus": []}]}, "hardware[0].gpus", "empty"),
    ({"hardware": []}, "hardware", "empty"),
    ({"objectives": []}, "objectives", "empty"),
    ({"hardware": [{"system": "dgx-h100", "gpus": [64, 12]}]}, "hardware[0].gpus", "not a whole number"),
    (
        {"hardware": [{"system": "dgx-h100", "gpus": 64}, {"gpu": "h100-sxm", "gpus": 64}]},
        "hardware[1]",
        "listed twice",
    ),
    (
        {"task": {"seq_len": 2048, "global_batch": 512}, "objectives": ["time_to_train"]},
        "task.train_tokens",
        "objective time_to_train needs the token budget",
    ),
    ({"task": {"global_batch": 512}}, "hardware[0] x models[0]", "seq_len"),
    (
        {"task": {"seq_len": 2048, "global_batch": 512}, "constraints": {"budget_usd": 1e6}},
        "constraints.budget_usd",
        "train_tokens",
    ),
    ({"space": {"tp": []}}, "space.tp", "empty"),
]


@pytest.mark.parametrize(("change", "field", "message"), BAD)
def test_sweep_errors_name_file_and_field_before_any_work(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    path = write_sweep(tmp_path / "bad.yaml", SMALL | change)
    with pytest.raises(ProblemError) as info:
        load_sweep(path)
    text = str(info.value)
    assert text.startswith(f"{path}: {field}"), text
    assert message in text and "\n" not in text


def test_cli_rejects_a_bad_sweep_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "bad.yaml", SMALL | {"hardware": [{"system": "dgx-h999", "gpus": 64}]})
    out = tmp_path / "out"
    proc = subprocess.run(
        [*CLI, "sweep", str(path), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"{path}: hardware[0].system: unknown system" in proc.stderr
    assert not out.exists()


# ------------------------------------------------------------------------------------------ results


def test_rows_equal_direct_solves_with_madmax_baseline(small_run: tuple[Path, Path]) -> None:
    sweep_file, out = small_run
    sweep = load_sweep(sweep_file)
    rows = read_rows(out / RESULTS_FILE)
    assert set(rows) == {c.key for c in sweep.combinations}
    statuses = []
    for c in sweep.combinations:
        row = rows[c.key]
        statuses.append(row["status"])
        problem = problem_from_dict(c.problem, source=str(sweep_file))
        if row["status"] == "infeasible":
            with pytest.raises(InfeasibleError) as info:
                solve_result(problem, 1, 60.0, 1)
            assert row["error"]["message"] == " ".join(str(info.value).split())
            continue
        direct = comparable(
            {
                "key": c.key,
                "combination": c.label,
                "status": "ok",
                "error": None,
                "result": solve_result(problem, 1, 60.0, 1),
            }
        )
        assert comparable(row) == json.loads(json.dumps(direct))
        n = c.label["gpus"]
        base_plan = Plan(dp=n, tp=1, pp=1, zero=3, mbs=1, recompute="full", system=c.label["system"])
        base = evaluate(problem, [base_plan])[0]
        assert row["result"]["baseline"]["plan"] == base_plan.model_dump()
        assert row["result"]["baseline"]["tokens_per_s"] == pytest.approx(base["tokens_per_s"], rel=1e-12)
        if base["feasible"]:
            ratio = row["result"]["best"]["tokens_per_s"] / base["tokens_per_s"]
            assert row["result"]["speedup_vs_baseline"] == pytest.approx(ratio, rel=1e-12)
    assert statuses.count("infeasible") == 2  # llama2-70b on 64 V100-16GB, for both objectives
    assert statuses.count("ok") == 10


def test_table_and_report_metrics(small_run: tuple[Path, Path]) -> None:
    import csv

    _, out = small_run
    table = list(csv.DictReader((out / "results.csv").open()))
    assert len(table) == 12
    for r in table:
        if r["status"] != "ok":
            continue
        # tokens/J two ways: tokens/s / (GPUs x W) and the evaluator's energy for the token budget
        per_joule = float(r["tokens_per_joule"])
        assert per_joule == pytest.approx(1.0e11 / (float(r["energy_mwh"]) * 3.6e9), rel=1e-9)
        assert float(r["time_to_train_h"]) == pytest.approx(
            1.0e11 / float(r["tokens_per_s"]) / 3600, rel=1e-9
        )


def weakly_dominated(pts: list[tuple[float, float]], i: int) -> bool:
    """Some other point is no worse in both coordinates (an identical earlier point counts as dominating)."""
    p = pts[i]
    return any(q[0] <= p[0] and q[1] <= p[1] and (q != p or j < i) for j, q in enumerate(pts) if j != i)


def test_pareto_front_matches_brute_force_dominance() -> None:
    rng = random.Random(5)
    for _ in range(200):
        pts = [(float(rng.randint(1, 12)), float(rng.randint(1, 12))) for _ in range(rng.randint(1, 25))]
        assert set(pareto_front(pts)) == {i for i in range(len(pts)) if not weakly_dominated(pts, i)}


def test_report_writes_front_tables_and_png_plots(small_run: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, out = small_run
    md = write_report(out, tmp_path / "rep.md")
    text = md.read_text()
    for name in ("pareto_time_cost", "throughput_vs_gpus", "throughput_per_gpu", "tokens_per_joule"):
        png = tmp_path / "rep-plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(rep-plots/{name}.png)" in text
    rows = [r for r in read_rows(out / RESULTS_FILE).values() if r["status"] == "ok"]
    for model in ("llama-7b", "llama2-70b"):  # the front section lists exactly the brute-force front
        pts = [point(r) for r in rows if r["combination"]["model"] == model]
        on_front = {
            (p.system, p.gpus)
            for i, p in enumerate(pts)
            if not any(
                (q.time_s <= p.time_s and q.cost_usd <= p.cost_usd)
                and (q.time_s, q.cost_usd) != (p.time_s, p.cost_usd)
                for q in pts
            )
        }
        section = text.split(f"### {model} (task 0")[1].split("###")[0].split("\n## ")[0]
        listed = {
            (line.split(" | ")[1], int(line.split(" | ")[3]))  # | # | system | GPU | GPUs | ...
            for line in section.splitlines()
            if line.startswith("| ") and "GPUs" not in line
        }
        assert listed == on_front
    assert (
        "## Best per objective" in text
        and "## Best per system" in text
        and "Speedup over the MAD-Max" in text
    )


def test_report_of_a_directory_without_a_sweep_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "report", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "sweep.json" in proc.stderr and proc.stderr.count("\n") == 1


# ------------------------------------------------------------------------------------------ failures


def test_a_failing_problem_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import madmax_opt.search.result

    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", SMALL))
    real = madmax_opt.search.result.solve_result

    def flaky(problem: Any, *args: Any) -> dict[str, Any]:
        if problem.hardware[0].gpus == 128:
            raise RuntimeError("boom at 128")
        return real(problem, *args)

    monkeypatch.setattr(madmax_opt.search.result, "solve_result", flaky)
    run = run_sweep(sweep, tmp_path / "out", workers=1)
    assert (run.counts.ok, run.counts.infeasible, run.counts.error) == (6, 2, 4)
    errors = [r for r in result_lines(tmp_path / "out") if r["status"] == "error"]
    assert {r["combination"]["gpus"] for r in errors} == {128}
    assert all(r["error"] == {"type": "RuntimeError", "message": "boom at 128"} for r in errors)

    monkeypatch.setattr(madmax_opt.search.result, "solve_result", real)
    assert run_sweep(sweep, tmp_path / "out", workers=1).solved == 0  # errors are finished problems
    again = run_sweep(sweep, tmp_path / "out", workers=1, retry_errors=True)
    assert again.solved == 4 and again.counts.ok == 4
    lines = result_lines(tmp_path / "out")
    assert sorted(r["key"] for r in lines) == sorted(c.key for c in sweep.combinations)


def test_a_second_sweep_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    import fcntl

    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", SMALL))
    out = tmp_path / "out"
    out.mkdir()
    held = os.open(out, os.O_RDONLY)  # as a running sweep holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ProblemError, match="another sweep is writing to this directory"):
            run_sweep(sweep, out, workers=1)
    finally:
        os.close(held)
    assert not (out / RESULTS_FILE).exists()


def crashing_solve(
    key: str, label: dict[str, Any], problem: dict[str, Any], source: str, solver: dict[str, Any]
) -> dict[str, Any]:
    """Kills its worker process on the 128-GPU problems (as an out-of-memory kill would)."""
    if label["gpus"] == 128:
        os._exit(9)
    return solve_one(key, label, problem, source, solver)


def test_a_dead_worker_is_isolated_to_its_problem(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", SMALL | {"objectives": ["throughput"]}))
    rows: list[dict[str, Any]] = []
    todo = [(c.key, c.label, c.problem) for c in sweep.combinations]
    run_local(todo, sweep.path, sweep.spec.solver.model_dump(), 2, rows.append, fn=crashing_solve)
    assert sorted(r["key"] for r in rows) == sorted(t[0] for t in todo)
    died = {r["key"] for r in rows if r["status"] == "error"}
    assert died == {c.key for c in sweep.combinations if c.label["gpus"] == 128}
    assert all(r["error"]["type"] == "WorkerDied" for r in rows if r["key"] in died)
    assert sum(r["status"] == "ok" for r in rows) == 3  # llama-7b x2, llama2-70b on 64 H100


# ------------------------------------------------------------------------------------------ interrupts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sweep_resumes_without_lost_or_duplicated_rows(
    tmp_path: Path, medium_reference: tuple[Path, dict[str, dict[str, Any]]], sig: signal.Signals
) -> None:
    sweep_file, reference = medium_reference
    out = tmp_path / "out"
    cmd = [*CLI, "sweep", str(sweep_file), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = out / RESULTS_FILE
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_bytes().count(b"\n") >= 30:
            break
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    first = result_lines(out)
    assert 30 <= len(first) < 120, "the sweep was not interrupted halfway"
    assert len({r["key"] for r in first}) == len(first)

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"skipped {len(first)} already done" in rerun.stderr
    lines = result_lines(out)
    keys = [r["key"] for r in lines]
    assert len(keys) == len(set(keys)) == 120  # every problem exactly once
    assert {r["key"]: comparable(r) for r in lines} == reference
    assert (out / "results.csv").read_text().count("\n") == 121


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_a_sweep_leaves_no_process_behind(tmp_path: Path) -> None:
    """The workers and the resource tracker exit when the sweep process is killed with SIGKILL (no handler)."""
    sweep_file = write_sweep(tmp_path / "medium.yaml", MEDIUM)
    out = tmp_path / "out"
    cmd = [*CLI, "sweep", str(sweep_file), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        kids: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            kids = _children(proc.pid)
            if len(kids) >= 3 and (out / RESULTS_FILE).exists():  # two workers and the resource tracker, working
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(kids) >= 3, kids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.05)
        assert not [k for k in kids if _alive(k)], "processes left behind after SIGKILL of the sweep"
    finally:  # whatever failed, leave nothing behind
        for k in (kids | _children(proc.pid)) if kids else set():
            if _alive(k):
                os.kill(k, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_torn_last_line_is_dropped_and_its_problem_solved_again(
    tmp_path: Path, small_run: tuple[Path, Path]
) -> None:
    sweep_file, done = small_run
    out = tmp_path / "out"
    out.mkdir()
    lines = (done / RESULTS_FILE).read_text().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]  # a crash in the middle of the last write
    (out / RESULTS_FILE).write_text("".join(lines[:-1]) + torn)
    run = run_sweep(load_sweep(sweep_file), out, workers=1)
    assert run.skipped == 11 and run.solved == 1
    reference = {k: comparable(r) for k, r in read_rows(done / RESULTS_FILE).items()}
    assert {r["key"]: comparable(r) for r in result_lines(out)} == reference


# ------------------------------------------------------------------------------------------ ray


def test_ray_backend_gives_the_local_results(tmp_path: Path, small_run: tuple[Path, Path]) -> None:
    ray = pytest.importorskip("ray", reason="ray is an optional extra: pip install 'madmax-opt[ray]'")
    sweep_file, local = small_run
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = tmp_path / "out"
        cmd = [
            *CLI,
            "sweep",
            str(sweep_file),
            "--out",
            str(out),
            "--backend",
            "ray",
            "--address",
            ctx.address_info["address"],
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    finally:
        ray.shutdown()
    expected = {k: comparable(r) for k, r in read_rows(local / RESULTS_FILE).items()}
    got = {r["key"]: comparable(r) for r in result_lines(out)}
    assert got == expected


# ------------------------------------------------------------------------------------------ benchmark


@pytest.mark.slow
def test_benchmark_500_problems_within_3_minutes(tmp_path: Path) -> None:
    sweep_file = ROOT / "problems" / "sweeps" / "bench-500.yaml"
    assert len(load_sweep(sweep_file).combinations) == 500
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*CLI, "sweep", str(sweep_file), "--out", str(tmp_path), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall_s = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert len({r["key"] for r in result_lines(tmp_path)}) == 500
    assert wall_s <= 180.0, f"500-problem sweep took {wall_s:.1f} s"


def test_an_interrupt_while_a_pool_runs_is_raised_between_waits() -> None:
    """SIGINT / SIGTERM during a pool is recorded by the handler and raised by the pool loop at its next turn (raised
    inside the handler it could land while concurrent.futures.wait held a future's lock, and the pool's shutdown then
    waited on that lock forever: a sweep printed 'interrupted (SIGTERM)' and never exited); with no pool running the
    handler raises at once."""
    from collections import deque

    from madmax_opt.studies import sweep as sw

    with pytest.raises(KeyboardInterrupt):
        sw._on_signal(signal.SIGINT, None)
    sw._INTERRUPT.pool_running = True
    try:
        sw._on_signal(signal.SIGTERM, None)  # recorded, not raised
    finally:
        sw._INTERRUPT.pool_running = False
    rows: list[dict[str, Any]] = []
    with pytest.raises(sw._Terminated):
        sw._run_pool(deque([("k", "label", {})]), "sweep.yaml", {}, 2, rows.append, sw.solve_one)
    assert rows == [] and sw._INTERRUPT.caught is None and not sw._INTERRUPT.pool_running
