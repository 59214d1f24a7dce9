"""Option tables: each job's best plan on each (fleet system, GPU count), by the existing plan search.

Training jobs go through ``search.solver.solve_records`` and serving jobs through ``search.serving.solve_serving``
(both cross-checked against the exact evaluator), once per hardware option with objective throughput: at a fixed
system and GPU count the fastest plan is also the cheapest per token. Each distinct search is run once: jobs whose
resolved problems are identical on a (system, size) share it (the key: sha256 of the resolved problem, the time
limit and the source of the cost model and search). A training job's sizes on one system are priced in one
search over all of them (``search_options``: the same best plan per size as a search of that size alone). Searches
run in this process or through a sweep backend
(``studies.sweep.run_local`` / ``run_ray``, passed in by the CLI as a ``SearchRunner``). Results are cached on
disk under that key; an entry that is not JSON of the expected shape is searched again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from madmax_opt.core.errors import InfeasibleError, ProblemError, TimeLimitError
from madmax_opt.fleet.spec import Fleet, Job, Pool

if TYPE_CHECKING:
    from madmax_opt.model.problem import Problem

# the plan searches (analysis.evaluator, search.solver, search.serving: 0.3 s to import) are imported where a
# search runs: a fleet whose options are all cached never loads them

CACHE_VERSION = 1
Progress = Callable[[str], None]
# a sweep backend's job (key, label, payload) and row callback: studies.sweep.run_local / run_ray with search_row
SearchJob = tuple[str, dict[str, Any], dict[str, Any]]
SearchRunner = Callable[[list[SearchJob], Callable[[dict[str, Any]], None]], None]


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
    return _option_key(json.dumps(job.problem, sort_keys=True, default=str), pool.system.model_dump_json(), job, pool,
                       gpus, time_limit_s)


def _option_key(problem_text: str, system_text: str, job: Job, pool: Pool, gpus: int, time_limit_s: float) -> str:
    """``option_key`` given the job's problem mapping and the pool's system as JSON."""
    # the resolved problem depends only on the problem mapping, the directory its files are read from, the system
    # and the size: resolved once per distinct combination (jobs often repeat a problem), every size of the pool
    # at once (the options of a problem over several sizes are those of each size alone)
    memo = (problem_text, str(Path(job.source).parent), system_text, gpus, time_limit_s)
    if memo not in _KEYS:
        if len(_KEYS) > MAX_MEMO:
            _KEYS.clear()
        keys = _resolved_keys(job, pool, time_limit_s)
        _KEYS.update({(*memo[:3], n, time_limit_s): k for n, k in keys.items()})
        if gpus not in keys:
            _KEYS[memo] = _key(job.on(pool, [gpus]), time_limit_s)
    return _KEYS[memo]


_KEYS: dict[tuple[str, str, str, int, float], str] = {}
MAX_MEMO = 100_000


def _resolved_keys(job: Job, pool: Pool, time_limit_s: float) -> dict[int, str]:
    """GPU count -> key of every size of ``pool`` (none when the problem over them all is refused: each size alone
    then names why)."""
    try:
        problem = job.on(pool, list(pool.sizes))
    except ProblemError:
        return {}
    return {o.gpus: _key(replace(problem, hardware=(o,)), time_limit_s) for o in problem.hardware}


def _key(problem: Problem, time_limit_s: float) -> str:
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
    fleet: Fleet, cache_dir: Path | None = None, progress: Progress | None = None, runner: SearchRunner | None = None
) -> list[OptionTable]:
    """One table per job (in file order). Each distinct search (``option_key``) runs once, through ``runner``
    (default: one by one in this process), unless the cache holds it; jobs with the same key share its result."""
    limit = fleet.spec.solver.option_time_limit_s
    tasks = [(j, pool, n) for j, job in enumerate(fleet.jobs) for pool in fleet.pools
             if job.spec.systems is None or pool.name in job.spec.systems
             for n in pool.sizes if job.spec.max_gpus is None or n <= job.spec.max_gpus]
    problem_text = [json.dumps(job.problem, sort_keys=True, default=str) for job in fleet.jobs]
    pool_text = {pool.name: pool.system.model_dump_json() for pool in fleet.pools}
    keys = [_option_key(problem_text[j], pool_text[pool.name], fleet.jobs[j], pool, n, limit) for j, pool, n in tasks]
    first: dict[str, tuple[int, Pool, int]] = {}  # one search per distinct key, named after its first job
    for k, t in zip(keys, tasks, strict=True):
        first.setdefault(k, t)
    found: dict[str, dict[str, Any]] = {}
    for k in first:
        entry = _read_cache(cache_dir / f"{k}.json" if cache_dir else None)
        if entry is not None:
            found[k] = entry
    groups: dict[tuple[int, str], list[str]] = {}  # the sizes a job's problem is searched on, per system
    for k, (j, pool, _) in first.items():
        if k not in found:
            groups.setdefault((j, pool.name), []).append(k)
    todo: list[SearchJob] = [(ks[0], {}, {"job": fleet.jobs[j], "pool": first[ks[0]][1], "keys": ks,
                                          "sizes": [first[k][2] for k in ks], "limit": limit})
                             for (j, _), ks in groups.items()]
    members = {ks[0]: ks for ks in groups.values()}

    def on_row(row: dict[str, Any]) -> None:
        if row.get("status") == "error":  # the worker failed (not the search): listed as missing, never cached
            failed: dict[str, Any] = {"infeasible": f"search failed: {row['error']['message']}", "transient": True}
            rows: list[dict[str, Any]] = [{"key": k, **failed} for k in members[row["key"]]]
        else:
            rows = row["rows"]
        for one in rows:
            k = str(one["key"])
            entry = {key: v for key, v in one.items() if key != "key"}
            j, pool, n = first[k]
            found[k] = _store(cache_dir / f"{k}.json" if cache_dir else None, entry, progress,
                              f"{fleet.jobs[j].name} on {n} x {pool.system.name}")

    if todo:
        (runner or run_here)(todo, on_row)
    of_job: list[list[tuple[Pool, int, str]]] = [[] for _ in fleet.jobs]  # each job's (pool, size, key) in order
    for (j, pool, n), k in zip(tasks, keys, strict=True):
        of_job[j].append((pool, n, k))
    tables = []
    for j, job in enumerate(fleet.jobs):
        options: list[JobOption] = []
        infeasible: dict[str, str] = {}
        input_errors: list[str] = []
        for pool, n, k in of_job[j]:
            entry = found.get(k)
            if entry is None:
                continue
            if "option" in entry:  # the shared search, under this job's name
                options.append(JobOption.model_validate({**entry["option"], "job": job.name}))
            else:
                infeasible[f"{pool.name} x{n}"] = str(entry["infeasible"])
                if entry.get("input_error"):
                    input_errors.append(str(entry["infeasible"]))
        if not options and input_errors and len(input_errors) == len(infeasible):
            raise ProblemError(input_errors[0])  # the job's problem is wrong on every system
        tables.append(OptionTable(job=job.name, options=options, infeasible=infeasible))
    return tables


def run_here(todo: list[SearchJob], on_row: Callable[[dict[str, Any]], None]) -> None:
    """The default runner: every search in this process, in order."""
    for key, label, payload in todo:
        on_row(search_row(key, label, payload, "", {}))


def search_row(key: str, label: dict[str, Any], payload: dict[str, Any], source: str, solver: dict[str, Any]
               ) -> dict[str, Any]:
    """A job's option searches on one system with a sweep backend's signature (``studies.sweep`` SolveFn):
    ``payload`` holds the job, pool, GPU counts, their cache keys and the time limit; the row holds one cache
    entry with its key per size (``rows``)."""
    entries = search_options(payload["job"], payload["pool"], payload["sizes"], payload["limit"])
    return {"key": key, "rows": [{"key": k, **e} for k, e in zip(payload["keys"], entries, strict=True)]}


class CachedOption(BaseModel):
    """A cache entry: a feasible option, or why a (system, size) has none."""

    model_config = ConfigDict(extra="forbid")

    option: JobOption | None = None
    infeasible: str | None = None
    input_error: bool = False


def _read_cache(path: Path | None) -> dict[str, Any] | None:
    """The entry at ``path``, or None when it is missing, unreadable, not JSON, or not of the expected shape
    (exactly one of option / infeasible): it is searched again."""
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_bytes())
        entry = CachedOption.model_validate(raw)
    except (OSError, ValidationError, ValueError):
        return None
    if (entry.option is None) == (entry.infeasible is None):
        return None
    return dict(raw)


def _store(path: Path | None, entry: dict[str, Any], progress: Progress | None, what: str) -> dict[str, Any]:
    if progress is not None:
        progress(what)
    if path is not None and not entry.get("transient"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)
    return entry


def search_options(job: Job, pool: Pool, sizes: list[int], limit: float) -> list[dict[str, Any]]:
    """``search_option`` on each of ``sizes``. A uniform training search prices every size in one pass: one
    problem over the sizes, each size's best admissible plan (``prune.best_candidates`` keeps every hardware
    option's best, exactly as a search of that option alone) and their records together; a size with no admissible
    plan (or a serving job, an uneven-stage space, an error) is searched alone, which names why."""
    shared = {} if len(sizes) < 2 else _serving_bests(job, pool, sizes) if job.serving else _training_bests(
        job, pool, sizes, limit)
    return [_entry(job, pool, n, *shared[n]) if n in shared else search_option(job, pool, n, limit) for n in sizes]


def _training_bests(job: Job, pool: Pool, sizes: list[int], limit: float
                    ) -> dict[int, tuple[Mapping[str, Any], str]]:
    """GPU count -> (record, status) of the sizes whose best plan one search over all ``sizes`` finds (the same
    plan and record as ``_training_best`` on that size alone); the others are left out."""
    from madmax_opt.analysis.evaluator import Model, to_records
    from madmax_opt.search.cpsat import INT_LIMIT
    from madmax_opt.search.solver import SolveOutcome, admissible, candidates, cross_check

    try:
        problem = job.on(pool, sizes)
        if problem.space.uneven_stages:
            return {}
        model = Model(problem)
        c = candidates(model, keep_best=1, top_only=True)
        ok = admissible(model, c)
        objective = c.objective(problem.objective)
    except (ProblemError, InfeasibleError):  # each size alone says which
        return {}
    best: dict[int, int] = {}
    for i, option in enumerate(problem.hardware):  # its least objective, ties by position (as a search alone)
        idx = np.flatnonzero(ok & (c.plans.hw == i))
        first = idx[np.lexsort((idx, objective[idx]))][:1]
        if len(first) and objective[first[0]] < INT_LIMIT // 2:  # beyond a lone search's range: it names why
            best[option.gpus] = int(first[0])
    top = list(best.values())
    if not top:
        return {}
    records = to_records(model, c.plans.take(top))
    cross_check(SolveOutcome("optimal", top, None, None, 0.0, c, 0), records)
    return {n: (rec, "optimal") for n, rec in zip(best, records, strict=True)}


def _serving_bests(job: Job, pool: Pool, sizes: list[int]) -> dict[int, tuple[Mapping[str, Any], str]]:
    """``_training_bests`` of a serving job: one serving model over every size, each size's best admissible
    candidate (``solve_serving``'s selection restricted to that size) and their records together."""
    from madmax_opt.search import serving
    from madmax_opt.search.assemble import admissible_mask
    from madmax_opt.search.selection import select_best

    best: dict[int, int] = {}
    try:
        problem = job.on(pool, sizes)
        model = serving.ServingModel(problem)
        c = serving.candidates(model, None)
        ok = admissible_mask(c.valid, serving.target_limits(model, c) + serving.cluster(model, c))
        objective = c.int_objective(problem.objective)
        for i, option in enumerate(problem.hardware):
            try:
                pick = select_best(objective, ok & (c.plans.hw == i), c.plans.hw, file=problem.source)
            except ProblemError:  # beyond a lone search's range: it names why
                continue
            if pick is not None:
                best[option.gpus] = pick.top[0]
    except (ProblemError, InfeasibleError):  # each size alone says which
        return {}
    if not best:
        return {}
    top = list(best.values())
    outcome = serving.ServingOutcome("optimal", top, None, None, 0.0, c, 0)
    records = serving.serving_records(model, c, top)
    serving.cross_check(outcome, records, "throughput")
    return {n: (rec.to_json(), "optimal") for n, rec in zip(best, records, strict=True)}


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
    return _entry(job, pool, gpus, rec, status)


def _entry(job: Job, pool: Pool, gpus: int, rec: Mapping[str, Any], status: str) -> dict[str, Any]:
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
    from madmax_opt.search.solver import solve_records

    outcome, records = solve_records(problem, top_k=1, time_limit_s=limit, workers=1)
    return records[0], outcome.status


def _serving_best(problem: Problem, limit: float) -> tuple[Mapping[str, Any], str]:
    from madmax_opt.search import serving

    model = serving.ServingModel(problem)
    outcome = serving.solve_serving(problem, top_k=1, time_limit_s=limit, workers=1, model=model)
    records = serving.serving_records(model, outcome.candidates, outcome.top)
    serving.cross_check(outcome, records, "throughput")
    return records[0].to_json(), outcome.status

