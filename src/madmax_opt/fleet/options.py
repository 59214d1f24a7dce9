"""Option tables: each job's best plan on each (fleet system, GPU count), by the existing plan search.

Training jobs go through ``search.solver.solve_records`` and serving jobs through ``search.serving.solve_serving``
(both cross-checked against the exact evaluator), once per hardware option with objective throughput: at a fixed
system and GPU count the fastest plan is also the cheapest per token. Results are cached on disk, keyed by the
sha256 of the job's problem, the system, the GPU count and the source of the cost model and search (a change to
either invalidates the entry).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from madmax_opt.core.errors import InfeasibleError, ProblemError, TimeLimitError
from madmax_opt.fleet.spec import Fleet, Job, Pool
from madmax_opt.model.problem import Problem
from madmax_opt.search import serving
from madmax_opt.search.solver import solve_records

CACHE_VERSION = 1
Progress = Callable[[str], None]


class JobOption(BaseModel):
    """A job's best plan on ``gpus`` GPUs of one fleet system (what the allocation chooses among)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    system: str  # fleet system name
    gpu: str
    gpus: int
    nodes: int
    plan: dict[str, Any]
    throughput: float  # training tokens/s; serving output tokens/s of the deployment
    samples_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    cost_per_hour_usd: float
    power_w: float  # the whole allocation, wall power incl. host share
    usd_per_million_tokens: float
    memory_bytes_per_gpu: float
    status: str  # the plan search: optimal | feasible


class OptionTable(BaseModel):
    """Every option of one job; ``infeasible`` says why a (system, GPU count) has none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    options: list[JobOption]
    infeasible: dict[str, str]  # "system x gpus" -> reason


@cache
def code_digest() -> str:
    """sha256 over the cost model, search and catalog sources (a cached option is only valid for the same code)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in ("model", "search", "analysis", "io", "data"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".csv"):
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "madmax-opt" / "fleet"


def option_key(job: Job, pool: Pool, gpus: int, time_limit_s: float) -> str:
    """sha256 of the resolved problem on this hardware (catalog entries, calibration and files it names read in),
    the search's time limit and the code digest."""
    problem = job.on(pool, [gpus])
    payload = {
        "v": CACHE_VERSION,
        "code": code_digest(),
        "problem": {f.name: _plain(getattr(problem, f.name)) for f in fields(problem) if f.name != "source"},
        "time_limit_s": time_limit_s,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _plain(v: Any) -> Any:
    """pydantic models, dataclasses and tuples as JSON-able values (for the cache key)."""
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json")
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def option_tables(
    fleet: Fleet, cache_dir: Path | None = None, progress: Progress | None = None, workers: int = 1
) -> list[OptionTable]:
    """One table per job (in file order); each (job, system, size) searched once (``workers`` processes), then
    read from the cache."""
    limit = fleet.spec.solver.option_time_limit_s
    tasks = [(j, pool, n) for j, job in enumerate(fleet.jobs) for pool in fleet.pools
             if job.spec.systems is None or pool.name in job.spec.systems
             for n in pool.sizes if job.spec.max_gpus is None or n <= job.spec.max_gpus]
    paths = [cache_dir / f"{option_key(fleet.jobs[j], pool, n, limit)}.json" if cache_dir else None
             for j, pool, n in tasks]
    entries: list[dict[str, Any] | None] = [_read_cache(p) for p in paths]
    todo = [i for i, e in enumerate(entries) if e is None]
    args = [(fleet.jobs[tasks[i][0]], tasks[i][1], tasks[i][2], limit) for i in todo]
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool_exec:
            futures = [pool_exec.submit(search_option, *a) for a in args]
            for k, (i, fut) in enumerate(zip(todo, futures, strict=True)):
                entries[i] = _store(paths[i], fut.result(), progress, args[k])
    else:
        for i, a in zip(todo, args, strict=True):
            if progress is not None:
                progress(f"{a[0].name} on {a[2]} x {a[1].system.name}")
            entries[i] = _store(paths[i], search_option(*a), None, a)
    tables = []
    for j, job in enumerate(fleet.jobs):
        options: list[JobOption] = []
        infeasible: dict[str, str] = {}
        input_errors: list[str] = []
        for (jj, pool, n), entry in zip(tasks, entries, strict=True):
            if jj != j or entry is None:
                continue
            if "option" in entry:
                options.append(JobOption.model_validate(entry["option"]))
            else:
                infeasible[f"{pool.name} x{n}"] = str(entry["infeasible"])
                if entry.get("input_error"):
                    input_errors.append(str(entry["infeasible"]))
        if not options and input_errors and len(input_errors) == len(infeasible):
            raise ProblemError(input_errors[0])  # the job's problem is wrong on every system
        tables.append(OptionTable(job=job.name, options=options, infeasible=infeasible))
    return tables


def _read_cache(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        entry: dict[str, Any] = json.loads(path.read_text())
        return entry
    except (OSError, json.JSONDecodeError):
        return None  # a damaged entry is searched again


def _store(path: Path | None, entry: dict[str, Any], progress: Progress | None, what: tuple[Job, Pool, int, float]
           ) -> dict[str, Any]:
    if progress is not None:
        progress(f"{what[0].name} on {what[2]} x {what[1].system.name}")
    if path is not None and not entry.get("transient"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)
    return entry


def search_option(job: Job, pool: Pool, gpus: int, limit: float) -> dict[str, Any]:
    """{"option": JobOption} with the job's fastest plan on ``gpus`` GPUs of ``pool``, or {"infeasible": why}."""
    problem = job.on(pool, [gpus])
    try:
        rec, status = _serving_best(problem, limit) if job.serving else _training_best(problem, limit)
    except InfeasibleError as exc:
        return {"infeasible": " ".join(str(exc).split())}
    except TimeLimitError as exc:  # not a proof: listed as missing, never cached
        return {"infeasible": " ".join(str(exc).split()), "transient": True}
    except ProblemError as exc:  # e.g. a precision this GPU lacks: no option here (an error if none anywhere)
        return {"infeasible": " ".join(str(exc).split()), "input_error": True}
    power_w = pool.system.power_w_per_gpu * gpus
    common = {
        "job": job.name,
        "system": pool.name,
        "gpu": pool.gpu.name,
        "gpus": gpus,
        "nodes": gpus // pool.gpus_per_node,
        "plan": rec["plan"],
        "cost_per_hour_usd": rec["cost_per_hour_usd"],
        "power_w": power_w,
        "usd_per_million_tokens": rec["usd_per_million_tokens"],
        "status": status,
    }
    if job.serving:
        extra = {
            "throughput": rec["output_tokens_per_s"],
            "ttft_s": rec["ttft_s"],
            "tpot_s": rec["tpot_s"],
            "memory_bytes_per_gpu": rec["memory_bytes_per_gpu"]["total"],
        }
    else:
        extra = {
            "throughput": rec["tokens_per_s"],
            "samples_per_s": rec["samples_per_s"],
            "step_time_s": rec["step_time_s"],
            "mfu": rec["mfu"],
            "memory_bytes_per_gpu": rec["memory_bytes_per_gpu"]["total"],
        }
    return {"option": JobOption(**common, **extra).model_dump(mode="json")}


def _training_best(problem: Problem, limit: float) -> tuple[Mapping[str, Any], str]:
    outcome, records = solve_records(problem, top_k=1, time_limit_s=limit, workers=1)
    return records[0], outcome.status


def _serving_best(problem: Problem, limit: float) -> tuple[Mapping[str, Any], str]:
    model = serving.ServingModel(problem)
    outcome = serving.solve_serving(problem, top_k=1, time_limit_s=limit, workers=1, model=model)
    records = serving.to_records(model, outcome.candidates, outcome.top)
    serving.cross_check(outcome, records, "throughput")
    return records[0], outcome.status

