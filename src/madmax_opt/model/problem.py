"""The resolved problems every layer above io reads: catalog names replaced by their entries, every hardware option
listed. io/problem.py and io/dlrm_problem.py build them from problem files; search, analysis and launch take them
and read no files."""

from __future__ import annotations

from dataclasses import dataclass, replace

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.dlrm_spec import (
    DLRMConstraints,
    DLRMModel,
    DLRMObjective,
    DLRMPlan,
    DLRMSpace,
    DLRMStack,
    DLRMTask,
)
from madmax_opt.model.family_name import FamilyName, serving_task, task_family, training_task
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.serving_calibration import ServingData
from madmax_opt.model.spec import (
    Constraints,
    InferenceTask,
    Objective,
    Plan,
    Space,
    Stack,
    Task,
    TransformerModel,
)


@dataclass(frozen=True)
class Problem:
    """A resolved problem: catalog names replaced by their entries; ``hardware`` lists every option."""

    model: TransformerModel
    task: Task | InferenceTask
    stack: Stack
    hardware: tuple[HardwareOption, ...]
    space: Space
    objective: Objective
    constraints: Constraints
    baseline: Plan | None
    source: str = "<inline>"
    serving: ServingData | None = None  # an inference problem's serving calibration and GPU catalogs (io resolves)
    robust: bool = False  # objective: {robust: true}: the best worst case is the best plan (search/robust.py)

    @property
    def family(self) -> FamilyName:
        """The problem's workload family (model/family_name.py): training, serving or online."""
        return task_family(self.task)

    @property
    def training_task(self) -> Task:
        """The task of a training problem (inference problems go to ``madmax_opt.search.serving``)."""
        task = training_task(self.task)
        if task is None:
            raise ProblemError("this command needs a training task (kind pretrain or finetune)", file=self.source,
                               field="task.kind")
        return task

    @property
    def serving_task(self) -> InferenceTask:
        """The task of a serving problem (steady or online); a training problem is refused in one line."""
        task = serving_task(self.task)
        if task is None:
            raise ProblemError("this command needs an inference task (kind inference)", file=self.source,
                               field="task.kind")
        return task

    def on_system(self, system: str) -> Problem:
        """The problem restricted to one system's hardware options (e.g. to explain why it has no admissible plan)."""
        return replace(self, hardware=tuple(o for o in self.hardware if o.system.name == system))

    def hw_index(self, plan: Plan) -> int:
        """The hardware option a plan runs on: by ``system`` name and GPU count, else the only one."""
        for i, o in enumerate(self.hardware):
            if (plan.system in (None, o.system.name, o.name)) and o.gpus == plan.gpus:
                return i
        if len(self.hardware) == 1 and plan.system in (None, self.hardware[0].system.name):
            return 0  # the evaluator reports the GPU-count mismatch as an invalid plan
        names = ", ".join(o.name for o in self.hardware)
        raise ProblemError(
            f"plan uses {plan.gpus} GPUs of {plan.system or 'any system'}; hardware options are: {names}",
            file=self.source,
            field="plan",
        )


@dataclass(frozen=True)
class DLRMProblem:
    """A resolved recommender (DLRM) problem: the transformer problem's shape with DLRM model, task and plans."""

    model: DLRMModel
    task: DLRMTask
    space: DLRMSpace
    stack: DLRMStack
    hardware: tuple[HardwareOption, ...]
    objective: DLRMObjective
    constraints: DLRMConstraints
    baseline: DLRMPlan | None
    source: str = "<inline>"

    @property
    def family(self) -> FamilyName:
        """Always the recommender family."""
        return FamilyName.RECOMMENDER

    def hw_index(self, plan: DLRMPlan) -> int:
        for i, o in enumerate(self.hardware):
            if plan.system in (None, o.system.name, o.name) and plan.gpus in (None, o.gpus):
                return i
        names = ", ".join(o.name for o in self.hardware)
        raise ProblemError(f"plan names {plan.system or 'any system'} x {plan.gpus or 'any size'}; hardware "
                           f"options are: {names}", file=self.source, field="plan.system")
