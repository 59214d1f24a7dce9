"""The workload families and the one classification of a task: training, serving (steady state), online serving
(Poisson arrivals at ``task.arrival_rate``) and recommenders (DLRM).

``Problem.family`` / ``DLRMProblem.family`` (model/problem.py) read it; ``io.file_family.file_family`` classifies a
problem file before it is resolved; ``task_model_tag`` picks the task model a problem file's task is parsed with;
``search/family.py`` holds what each family does. Nothing else asks a task which family it is.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from madmax_opt.model.spec import InferenceTask, Task


class FamilyName(StrEnum):
    """A workload family (the registry key of ``search/family.py``)."""

    TRAINING = "training"
    SERVING = "serving"
    ONLINE = "online"
    RECOMMENDER = "recommender"


def task_family(task: Task | InferenceTask) -> FamilyName:
    """A transformer task's family: inference with an arrival rate is online serving, without one steady-state
    serving, a pretrain or finetune task training."""
    if isinstance(task, InferenceTask):
        return FamilyName.ONLINE if task.arrival_rate is not None else FamilyName.SERVING
    return FamilyName.TRAINING


def training_task(task: Task | InferenceTask) -> Task | None:
    """The task as a training task (pretrain / finetune), None for an inference task."""
    return task if isinstance(task, Task) else None


def serving_task(task: Task | InferenceTask) -> InferenceTask | None:
    """The task as an inference task (steady or online serving), None for a training task."""
    return task if isinstance(task, InferenceTask) else None


def task_model_tag(task: Any) -> str:
    """Which task model a problem file's ``task`` (a mapping, or a task model) is parsed with, the discriminator of
    io/problem_file.TaskRef: ``inference`` for kind inference, else ``training`` (a training task's kind has a
    default)."""
    kind = task.get("kind") if isinstance(task, dict) else getattr(task, "kind", None)
    return "inference" if kind == "inference" else "training"
