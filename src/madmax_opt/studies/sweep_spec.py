"""Sweep files: the spec (models, tasks, hardware with globs, sizes, objectives, constraints), its validation
before any work, and the expansion into one keyed single-option problem per combination."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.limits import MAX_TOP_K
from madmax_opt.io.problem import check_space, problem_from_dict, resolve_model
from madmax_opt.io.problem_file import GpuRange, HFConfig, ModelRef, cluster_sizes
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.spec import Objective, Space, Stack, Strict, System, Task, TransformerModel

MAX_SWEEP_PROBLEMS = 100_000  # combinations one sweep file may expand to (the 500-problem benchmark: ~3 min)
KEY_VERSION = 1  # bump when the meaning of a combination changes; old rows then no longer match
RESULTS_FILE = "results.jsonl"
TABLE_FILE = "results.csv"
MANIFEST_FILE = "sweep.json"


# ------------------------------------------------------------------------------------------ sweep file


class SweepHardware(Strict):
    """Catalog system name or glob (``cloud-*``, ``all``), an inline system, or a GPU name."""

    system: str | System | None = Field(
        None, description="catalog name, glob pattern ('all' = every system), or inline"
    )
    gpu: str | None = Field(None, description="GPU name: its standard system (e.g. h100-sxm -> dgx-h100)")
    gpus: PositiveInt | Annotated[list[PositiveInt], Field(min_length=1)] | GpuRange = Field(
        description="cluster size(s) in GPUs: one, a list, or {start, stop, step}"
    )

    @model_validator(mode="after")
    def _one_of(self) -> SweepHardware:
        if (self.system is None) == (self.gpu is None):
            raise ValueError("give exactly one of 'system' or 'gpu'")
        return self

    def sizes(self) -> list[int]:
        return cluster_sizes(self.gpus)


class SweepConstraints(Strict):
    """Shared constraints; ``deadline_hours`` and ``budget_usd`` need ``task.train_tokens``."""

    max_gpus: PositiveInt | None = None
    max_cost_per_hour: PositiveFloat | None = Field(None, description="US$ per hour for the whole job")
    min_throughput: PositiveFloat | None = Field(None, description="tokens/s")
    deadline_hours: PositiveFloat | None = Field(
        None, description="train task.train_tokens within this many hours"
    )
    budget_usd: PositiveFloat | None = Field(
        None, description="train task.train_tokens for at most this many US$"
    )


class SolverSettings(Strict):
    top_k: PositiveInt = Field(1, le=MAX_TOP_K, description="plans kept per problem")
    time_limit_s: PositiveFloat = Field(60.0, description="CP-SAT time limit per problem")


class SweepFile(Strict):
    """The YAML sweep file (``madmax-opt sweep``)."""

    title: str = Field("", description="heading of the report (default: the sweep file's path)")
    description: str = Field("", description="free text copied to the top of the report")
    models: list[ModelRef] = Field(
        min_length=1, description="catalog names, {hf_config: path} or inline models"
    )
    task: Task | list[Task] = Field(
        description="one task or a list of tasks (each is crossed with every model)"
    )
    hardware: list[SweepHardware] = Field(min_length=1)
    objectives: list[Objective] = Field(["throughput"], min_length=1)
    space: Space = Space()
    stack: Stack = Stack()
    constraints: SweepConstraints = SweepConstraints()
    baseline: bool = Field(
        True, description="evaluate the MAD-Max baseline (FSDP over all GPUs) of every problem"
    )
    solver: SolverSettings = SolverSettings()
    calibration: str | None = Field(
        None, description="overlay file written by `madmax-opt calibrate` (relative to this file), for every problem"
    )

    @model_validator(mode="after")
    def _tasks_not_empty(self) -> SweepFile:
        if isinstance(self.task, list) and not self.task:
            raise ValueError("task: the list of tasks is empty")
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives: listed twice: {self.objectives}")
        return self

    def tasks(self) -> list[Task]:
        return self.task if isinstance(self.task, list) else [self.task]


# ------------------------------------------------------------------------------------------ combinations


@dataclass(frozen=True)
class Combination:
    """One problem of the sweep: the problem-file mapping, what it stands for, and its stable key."""

    key: str
    label: dict[str, Any]  # model, task, system, gpu, gpus, objective (+ node, price, power, train_tokens)
    problem: dict[str, Any]  # a problem-file mapping for ``problem_from_dict``


@dataclass(frozen=True)
class Sweep:
    path: str
    spec: SweepFile
    combinations: tuple[Combination, ...]
    validate_s: float = 0.0  # reading, expanding and checking every combination


def combination_key(problem: dict[str, Any], solver: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of problem mapping + solver settings: stable across runs and machines."""
    blob = json.dumps(
        {"v": KEY_VERSION, "problem": problem, "solver": solver}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def madmax_baseline(system: str, gpus: int) -> dict[str, Any]:
    """MAD-Max style baseline: FSDP (ZeRO-3) data parallel over all GPUs, no TP/PP, mbs 1, full recompute."""
    return {"dp": gpus, "tp": 1, "pp": 1, "cp": 1, "zero": 3, "mbs": 1, "recompute": "full", "system": system}


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate the whole sweep (every combination resolved and checked) before any work starts."""
    t0 = time.perf_counter()
    file = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        keys = ", ".join(SweepFile.model_fields)
        raise ProblemError(f"expected a mapping with keys {{{keys}}}", file=file)
    spec: SweepFile = validate(SweepFile, data, file=file)
    check_space(spec.space, file=file)
    if spec.calibration is not None:  # every problem names the overlay by its absolute path
        spec = spec.model_copy(update={"calibration": str((Path(file).parent / spec.calibration).resolve())})
    combinations = tuple(expand(spec, file))
    return Sweep(path=file, spec=spec, combinations=combinations, validate_s=time.perf_counter() - t0)


def _model_entry(ref: str | HFConfig | TransformerModel) -> str | dict[str, Any]:
    if isinstance(ref, str):
        return ref
    return ref.model_dump(mode="json", exclude_defaults=True)


def _systems(entry: SweepHardware, *, file: str, field: str) -> list[System]:
    if isinstance(entry.system, System):
        return [entry.system]
    if entry.gpu is not None:
        return [catalog.standard_system(entry.gpu, file=file, field=f"{field}.gpu")]
    assert entry.system is not None
    pattern = "*" if entry.system == "all" else entry.system
    names = [n for n in catalog.systems() if fnmatch.fnmatchcase(n, pattern)]
    if not names:
        allowed = ", ".join(["all", *catalog.systems()])
        raise ProblemError(
            f"unknown system {entry.system!r}; allowed: {allowed} or a glob such as 'cloud-*'",
            file=file,
            field=f"{field}.system",
        )
    return [catalog.systems()[n] for n in names]


def expand(spec: SweepFile, file: str) -> Iterator[Combination]:
    """Cross models x tasks x hardware (system, size) x objectives; check each combination."""
    from madmax_opt.search.space import knob_values

    tasks = spec.tasks()
    solver = spec.solver.model_dump(mode="json")
    models = [_resolved(m, file, f"models[{i}]") for i, m in enumerate(spec.models)]
    names = [m.name for m in models]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ProblemError(
                f"model name {name!r} is used twice (also models[{names.index(name)}]); "
                "allowed: distinct models (give inline models distinct names)",
                file=file,
                field=f"models[{i}]",
            )
    for t, task in enumerate(tasks):
        if "time_to_train" in spec.objectives and task.train_tokens is None:
            where = f"task[{t}].train_tokens" if isinstance(spec.task, list) else "task.train_tokens"
            raise ProblemError(
                "missing; objective time_to_train needs the token budget", file=file, field=where
            )
        for cons in ("deadline_hours", "budget_usd"):
            if getattr(spec.constraints, cons) is not None and task.train_tokens is None:
                where = f"task[{t}].train_tokens" if isinstance(spec.task, list) else "task.train_tokens"
                raise ProblemError(
                    f"needs {where} (the token budget)", file=file, field=f"constraints.{cons}"
                )
    points = _hardware_points(spec, file)
    _check_count(len(models) * len(tasks) * len(points) * len(spec.objectives), file)
    for mi, (mref, model) in enumerate(zip(spec.models, models, strict=True)):
        for t, task in enumerate(tasks):
            for hfield, system, system_ref, n in points:
                for objective in spec.objectives:
                    c = _combination(spec, mref, model, t, task, system, system_ref, n, objective, solver)
                    problem = _checked_problem(c, file, f"{hfield} x models[{mi}]")
                    for option in problem.hardware:
                        knob_values(problem, option)  # space errors name the file and space.<knob>
                    yield c


HardwarePoint = tuple[str, System, "str | dict[str, Any]", int]  # field, system, its reference, GPUs


def _hardware_points(spec: SweepFile, file: str) -> list[HardwarePoint]:
    """Every (system, cluster size) of the hardware entries, each once, whole nodes only."""
    points: list[HardwarePoint] = []
    seen: dict[tuple[str, int], str] = {}
    for h, entry in enumerate(spec.hardware):
        hfield = f"hardware[{h}]"
        for system in _systems(entry, file=file, field=hfield):
            ref = system.model_dump(mode="json") if isinstance(entry.system, System) else system.name
            for n in entry.sizes():
                per_node = system.gpus_per_node
                if n % per_node and per_node % n:
                    raise ProblemError(
                        f"{n} GPUs is not a whole number of {system.name} nodes ({per_node} GPUs each); "
                        f"allowed: multiples or divisors of {per_node}",
                        file=file,
                        field=f"{hfield}.gpus",
                    )
                if (system.name, n) in seen:
                    raise ProblemError(
                        f"{system.name} at {n} GPUs is listed twice (also in {seen[(system.name, n)]}); "
                        "allowed: each system and size once",
                        file=file,
                        field=hfield,
                    )
                seen[(system.name, n)] = hfield
                points.append((hfield, system, ref, n))
                _check_count(len(points), file)
    return points


def _check_count(problems: int, file: str) -> None:
    if problems > MAX_SWEEP_PROBLEMS:
        raise ProblemError(f"{problems:,} problems or more (models x tasks x systems x sizes x objectives); "
                           f"allowed: at most {MAX_SWEEP_PROBLEMS:,} per sweep file (split it)", file=file)


def _combination(
    spec: SweepFile,
    mref: str | HFConfig | TransformerModel,
    model: TransformerModel,
    t: int,
    task: Task,
    system: System,
    system_ref: str | dict[str, Any],
    n: int,
    objective: str,
    solver: dict[str, Any],
) -> Combination:
    # as written: the problem enforces deadline_hours and budget_usd, and its infeasible reason names them
    constraints = spec.constraints.model_dump(mode="json", exclude_none=True)
    problem: dict[str, Any] = {
        "model": _model_entry(mref),
        "hardware": {"system": system_ref, "gpus": n},
        "task": task.model_dump(mode="json", exclude_defaults=True),
        "space": spec.space.model_dump(mode="json", exclude_defaults=True),
        "stack": spec.stack.model_dump(mode="json", exclude_defaults=True),
        "objective": objective,
        "constraints": constraints,
    }
    if spec.baseline:
        problem["baseline"] = madmax_baseline(system.name, n)
    if spec.calibration is not None:
        problem["calibration"] = spec.calibration
    label = {
        "model": model.name,
        "task": t,
        "system": system.name,
        "gpu": system.gpu,
        "gpus": n,
        "objective": objective,
        "gpus_per_node": system.gpus_per_node,
        "price_per_gpu_hour": system.price_per_gpu_hour,
        "power_w_per_gpu": system.power_w_per_gpu,
        "train_tokens": task.train_tokens,
        "seq_len": task.seq_len,
        "global_batch": task.global_batch,
    }
    return Combination(key=combination_key(problem, solver), label=label, problem=problem)


def _bare(exc: ProblemError) -> str:
    """The message of a ProblemError without its 'file: field: ' prefix."""
    where = ": ".join(part for part in (exc.file, exc.field) if part)
    return str(exc).removeprefix(f"{where}: ") if where else str(exc)


def _resolved(ref: str | HFConfig | TransformerModel, file: str, field: str) -> TransformerModel:
    from madmax_opt.io.dlrm_problem import dlrm_models

    if isinstance(ref, str) and ref in dlrm_models():
        raise ProblemError(f"{ref!r} is a recommender; sweep files cover transformer training problems (solve "
                           "each DLRM problem file instead); allowed: a transformer catalog name or an inline "
                           "model", file=file, field=field)
    try:
        return resolve_model(ref, file=file)
    except ProblemError as exc:
        raise ProblemError(_bare(exc), file=file, field=field) from None


def _checked_problem(c: Combination, file: str, where: str) -> Any:
    try:
        return problem_from_dict(c.problem, source=file)
    except ProblemError as exc:
        what = f"{c.label['model']} on {c.label['gpus']} x {c.label['system']} ({c.label['objective']})"
        inner = f"{exc.field}: {_bare(exc)}" if exc.field else _bare(exc)
        raise ProblemError(f"invalid combination {what}: {inner}", file=file, field=where) from None
