"""The recorded flag sets: for each format, the flags and config keys it may emit, read from the framework's source.

Data: ``madmax_opt/data/flags/<format>.yaml`` (format, kind, module, listed: its registration; framework, version, repository, commit, files, flags, config_keys,
choices, launcher). Tests check every emitted flag and key against these sets.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

import yaml
from pydantic import Field

from madmax_opt.launch.registry import check_format, flag_files
from madmax_opt.model.spec import Strict


class Launcher(Strict):
    program: str
    version: str
    repository: str
    commit: str
    files: list[str]
    flags: list[str]


class FlagSet(Strict):
    """What one format may emit, and where that list was read."""

    format: str
    kind: Literal["training", "serving"]
    module: str = Field(description="the module that defines the format (launch/registry.py)")
    listed: int = Field(description="its place in format listings")
    framework: str
    version: str
    repository: str
    commit: str
    files: list[str] = Field(min_length=1)
    program: str
    flags: list[str] = Field(default_factory=list, description="command-line flags of the framework's program")
    config_keys: list[str] = Field(default_factory=list, description="dotted keys of its config file / overrides")
    model_args: list[str] = Field(default_factory=list, description="architecture fields of a companion file")
    choices: dict[str, list[str | int]] = Field(default_factory=dict, description="allowed values of some flags")
    launcher: Launcher | None = None

    @property
    def launcher_flags(self) -> set[str]:
        return set(self.launcher.flags) if self.launcher else set()


@cache
def flagset(fmt: str) -> FlagSet:
    """The recorded flag set of ``fmt`` (package data)."""
    check_format(fmt)
    text = flag_files()[f"{fmt}.yaml"]
    return FlagSet.model_validate(yaml.safe_load(text))
