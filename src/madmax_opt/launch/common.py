"""Shared pieces of the launch formats: the emitted record, the plan's context, refusals, argv helpers.

A format turns one plan into the commands and configuration files a framework runs, and parses them back. Every
flag or key it writes is listed in ``madmax_opt/data/flags/<format>.yaml`` (read from the framework's own source).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.plan_settings import settings
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan, Strict, TransformerModel
from madmax_opt.search.serving_space import ServingPlan

Kind = Literal["training", "serving"]


class Command(Strict):
    """One command line: launcher tokens, the program, and the program's arguments (argv = all three)."""

    launcher: list[str] = Field(default_factory=list)
    program: list[str]
    args: list[str]
    role: str = Field("run", description="what this command runs (run, prefill, decode, replica 3, ...)")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables the command needs")
    node: int = Field(0, ge=0, description="the node that runs it (0: the head node; the script runs a node's "
                      "commands where NODE_RANK says)")
    background: bool = Field(False, description="started in the background (a server); the script waits for it")
    ready: str | None = Field(None, description="URL that answers once the server is up (polled before the "
                              "next foreground command)")

    @property
    def argv(self) -> list[str]:
        return [*self.launcher, *self.program, *self.args]

    def shell(self) -> str:
        """The command line; ``$VAR`` tokens (a launcher's node rank, rendezvous host) stay unquoted for the shell."""
        words = [t if re.fullmatch(r"\$\{?\w+\}?(:\$?\{?\w+\}?)?", t) or _url_with_vars(t) else shlex.quote(t)
                 for t in self.argv]
        env = (f"{k}={v if _url_with_vars(v) else shlex.quote(v)}" for k, v in self.env.items())
        return " ".join([*env, *words])


class Emitted(Strict):
    """The runnable configuration of one plan for one framework."""

    format: str
    framework: str
    version: str
    kind: Kind
    system: str = Field(description="the hardware the commands are sized for")
    gpus: int
    nodes: int
    gpus_per_node: int
    commands: list[Command]
    files: dict[str, str] = Field(default_factory=dict, description="file name -> content, written beside the script")
    notes: list[str] = Field(default_factory=list)
    checkpoint_precision: str | None = Field(
        None, description="serving: the dtype the loaded checkpoint's weights ship in (its config's quantization), "
        "from the priced model's native_precision when the checkpoint is the model's own; None: not known here")
    checkpoint_context: int | None = Field(
        None, description="serving: the loaded checkpoint's max_position_embeddings (data/flags/model-positions.yaml) "
        "when the checkpoint is the model's own; None: not known here")

    def script(self) -> str:
        """A bash script: the notes as comments, then every command."""
        lines = ["#!/usr/bin/env bash", f"# {self.framework} {self.version}: {self.gpus} GPUs of {self.system} "
                 f"({self.nodes} node(s) x {self.gpus_per_node})"]
        lines += [f"# {n}" for n in self.notes]
        if any(c.node or c.background for c in self.commands):
            return "\n".join(lines + orchestrated(self.commands)) + "\n"
        for c in self.commands:
            lines += [f"# {c.role}", c.shell()]
        return "\n".join(lines) + "\n"


def _url_with_vars(token: str) -> bool:
    """A host:port or URL naming shell variables (``http://${NODE_IP_1}:30000``): left for the shell to expand."""
    return "${" in token and re.fullmatch(r"[\w:/.${}-]+", token) is not None


def orchestrated(commands: Sequence[Command]) -> list[str]:
    """Script lines for servers: each node runs its own commands (NODE_RANK, 0 on the head), servers start in
    the background, the head waits until every server's ``ready`` URL answers before its first foreground command
    (a router) or its end, and every node stays up while its servers run (stopping them when it exits)."""
    nodes = max(c.node for c in commands) + 1
    ready = [c.ready for c in commands if c.ready and c.background]
    wait = [f"until curl -sf {u} > /dev/null; do sleep 5; done  # wait for the server" for u in ready]
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    if nodes > 1:
        lines += [f"# run this script on each of the {nodes} nodes with NODE_RANK=0..{nodes - 1} and NODE_IP_0.."
                  f"NODE_IP_{nodes - 1} set to the nodes' addresses", 'NODE_RANK="${NODE_RANK:?set NODE_RANK}"']
    for node in range(nodes):
        body: list[str] = []
        mine = [c for c in commands if c.node == node]
        for c in mine:
            if node == 0 and not c.background and wait:
                body += [*wait, 'echo "servers ready"']
                wait = []
            body += [f"# {c.role}", c.shell() + (" &" if c.background else "")]
        if node == 0 and wait:
            body += [*wait, 'echo "servers ready"']
        if any(c.background for c in mine):
            body.append("wait")
        body = body or [":  # nothing to start here: the head node drives these GPUs (mpirun, Ray)"]
        lines += [f'if [ "$NODE_RANK" = {node} ]; then', *("  " + b for b in body), "fi"] if nodes > 1 else body
    return lines


@dataclass(frozen=True)
class Context:
    """A plan with what its launch needs from the problem: model, task, stack and its hardware option."""

    problem: Problem
    plan: Plan
    option: HardwareOption
    checkpoint: str | None = None  # serving: the weights to load (default: the model's hf_id)

    @property
    def model(self) -> TransformerModel:
        return self.problem.model

    @property
    def gpus_per_node(self) -> int:
        return self.option.system.gpus_per_node

    @property
    def checkpoint_precision(self) -> str | None:
        """The dtype the launched checkpoint ships in: the model's native_precision when the checkpoint is the
        model's own (its hf_id, the default); None for other weights (the user's to match)."""
        m = self.model
        return m.native_precision if m.hf_id is not None and self.checkpoint in (None, m.hf_id) else None


@dataclass(frozen=True)
class Format:
    """A launch format: how it emits and parses, and where every plan field goes.

    ``maps``: plan field -> the flags / keys that carry it. ``refuses``: plan field -> why a non-default value
    cannot be expressed (the emitter refuses it). Together they cover every field of the plan model.
    """

    name: str
    kind: Kind
    emit: Callable[[Context], Emitted]
    parse: Callable[[Emitted], Plan]
    maps: Mapping[str, tuple[str, ...]]
    refuses: Mapping[str, str] = field(default_factory=dict)
    config: Callable[[Emitted], dict[str, Any]] = lambda e: {}  # dotted config key -> value, from its files


def refuse(fmt: str, setting: str, why: str, field: str | None = None) -> ProblemError:
    """The one-line error for a plan setting a format cannot express (exit 2).

    ``field``: what is at fault, a plan field (``zero``) or a problem field (``task.precision``, ``model``); by
    default the plan field ``setting`` starts with (``zero=1 ...``), else ``plan``. The error names no file: the
    command that read the plan or problem adds it (``emit.locate_refusal``)."""
    name = re.match(r"(\w+)=", setting)
    where = field or (name.group(1) if name and name.group(1) in PLAN_FIELDS else "plan")
    return ProblemError(f"{fmt} cannot express {setting}: {why}", field=where)


# every plan setting, training and serving (model/plan_settings.py, the one registry of knobs)
PLAN_FIELDS = frozenset(s.name for model in (Plan, ServingPlan) for s in settings(model))


def is_problem_field(field: str | None) -> bool:
    """Whether a refusal's field is the problem's (``task...``, ``model...``, ``stack...``) rather than the plan's."""
    return field is not None and field.split(".", 1)[0] in ("task", "model", "stack")


def node_layout(fmt: str, gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a launch: one partial node, or whole nodes (launchers start equal ranks per node)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    if gpus % gpus_per_node:
        raise refuse(fmt, f"{gpus} GPUs", f"not a whole number of {gpus_per_node}-GPU nodes; allowed: "
                     f"at most {gpus_per_node} or a multiple of {gpus_per_node}")
    return gpus // gpus_per_node, gpus_per_node


def flag_args(pairs: Iterable[tuple[str, object]]) -> list[str]:
    """argv from (flag, value) pairs: value True -> bare flag, None / False -> omitted, else flag and str(value)."""
    out: list[str] = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def key_values(args: Sequence[str]) -> dict[str, str]:
    """The ``KEY=VALUE`` overrides among ``args`` (Megatron-Bridge's command line), key -> value as written."""
    return dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))


def parse_flags(args: Sequence[str]) -> dict[str, str | bool]:
    """The inverse of :func:`flag_args`: a flag followed by non-flag tokens takes them as its value (several:
    joined by spaces, as an argparse ``nargs`` list)."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-"):
            raise ValueError(f"unexpected argument {tok!r}")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            j = i + 1  # a list-valued flag (argparse nargs): its values joined by spaces
            while j + 1 < len(args) and not args[j + 1].startswith("-"):
                j += 1
            out[tok] = " ".join(args[i + 1:j + 1])
            i = j + 1
        else:
            out[tok] = True
            i += 1
    return out


def dotted_items(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested mapping by dotted key (``a.b.c``)."""
    items: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        items |= dotted_items(v, name + ".") if isinstance(v, Mapping) else {name: v}
    return items


def integer(flags: Mapping[str, str | bool], name: str, default: int = 1) -> int:
    v = flags.get(name)
    return default if v is None or isinstance(v, bool) else int(v)


def precision_of(plan: Plan, task_precision: str) -> str:
    """The plan's weight precision (serving plans carry one; otherwise the task's)."""
    return str(getattr(plan, "precision", None) or task_precision)


# -------------------------------------------------------------------------- Megatron pipeline layouts


def layout_string(stage_layers: Sequence[int]) -> str:
    """Megatron-Core pipeline layout: embedding E on the first stage, loss L on the last, t per layer, | between."""
    last = len(stage_layers) - 1
    return "|".join(("E" if i == 0 else "") + f"t*{n}" + ("L" if i == last else "") for i, n in enumerate(stage_layers))


def layout_layers(layout: str) -> list[int]:
    """Transformer layers per stage of a layout, unrolled with Megatron's own rules (pipeline_parallel_layer_layout)."""
    s = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), s)
    return [stage.count("t") for stage in s.split("|")]
