"""The family of a problem file before it is resolved: the one classifier of raw problem files (commands pick
their loader and presentation by it; ``Problem.family`` classifies resolved problems, model/family_name.py).

It reads only the DLRM catalog's names (not its models, nor io/dlrm_problem.py and the DLRM specs): a training or
serving solve classifies its file without importing the recommender stack (issue 26)."""

from __future__ import annotations

from typing import Any

from madmax_opt.io.data_cache import package_entries
from madmax_opt.model.family_name import FamilyName


def dlrm_model_names() -> frozenset[str]:
    """The names of the DLRM catalog's models (``data/dlrm.yaml``'s top-level keys; io/dlrm_problem.dlrm_models
    builds the models)."""
    return frozenset(package_entries("dlrm.yaml"))


def is_dlrm_data(data: Any) -> bool:
    """Whether a parsed problem file describes a DLRM: a DLRM catalog name (or a name starting with ``dlrm``, so
    that a misspelt one gets the DLRM catalog's list of names) or an inline model with ``family: dlrm``."""
    if not isinstance(data, dict):
        return False
    m = data.get("model")
    if isinstance(m, str):
        return m.startswith("dlrm") or m in dlrm_model_names()
    return isinstance(m, dict) and m.get("family") == "dlrm"


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
