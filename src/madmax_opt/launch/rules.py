"""The frameworks' start-up rules as data: one record shape, one reader and one citation for every format.

Data: ``madmax_opt/data/flags/startup-training.yaml`` and ``startup-serving.yaml`` (per format: the framework, the
commit or wheel its files were read at, and each rule with its file and line there). The checkers live beside the
formats (launch/startup.py for training, launch/serving_rules.py for serving); emit refuses a plan that would break
a ``refuse`` rule with :func:`rule_refusal`, which names the rule.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import Field, model_validator

from madmax_opt.core.errors import ProblemError
from madmax_opt.launch.common import Kind, refuse
from madmax_opt.model.spec import Strict


class Rule(Strict):
    id: str
    file: str
    line: int = Field(gt=0)
    commit: str | None = Field(None, description="where the file was read at another commit than the pin")
    requires: str
    emit: Literal["satisfy", "refuse", "note"] = Field(description="satisfy: emit meets it; refuse: emit refuses "
                                                       "a plan that would break it; note: the framework accepts it "
                                                       "(a warning), emit says so in a note naming the rule")


class FrameworkRules(Strict):
    framework: str
    repository: str
    commit: str | None = Field(None, min_length=40, max_length=40, description="the pinned commit")
    pinned: str | None = Field(None, description="the wheel (with its sha256) the files were read in")
    rules: list[Rule]

    @model_validator(mode="after")
    def _pinned_once(self) -> FrameworkRules:
        if (self.commit is None) == (self.pinned is None):
            raise ValueError("give the pin as either commit or pinned")
        return self


@cache
def rule_book(kind: Kind) -> dict[str, FrameworkRules]:
    """Format -> its framework's start-up rules, for the training or the serving formats (package data)."""
    text = resources.files("madmax_opt").joinpath(f"data/flags/startup-{kind}.yaml").read_text(encoding="utf-8")
    return {fmt: FrameworkRules.model_validate(v) for fmt, v in yaml.safe_load(text).items()}


def find_rule(rule_id: str) -> tuple[FrameworkRules, Rule]:
    """The framework and rule of an id (``<format>.<name>``), in whichever book holds its format."""
    fmt = rule_id.split(".", 1)[0]
    fw = next(book[fmt] for book in (rule_book("training"), rule_book("serving")) if fmt in book)
    return fw, next(r for r in fw.rules if r.id == rule_id)


def cite(rule_id: str) -> str:
    """``requires`` with where it is: framework, file and line at the pin, rule id."""
    fw, r = find_rule(rule_id)
    return f"{fw.framework} requires: {r.requires} ({r.file} line {r.line}; rule {r.id})"


def rule_refusal(fmt: str, setting: str, rule_id: str, field: str | None = None) -> ProblemError:
    """The one-line refusal of a plan that would break the framework's start-up rule ``rule_id``."""
    return refuse(fmt, setting, cite(rule_id), field=field)
