"""Fleet benchmark: 50 jobs on 10 systems, every objective, CP-SAT allocation time and gap (results/bench/fleet.md).

The option tables are SYNTHETIC (no plan search): job j on n GPUs of system s runs at
tokens/s = base_j x (peak_s / peak_h100) x n x (n / node)^-beta_j (sub-linear scaling), with the system's catalog
price and power. This measures the allocation step alone; the plan searches behind real option tables are the
existing search's (results/bench/solver.md) and are cached.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from madmax_opt.fleet.allocate import greedy, solve_allocation
from madmax_opt.fleet.options import JobOption, OptionTable, SearchRunner, option_tables
from madmax_opt.fleet.solve import FleetRun, instance, value_of
from madmax_opt.fleet.spec import Fleet, FleetFile, Job, load_fleet, resolve_pool
from madmax_opt.io import catalog
from madmax_opt.search.cpsat import CpSatOptions

SYSTEMS = ("dgx-v100", "dgx-a100", "dgx-a100-40gb", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72",
           "mi300x-platform", "cloud-a-p5", "cloud-a-p4d")
SIZES_PER_SYSTEM = 6  # a node x 1, 2, 4, ... 32
OBJECTIVES = ("throughput", "deadlines", "cost", "energy")
EXAMPLE = Path("problems/fleet/example.yaml")  # timed with real option tables when run from the repository
H100_BF16_FLOPS = 989e12  # dgx-h100's GPU, the reference speed of the synthetic model


def synthetic_fleet(jobs: int = 50, systems: int = 10, objective: str = "throughput", seed: int = 0
                    ) -> tuple[Fleet, list[OptionTable]]:
    """A random fleet with synthetic option tables (see the module docstring)."""
    rng = np.random.default_rng(seed)
    names = SYSTEMS[:systems]
    pools_spec: dict[str, dict[str, Any]] = {}
    for i, sys_name in enumerate(names):
        node = catalog.lookup("system", sys_name, file=None, field=sys_name).gpus_per_node
        gpus = max(int(rng.choice([512, 1024, 2048])), node << (SIZES_PER_SYSTEM - 1))
        pools_spec[f"p{i}-{sys_name}"] = {"system": sys_name, "gpus": gpus, "sizes": [node << k for k in range(SIZES_PER_SYSTEM)]}
    job_specs: dict[str, dict[str, Any]] = {}
    kinds = rng.random(jobs) < 0.3  # serving
    base = np.exp(rng.uniform(np.log(1e3), np.log(2e4), jobs))  # tokens/s per H100
    beta = rng.uniform(0.02, 0.12, jobs)
    for j in range(jobs):
        spec: dict[str, Any] = {"problem": "synthetic.yaml", "weight": float(rng.choice([0.5, 1.0, 2.0, 4.0]))}
        if kinds[j]:
            spec["min_throughput"] = float(base[j] * rng.choice([8, 16, 32]))
            spec["duration_h"] = 720.0
        else:
            spec["train_tokens"] = float(base[j] * 64 * 3600 * rng.uniform(24, 240))  # 1-10 days on 64 H100
            if rng.random() < 0.5:
                spec["deadline_h"] = float(rng.choice([120.0, 240.0, 480.0]))
        job_specs[f"job{j:02d}"] = spec
    fleet_spec = FleetFile.model_validate({"systems": pools_spec, "jobs": job_specs, "objective": objective,
                                           "horizon_h": 720.0, "solver": {"time_limit_s": 30.0}})
    pools = tuple(resolve_pool(n, s, "synthetic") for n, s in fleet_spec.systems.items())
    resolved = tuple(Job(n, s, {}, "synthetic", bool(kinds[j]), s.train_tokens, None, s.min_throughput, "synthetic",
                         "inference" if kinds[j] else "pretrain") for j, (n, s) in enumerate(fleet_spec.jobs.items()))
    tables = []
    for j, job in enumerate(resolved):
        options = []
        for p in pools:
            peak = max(p.gpu.peak_flops.get("bf16", 0.0), p.gpu.peak_flops.get("fp16", 0.0))
            for n in p.sizes:
                tput = base[j] * peak / H100_BF16_FLOPS * n * (n / p.gpus_per_node) ** -beta[j]
                options.append(JobOption(job=job.name, system=p.name, gpu=p.gpu.name, gpus=n, nodes=n // p.gpus_per_node,
                                         plan={}, throughput=float(tput), samples_per_s=float(tput) / 4096,
                                         cost_per_hour_usd=p.system.price_per_gpu_hour * n,
                                         power_w=p.system.power_w_per_gpu * n, usd_per_million_tokens=0.0,
                                         memory_bytes_per_gpu=0.0, status="synthetic"))
        tables.append(OptionTable(job=job.name, options=options, infeasible={}))
    return Fleet("synthetic", fleet_spec, pools, resolved), tables


# ------------------------------------------------------------------ real fleets at scale (whole processes)

SCALE_SYSTEMS = ("dgx-h100", "dgx-a100", "dgx-h200", "dgx-b200", "mi300x-platform", "dgx-a100-40gb", "cloud-a-p5",
                 "cloud-a-p4d")  # 8 systems of 8-GPU nodes, sizes a node x 1, 2, 4, 8, 16
TRAINING_TEMPLATES: tuple[dict[str, Any], ...] = (
    {"model": "llama2-13b", "task": {"kind": "pretrain", "seq_len": 4096, "global_batch": 1024},
     "space": {"tp": [1, 2, 4, 8], "recompute": ["none", "selective", "full"]}},
    {"model": "llama3-8b", "task": {"kind": "finetune", "seq_len": 8192, "global_batch": 256},
     "space": {"tp": [1, 2, 4, 8], "recompute": ["none", "selective", "full"]}},
    {"model": "llama2-7b", "task": {"kind": "pretrain", "seq_len": 4096, "global_batch": 512},
     "space": {"tp": [1, 2, 4], "recompute": ["none", "full"]}},
    {"model": "llama2-70b", "task": {"kind": "pretrain", "seq_len": 4096, "global_batch": 1024},
     "space": {"tp": [4, 8], "pp": [1, 2, 4, 8], "recompute": ["selective", "full"]}},
)
SERVING_TEMPLATES: tuple[dict[str, Any], ...] = (
    {"model": "llama3-8b", "task": {"kind": "inference", "prompt_len": 1024, "output_len": 256,
                                    "precision": ["bf16", "fp8"], "ttft_s": 0.5, "tpot_s": 0.03}},
    {"model": "llama3-70b", "task": {"kind": "inference", "prompt_len": 2048, "output_len": 256,
                                     "precision": ["bf16", "fp8"], "ttft_s": 2.0, "tpot_s": 0.1}},
)


def scaled_fleet(jobs: int, seed: int = 0) -> dict[str, Any]:
    """A fleet file (mapping) of ``jobs`` jobs on the 8 SCALE_SYSTEMS x 5 sizes, 30 % serving: each job one of
    the templates above (so problems repeat, as in a real portfolio) with its own budget, deadline, rate, weight."""
    rng = np.random.default_rng(seed)
    systems = {f"s{i}-{name}": {"system": name, "gpus": 1024, "sizes": [8, 16, 32, 64, 128]}
               for i, name in enumerate(SCALE_SYSTEMS)}
    out: dict[str, Any] = {}
    for j in range(jobs):
        spec: dict[str, Any] = {"weight": float(rng.choice([0.5, 1.0, 2.0]))}
        if rng.random() < 0.3:
            spec["problem"] = SERVING_TEMPLATES[int(rng.integers(len(SERVING_TEMPLATES)))]
            spec["arrival_rate_rps"] = float(rng.choice([2.0, 5.0, 10.0]))
        else:
            spec["problem"] = TRAINING_TEMPLATES[int(rng.integers(len(TRAINING_TEMPLATES)))]
            spec["train_tokens"] = float(rng.choice([1e9, 5e9, 2e10]))
            if rng.random() < 0.5:
                spec["deadline_h"] = float(rng.choice([24.0, 72.0, 168.0]))
        out[f"job{j:03d}"] = spec
    return {"objective": "throughput", "horizon_h": 720.0, "systems": systems, "jobs": out,
            "solver": {"time_limit_s": 20.0}}


def time_fleet_command(jobs: int, extra: tuple[str, ...] = (), seed: int = 0) -> dict[str, Any]:
    """``madmax-opt fleet`` on ``scaled_fleet(jobs)`` as whole processes: cold (an empty cache) then warm."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fleet-{jobs}.yaml"
        path.write_text(yaml.safe_dump(scaled_fleet(jobs, seed), sort_keys=False))
        cmd = [sys.executable, "-m", "madmax_opt.cli.main", "fleet", str(path), "--json", "--cache",
               str(Path(tmp) / "cache"), *extra]
        walls, outs = [], []
        for _ in ("cold", "warm"):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - t0)
            if res.returncode != 0:
                raise RuntimeError(f"fleet benchmark failed: {res.stderr.strip()[-500:]}")
            outs.append(res.stdout)
        import json

        result = json.loads(outs[0])
        searches = len(list((Path(tmp) / "cache").glob("*.json")))
    return {"jobs": jobs, "cold_s": walls[0], "warm_s": walls[1], "searches": searches,
            "options": result["solver"]["options"], "status": result["solver"]["status"],
            "placed": sum(j["placed"] for j in result["jobs"]), "same": outs[0] == outs[1]}


def bench_row(objective: str, workers: int, seed: int, jobs: int = 50, systems: int = 10) -> dict[str, Any]:
    fleet, tables = synthetic_fleet(jobs, systems, objective, seed)
    run = FleetRun(fleet, tables, CpSatOptions(time_limit_s=fleet.spec.solver.time_limit_s, workers=workers))
    inst = instance(fleet, run.scored)
    t0 = time.perf_counter()
    alloc = solve_allocation(inst.inp, run.params)
    wall = time.perf_counter() - t0
    base = greedy(inst.inp)
    value, greedy_value = value_of(fleet, inst, alloc), value_of(fleet, inst, base)
    return {"objective": objective, "workers": workers, "seed": seed, "options": len(inst.inp.options),
            "status": alloc.status, "tie_break": alloc.tie_break, "gap": alloc.gap, "wall_s": wall, "value": value, "greedy": greedy_value,
            "gain": run.better(value, greedy_value), "placed": sum(c is not None for c in alloc.choice)}


def real_example_lines(path: Path, runner_for: Callable[[int], SearchRunner] | None = None) -> list[str]:
    """The example fleet with real option tables (plan searches, no cache) in 1 and 2 processes (``runner_for``:
    the CLI's local backend with that many processes)."""
    if not path.is_file():
        return []
    fleet = load_fleet(path)
    walls = []
    for workers in (1, 2):
        t0 = time.perf_counter()
        tables = option_tables(fleet, None, runner=runner_for(workers) if runner_for and workers > 1 else None)
        walls.append(time.perf_counter() - t0)
    run = FleetRun(fleet, tables, CpSatOptions(time_limit_s=fleet.spec.solver.time_limit_s))
    inst = instance(fleet, run.scored)
    alloc = solve_allocation(inst.inp, run.params)
    searches = sum(len(t.options) + len(t.infeasible) for t in tables)
    return ["", f"Real option tables: {path} ({len(fleet.jobs)} jobs, {len(fleet.pools)} systems): {searches} plan "
            f"searches (one per job, system and size, no cache) took {walls[0]:.1f} s in one process and "
            f"{walls[1]:.1f} s in two (`--search-workers 2`); the allocation over its {len(inst.inp.options)} "
            f"options took {alloc.wall_s:.2f} s ({alloc.status}).", ""]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.6g}"


def scale_lines(sizes: tuple[int, ...] = (50, 500)) -> list[str]:
    """Real fleets of ``sizes`` jobs (``scaled_fleet``) timed as whole ``madmax-opt fleet`` processes: cold (an
    empty option cache) and warm, with one and two search processes for the first size."""
    rows = [(n, w, time_fleet_command(n, ("--search-workers", str(w)))) for n in sizes for w in ((1, 2) if n == sizes[0]
                                                                                                  else (2,))]
    lines = ["", f"Real fleets at scale (`scaled_fleet`: {len(SCALE_SYSTEMS)} systems x 5 sizes, 30 % serving, jobs "
             f"drawn from {len(TRAINING_TEMPLATES)} training and {len(SERVING_TEMPLATES)} serving problems), whole "
             "`madmax-opt fleet --json` processes; cold: an empty option cache, warm: the same command again "
             "(allocation, what-if and binding constraints included). Each distinct search runs once.", "",
             "| jobs | search processes | distinct searches | options | status | placed | cold (s) | warm (s) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {w} | {r['searches']} | {r['options']:,} | {r['status']} | {r['placed']} | {r['cold_s']:.1f} | "
              f"{r['warm_s']:.1f} |" for n, w, r in rows]
    return [*lines, ""]


def write_fleet_bench(out: Path, seeds: int = 3, runner_for: Callable[[int], SearchRunner] | None = None) -> Path:
    rows = [bench_row(obj, w, seed) for obj in OBJECTIVES for w in (1, 2) for seed in range(seeds)]
    lines = [
        "# Fleet allocation benchmark: 50 jobs on 10 systems",
        "",
        "Regenerate: `madmax-opt bench-fleet --out results/bench` (about 30 s). "
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs; CP-SAT with 1 worker (deterministic, the "
        "default) and 2 workers; time limit 30 s per solve.",
        "",
        "Option tables are SYNTHETIC (module `madmax_opt.fleet.bench`): per job and system, 6 cluster sizes "
        "(a node x 1 ... 32) with sub-linear scaling and catalog prices and power, 30% serving jobs with a "
        "throughput floor, half the training jobs with a deadline. This times the allocation (CP-SAT over every "
        "option, plus the fewest-GPUs tie-break phase), not the per-option plan searches, which are the existing "
        "search's and are cached.",
        "",
        "| objective | workers | seed | options | jobs placed | status | gap | tie-break | CP-SAT wall (s) | optimum | "
        "greedy | gain over greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = "-" if r["gap"] is None else f"{r['gap']:.2%}"
        lines.append(f"| {r['objective']} | {r['workers']} | {r['seed']} | {r['options']:,} | {r['placed']} | "
                     f"{r['status']} | {gap} | {r['tie_break']} | {r['wall_s']:.2f} | {_fmt(r['value'])} | {_fmt(r['greedy'])} | "
                     f"{_fmt(r['gain'])} |")
    worst = max(r["wall_s"] for r in rows)
    proven = sum(r["status"] == "optimal" for r in rows)
    lines += ["", f"50 jobs: slowest solve {worst:.2f} s; proven optimal: {proven} of {len(rows)} (the others report "
              "their gap to CP-SAT's proven bound). Units: throughput = weighted tokens/s, deadlines = weight of "
              "jobs placed on time, cost = US$, energy = kWh; gain = optimum minus greedy (cost, energy: the "
              "saving); tie-break = the fewest-GPUs phase among equal objectives, proven (optimal) or stopped at its "
              "deterministic-time budget (feasible). Greedy '-': it cannot place every job (cost and energy need "
              "all of them).", ""]
    bigger = [bench_row(obj, 1, 0, jobs=n) for n in (100, 200) for obj in ("throughput", "cost")]
    lines += ["", "Larger portfolios on the same 10 systems (1 worker, seed 0):", "",
              "| jobs | objective | options | jobs placed | status | gap | CP-SAT wall (s) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {r['objective']} | {r['options']:,} | {r['placed']} | {r['status']} | "
              f"{'-' if r['gap'] is None else format(r['gap'], '.2%')} | {r['wall_s']:.2f} |"
              for n, r in zip((100, 100, 200, 200), bigger, strict=True)]
    lines += real_example_lines(EXAMPLE, runner_for)
    lines += scale_lines()
    lines += [f"Load average (1 min) at the end of the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} logical "
              "CPUs; the times are wall-clock, so a shared machine inflates them.", ""]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fleet.md"
    path.write_text("\n".join(lines))
    return path
