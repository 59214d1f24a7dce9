"""Fleet files: systems with their GPU supply, jobs (problem files or inline problems) with their targets, and
an objective. Strict pydantic shapes (unknown keys are errors), bounded sizes, one-line errors via
``io.problem.validate``; ``madmax-opt fleet --schema`` prints the JSON Schema."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Field, PositiveInt, Tag

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.file_family import file_family
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.problem_file import ModelRef, SystemRef, TaskRef
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.family_name import FamilyName
from madmax_opt.model.objectives import FLEET_OBJECTIVES, FleetObjectiveName
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import GPU, Constraints, Space, Stack, Strict, System

MAX_SYSTEMS = 32
MAX_JOBS = 500
MAX_SIZES = 16  # cluster sizes offered per system
MAX_GPUS = 1_000_000
WHAT_IF_GPUS = (256, 512, 1024)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class FleetSystem(Strict):
    """A pool of one system type: how many GPUs are free, and optionally its price and power."""

    system: SystemRef = Field(description="catalog system name or an inline system")
    gpus: Annotated[int, Field(gt=0, le=MAX_GPUS, description="GPUs available in this pool")]
    price_per_gpu_hour: float | None = Field(None, ge=0.0, le=1e4, description="US$ per GPU-hour (default: catalog)")
    power_w_per_gpu: float | None = Field(None, gt=0.0, le=1e5, description="wall W per GPU (default: catalog)")
    sizes: Annotated[list[PositiveInt], Field(min_length=1, max_length=MAX_SIZES)] | None = Field(
        None, description="cluster sizes offered to jobs (multiples of gpus_per_node); default: a node times 1, "
        "2, 4, ... up to gpus"
    )


class InlineProblem(Strict):
    """A problem written inside the fleet file (no hardware: the fleet's systems are the hardware)."""

    model: ModelRef
    task: TaskRef
    space: Space = Space()
    stack: Stack = Stack()
    constraints: Constraints = Constraints()


def _file_or_inline(v: Any) -> str:
    return "file" if isinstance(v, str) else "inline"


ProblemRef = Annotated[
    Annotated[str, Tag("file")] | Annotated[InlineProblem, Tag("inline")], Discriminator(_file_or_inline)
]


class FleetJob(Strict):
    """One job: its problem and what it needs (targets filter the options; weights score them)."""

    problem: ProblemRef = Field(description="problem file (relative to the fleet file) or an inline problem; its "
                                "hardware, objective and baseline are ignored")
    weight: float = Field(1.0, gt=0.0, le=1e6, description="value of the job (objectives throughput, deadlines)")
    priority: int | None = Field(None, ge=0, le=1_000_000, description="greedy order, lowest first (default: by "
                                 "weight, heaviest first, then file order)")
    required: bool = Field(False, description="must be placed (always true for objectives cost and energy)")
    deadline_h: float | None = Field(None, gt=0.0, le=1e6, description="training: hours to finish its budget")
    train_tokens: float | None = Field(None, gt=0.0, le=1e18, description="training token budget (default: task)")
    train_samples: float | None = Field(None, gt=0.0, le=1e15, description="training sample (sequence) budget")
    min_throughput: float | None = Field(None, gt=0.0, le=1e12, description="tokens/s (serving: output tokens/s)")
    arrival_rate_rps: float | None = Field(None, gt=0.0, le=1e9, description="serving: requests/s to sustain")
    duration_h: float | None = Field(None, gt=0.0, le=1e6, description="serving: hours it runs (default horizon_h)")
    systems: Annotated[list[str], Field(min_length=1, max_length=MAX_SYSTEMS)] | None = Field(
        None, description="restrict to these fleet systems"
    )
    max_gpus: Annotated[int, Field(gt=0, le=MAX_GPUS)] | None = None


class Budget(Strict):
    usd_per_hour: float | None = Field(None, gt=0.0, description="US$ per hour of all placed jobs together")
    usd: float | None = Field(None, gt=0.0, description="US$ of all placed jobs over their durations")


class FleetSolver(Strict):
    time_limit_s: float = Field(30.0, gt=0.0, le=3600.0, description="CP-SAT time limit of the allocation, s")
    workers: int = Field(1, ge=1, le=64, description="CP-SAT workers (1 = deterministic)")
    what_if_gpus: Annotated[list[PositiveInt], Field(max_length=6)] = Field(
        list(WHAT_IF_GPUS), description="extra GPUs per system tried in the what-if"
    )
    option_time_limit_s: float = Field(60.0, gt=0.0, le=3600.0, description="per-option plan search limit, s")


class FleetFile(Strict):
    """The YAML fleet file. ``madmax-opt fleet --schema`` prints its JSON Schema."""

    systems: Annotated[dict[Name, FleetSystem], Field(min_length=1, max_length=MAX_SYSTEMS)]
    jobs: Annotated[dict[Name, FleetJob], Field(min_length=1, max_length=MAX_JOBS)]
    objective: FleetObjectiveName = Field("throughput", description="; ".join(
        f"{o.name}: {o.summary}" for o in FLEET_OBJECTIVES.values()))
    horizon_h: float | None = Field(None, gt=0.0, le=1e6, description="hours serving jobs (and training jobs "
                                    "without a budget) run, for cost and energy")
    budget: Budget = Budget()
    solver: FleetSolver = FleetSolver()


# --------------------------------------------------------------------------------------------- resolved


@dataclass(frozen=True)
class Pool:
    """A resolved fleet system: catalog entry with overrides, supply in GPUs and whole nodes, sizes offered."""

    name: str
    system: System
    gpu: GPU
    gpus: int
    sizes: tuple[int, ...]

    @property
    def gpus_per_node(self) -> int:
        return self.system.gpus_per_node

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


@dataclass(frozen=True)
class Job:
    """A resolved job: the problem mapping (no hardware), its kind, budgets and targets."""

    name: str
    spec: FleetJob
    problem: dict[str, Any]
    source: str
    serving: bool
    train_tokens: float | None
    train_samples: float | None
    min_throughput: float | None  # tokens/s (serving: output tokens/s), arrival rate included
    model_name: str
    task_kind: str

    def on(self, pool: Pool, sizes: list[int]) -> Problem:
        """The job's problem on ``sizes`` GPUs of ``pool`` (objective throughput: fastest plan per option)."""
        return _problem_on(self.problem, self.source, pool, sizes)

    def hours(self, horizon_h: float | None) -> float | None:
        """How long a job without a training budget runs (serving: duration_h, else the horizon)."""
        return self.spec.duration_h or horizon_h


@dataclass(frozen=True)
class Fleet:
    path: str
    spec: FleetFile
    pools: tuple[Pool, ...]
    jobs: tuple[Job, ...]


def load_fleet(path: str | Path) -> Fleet:
    """Read, validate and resolve a fleet file: every job's problem is checked before any search starts."""
    file = str(path)
    data = read_yaml(path, what="fleet file")
    if not isinstance(data, dict):
        keys = ", ".join(FleetFile.model_fields)
        raise ProblemError(f"expected a mapping; allowed: a mapping with keys {{{keys}}}", file=file)
    for key, what in (("systems", "fleet system"), ("jobs", "job")):
        if data.get(key) in ({}, []):
            raise ProblemError(f"empty; allowed: a mapping of {what} names to {what}s, at least 1", file=file,
                               field=key)
        named = data.get(key)  # anything but a mapping is the schema's error (validate below)
        bad = [k for k in named if not re.match(NAME_PATTERN, str(k))] if isinstance(named, dict) else []
        if bad:
            raise ProblemError(f"{what} name {bad[0]!r}; allowed: letters, digits, '_', '.' and '-', starting with a "
                               "letter or digit, at most 64 characters", file=file, field=f"{key}.{bad[0]}")
    spec: FleetFile = validate(FleetFile, data, file=file)
    pools = tuple(resolve_pool(name, s, file) for name, s in spec.systems.items())
    jobs = tuple(_job(name, j, spec, pools, Path(file).parent, file) for name, j in spec.jobs.items())
    return Fleet(file, spec, pools, jobs)


def resolve_pool(name: str, s: FleetSystem, file: str) -> Pool:
    field = f"systems.{name}"
    if isinstance(s.system, System):
        system = s.system
    else:
        system = catalog.lookup("system", s.system, file=file, field=f"{field}.system")
    update = {k: v for k, v in (("price_per_gpu_hour", s.price_per_gpu_hour), ("power_w_per_gpu", s.power_w_per_gpu))
              if v is not None}
    system = system.model_copy(update=update)
    gpu: GPU = catalog.lookup("gpu", system.gpu, file=file, field=f"{field}.system.gpu")
    node = system.gpus_per_node
    if s.gpus < node:
        raise ProblemError(f"{s.gpus} GPUs is less than one node of {system.name}; allowed: >= {node}",
                           file=file, field=f"{field}.gpus")
    if s.sizes is None:
        sizes = [node << k for k in range(MAX_SIZES) if node << k <= s.gpus]
    else:
        sizes = sorted(set(s.sizes))
        bad = [n for n in sizes if n % node or n > s.gpus]
        if bad:
            raise ProblemError(f"size {bad[0]} is not a whole number of {node}-GPU nodes within {s.gpus} GPUs; "
                               f"allowed: multiples of {node} up to {s.gpus}", file=file, field=f"{field}.sizes")
    return Pool(name, system, gpu, s.gpus, tuple(sizes))


def _job(name: str, j: FleetJob, spec: FleetFile, pools: tuple[Pool, ...], base: Path, file: str) -> Job:
    field = f"jobs.{name}"
    if isinstance(j.problem, str):
        source = str(base / j.problem)
        if not os.path.lexists(base / j.problem):  # a symlink loop or a FIFO: read_yaml says which, in one line
            raise ProblemError(f"{j.problem} not found (looked for {os.path.abspath(base / j.problem)}); allowed: a problem "
                               "file, relative to the fleet file", file=file, field=f"{field}.problem")
        raw = read_yaml(base / j.problem, what=f"problem file of {field}")
        if not isinstance(raw, dict):
            raise ProblemError("expected a problem mapping; allowed: a problem file (see 'madmax-opt schema')",
                               file=source)
        problem = {k: v for k, v in raw.items() if k not in ("hardware", "objective", "baseline")}
    else:
        source = f"{file}: {field}.problem"
        problem = j.problem.model_dump(mode="json", exclude_unset=True)
    if file_family(problem) is FamilyName.RECOMMENDER:
        raise ProblemError("recommender (DLRM) jobs are not offered in fleets; allowed: transformer training and "
                           "serving problems", file=file, field=f"{field}.problem")
    names = [p.name for p in pools]
    unknown = [s for s in j.systems or [] if s not in names]
    if unknown:
        raise ProblemError(f"unknown fleet system {unknown[0]!r}; allowed: {', '.join(names)}", file=file,
                           field=f"{field}.systems")
    resolved = _problem_on(problem, source, pools[0], [pools[0].sizes[0]])
    serving = resolved.family in (FamilyName.SERVING, FamilyName.ONLINE)
    if resolved.family is FamilyName.ONLINE:
        raise ProblemError("online serving (task.arrival_rate with percentile targets) is not a fleet option yet; "
                           "allowed: the job's arrival_rate_rps (a capacity floor) with the task's mean ttft_s/tpot_s",
                           file=source, field="task.arrival_rate")
    _check_kind(j, serving, file, field)
    tokens = samples = None
    if resolved.family is FamilyName.TRAINING:
        tokens = j.train_tokens if j.train_tokens is not None else resolved.training_task.train_tokens
        samples = j.train_samples
        if tokens is not None and samples is not None:
            if j.train_tokens is None:
                tokens = None  # the job's sample budget replaces the problem's token budget
            else:
                raise ProblemError("give train_tokens or train_samples, not both; allowed: one budget", file=file,
                                   field=f"{field}.train_samples")
        if j.deadline_h is not None and tokens is None and samples is None:
            raise ProblemError("a deadline needs a budget; allowed: train_tokens or train_samples on the job (or "
                               "task.train_tokens in its problem)", file=file, field=f"{field}.deadline_h")
    floor = j.min_throughput
    if serving and j.arrival_rate_rps is not None:
        shapes = resolved.serving_task.requests()
        mean_output = sum(r.output_len * r.weight for r in shapes) / sum(r.weight for r in shapes)
        # sustained load: output tokens/s = requests/s x mean output tokens per request (no queueing model)
        floor = max(floor or 0.0, j.arrival_rate_rps * mean_output)
    needs_hours = FLEET_OBJECTIVES[spec.objective].needs_hours or spec.budget.usd is not None
    if needs_hours and tokens is None and samples is None and (j.duration_h or spec.horizon_h) is None:
        what = "duration_h (or the fleet's horizon_h)" if serving else "train_tokens, train_samples or horizon_h"
        raise ProblemError(f"objective {spec.objective} (or budget.usd) needs how long the job runs; allowed: "
                           f"{what}", file=file, field=f"{field}.duration_h" if serving else field)
    return Job(name, j, problem, source, serving, tokens, samples, floor, resolved.model.name, resolved.task.kind)


def _problem_on(problem: dict[str, Any], source: str, pool: Pool, sizes: list[int]) -> Problem:
    # a problem depends on its source only through the directory relative files are read from (and the name in
    # its errors): jobs repeating a problem share one resolution (an error is raised by the first, named after it)
    memo = (json.dumps(problem, sort_keys=True, default=str),
            source if source == "<inline>" else str(Path(source).parent), pool.system.model_dump_json(), tuple(sizes))
    known = _RESOLVED.get(memo)
    if known is not None:
        return known if known.source == source else replace(known, source=source)
    data = dict(problem, hardware={"system": pool.system.model_dump(), "gpus": sizes}, objective="throughput")
    if len(_RESOLVED) > MAX_RESOLVED:
        _RESOLVED.clear()
    _RESOLVED[memo] = resolved = problem_from_dict(data, source=source)
    return resolved


_RESOLVED: dict[tuple[str, str, str, tuple[int, ...]], Problem] = {}
MAX_RESOLVED = 10_000


def _check_kind(j: FleetJob, serving: bool, file: str, field: str) -> None:
    training_only = ("deadline_h", "train_tokens", "train_samples")
    serving_only = ("arrival_rate_rps", "duration_h")
    for key in serving_only if not serving else training_only:
        if getattr(j, key) is not None:
            kind = "training" if not serving else "serving"
            allowed = serving_only if serving else training_only
            raise ProblemError(f"not a {kind} field; allowed for a {kind} job: {', '.join(allowed)}",
                               file=file, field=f"{field}.{key}")


def fleet_schema() -> dict[str, Any]:
    return FleetFile.model_json_schema()
