"""Training frameworks as a StrEnum (model/spec.TrainingFramework): the problem-file Literal names exactly its
members, a member equals its plain string (so comparisons give what the strings gave), a misspelling fails."""

from __future__ import annotations

from typing import get_args

import pytest

from madmax_opt.model.spec import FRAMEWORKS, Framework, Stack, TrainingFramework


def test_literal_and_enum_name_the_same_frameworks() -> None:
    assert set(get_args(Framework)) == {f.value for f in TrainingFramework} == set(FRAMEWORKS)


def test_members_compare_equal_to_the_validated_field() -> None:
    for name in get_args(Framework):
        stack = Stack(framework=name)
        assert [f for f in TrainingFramework if stack.framework == f] == [TrainingFramework(name)]


def test_misspelled_framework_fails_loudly() -> None:
    with pytest.raises(AttributeError):
        _ = TrainingFramework.TORCHTITAM  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        TrainingFramework("torch-titan")
