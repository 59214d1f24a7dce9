"""Problem-file shapes (hardware entries and cluster sizes, Hugging Face config references, the file itself) and the
validated, catalog-resolved :class:`Problem` record that every layer above reads; loading is ``io.problem``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, PositiveInt, Tag, model_validator

from madmax_opt.io.derive import Derive
from madmax_opt.io.limits import (
    MAX_CLUSTER_SIZES,
)
from madmax_opt.model.family_name import task_model_tag
from madmax_opt.model.spec import (
    Constraints,
    InferenceTask,
    Objective,
    Plan,
    Space,
    Stack,
    Strict,
    System,
    Task,
    TransformerModel,
)


class GpuRange(Strict):
    start: PositiveInt
    stop: PositiveInt
    step: PositiveInt = 1

    @model_validator(mode="after")
    def _not_empty(self) -> GpuRange:
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) is below start ({self.start}); allowed: stop >= start")
        if self.count > MAX_CLUSTER_SIZES:
            raise ValueError(f"{self.count:,} cluster sizes from {self.start} to {self.stop} in steps of {self.step}; "
                             f"allowed: at most {MAX_CLUSTER_SIZES:,} (raise step)")
        return self

    @property
    def count(self) -> int:
        """Cluster sizes in the range: floor((stop - start) / step) + 1."""
        return (self.stop - self.start) // self.step + 1

    def values(self) -> list[int]:
        return list(range(self.start, self.stop + 1, self.step))


def _by_shape(v: Any) -> str:
    """Union discriminator: a string is a catalog name, a mapping with hf_config a file, else inline."""
    if isinstance(v, str):
        return "catalog-name"
    if isinstance(v, dict) and "hf_config" in v:
        return "hf-config"
    return "inline"


SystemRef = Annotated[
    Annotated[str, Tag("catalog-name")] | Annotated[System, Tag("inline")], Discriminator(_by_shape)
]


class HardwareEntry(Strict):
    """A system (catalog name or inline) or a GPU name (its standard node) at one or several cluster sizes."""

    system: SystemRef | None = None
    gpu: str | None = None
    gpus: PositiveInt | list[PositiveInt] | GpuRange = Field(description="cluster size(s) in GPUs")
    supply: PositiveInt | None = Field(None, description="GPUs of this type available (co-design)")
    derive: Derive | None = Field(None, description="what-if variant {from: system, scale: {...}, set: {...}}")

    @model_validator(mode="after")
    def _one_of(self) -> HardwareEntry:
        if self.derive is not None and (self.system is not None or self.gpu is not None):
            raise ValueError("give derive alone (its from names the system); allowed: one of system, gpu, derive")
        if self.derive is None and (self.system is None) == (self.gpu is None) and not isinstance(self.system, System):
            raise ValueError("give exactly one of system (a catalog or inline system) or gpu (a GPU name)")
        if isinstance(self.gpus, list) and not self.gpus:
            raise ValueError("gpus is an empty list; allowed: one or more cluster sizes (GPUs)")
        return self

    def sizes(self) -> list[int]:
        return cluster_sizes(self.gpus)


def cluster_sizes(gpus: int | list[int] | GpuRange) -> list[int]:
    """The cluster sizes a ``gpus`` field stands for: one, a list, or a range."""
    if isinstance(gpus, int):
        return [gpus]
    if isinstance(gpus, GpuRange):
        return gpus.values()
    return list(gpus)


class HFConfig(Strict):
    hf_config: str


ModelRef = Annotated[
    Annotated[str, Tag("catalog-name")]
    | Annotated[HFConfig, Tag("hf-config")]
    | Annotated[TransformerModel, Tag("inline")],
    Discriminator(_by_shape),
]


TaskRef = Annotated[
    Annotated[Task, Tag("training")] | Annotated[InferenceTask, Tag("inference")], Discriminator(task_model_tag)
]


class ObjectiveForm(Strict):
    """The mapping form of ``objective``: its name and how the best plan is chosen."""

    name: Objective = Field("throughput", description="the objective to optimise")
    robust: bool = Field(
        False, description="training: pick the plan with the best worst case within the 80 % error bars (among "
        "the top-k and each system's best), as `solve --robust` does (search/robust.py)"
    )


class ProblemFile(Strict):
    """The YAML problem file. ``madmax-opt schema`` prints its JSON Schema."""

    model: ModelRef = Field(description="catalog name, {hf_config: path}, or an inline model mapping")
    hardware: HardwareEntry | Annotated[list[HardwareEntry], Field(min_length=1)]
    task: TaskRef
    space: Space = Space()
    stack: Stack = Stack()
    objective: Objective | ObjectiveForm = Field(
        "throughput", description="an objective name, or {name: NAME, robust: true} to choose the best worst case"
    )
    constraints: Constraints = Constraints()
    baseline: Plan | None = Field(None, description="the plan run today, for speedup reporting")
    calibration: str | None = Field(
        None, description="overlay file written by `madmax-opt calibrate` (relative to this file): its fitted "
        "(GPU, framework) calibrations replace the catalog's"
    )

    @property
    def objective_name(self) -> Objective:
        """The objective's name, from either form."""
        return self.objective.name if isinstance(self.objective, ObjectiveForm) else self.objective

    @property
    def robust(self) -> bool:
        """Whether the best plan is the one with the best worst case (``objective: {robust: true}``)."""
        return isinstance(self.objective, ObjectiveForm) and self.objective.robust
