"""Catalog defaults live in data: a GPU's standard node comes from data/gpus.yaml, and a GPU without one is a
one-line error naming the systems that hold it (issue 12: a GPU added to gpus.yaml alone crashed with KeyError)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog

DATA = Path(__file__).resolve().parents[1] / "src" / "madmax_opt" / "data"


def test_standard_node_of_every_gpu_is_read_from_the_data_file() -> None:
    raw = yaml.safe_load((DATA / "gpus.yaml").read_text())  # read independently of the catalog loader
    for name, fields in raw.items():
        if fields.get("standard_system") is not None:
            system = catalog.standard_system(name, file=None, field="hardware.gpu")
            assert system.name == fields["standard_system"]
            assert system.gpu == name


def test_a_gpu_without_a_standard_node_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = dict(catalog.gpus())
    gpus["new-gpu"] = gpus["h100-sxm"].model_copy(update={"name": "new-gpu", "standard_system": None})
    monkeypatch.setattr(catalog, "gpus", lambda: gpus)
    with pytest.raises(ProblemError, match="'new-gpu' has no standard node") as exc:
        catalog.standard_system("new-gpu", file="p.yaml", field="hardware.gpu")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("p.yaml: hardware.gpu:")
