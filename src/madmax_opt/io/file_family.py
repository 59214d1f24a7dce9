"""The family of a problem file before it is resolved: the one classifier of raw problem files (commands pick
their loader and presentation by it; ``Problem.family`` classifies resolved problems, model/family_name.py)."""

from __future__ import annotations

from typing import Any

from madmax_opt.io.dlrm_problem import is_dlrm_data
from madmax_opt.model.family_name import FamilyName


def file_family(data: Any) -> FamilyName:
    """The family of a problem file's mapping before it is resolved (the one classifier of raw problem files): a
    DLRM model is a recommender, ``task.kind: inference`` serving (online with ``task.arrival_rate``), anything else
    training (its loader names what is wrong)."""
    if is_dlrm_data(data):
        return FamilyName.RECOMMENDER
    task = data.get("task") if isinstance(data, dict) else None
    if not (isinstance(task, dict) and task.get("kind") == "inference"):
        return FamilyName.TRAINING
    return FamilyName.ONLINE if task.get("arrival_rate") is not None else FamilyName.SERVING
