"""Problem files: YAML -> validated, catalog-resolved :class:`Problem` with one-line errors."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator, Field, PositiveInt, Tag, ValidationError, model_validator
from pydantic.fields import FieldInfo

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import calibration, catalog
from madmax_opt.io.derive import Derive, derive_hardware
from madmax_opt.io.limits import (
    MAX_CLUSTER_SIZES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    check_booleans,
    check_finite,
    check_input,
)
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.objectives import OBJECTIVES
from madmax_opt.model.spec import (
    GPU,
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


def _task_kind(v: Any) -> str:
    """Task union discriminator on ``kind``: inference, else a training task (whose kind has a default)."""
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return "inference" if kind == "inference" else "training"


TaskRef = Annotated[
    Annotated[Task, Tag("training")] | Annotated[InferenceTask, Tag("inference")], Discriminator(_task_kind)
]


class ProblemFile(Strict):
    """The YAML problem file. ``madmax-opt schema`` prints its JSON Schema."""

    model: ModelRef = Field(description="catalog name, {hf_config: path}, or an inline model mapping")
    hardware: HardwareEntry | Annotated[list[HardwareEntry], Field(min_length=1)]
    task: TaskRef
    space: Space = Space()
    stack: Stack = Stack()
    objective: Objective = "throughput"
    constraints: Constraints = Constraints()
    baseline: Plan | None = Field(None, description="the plan run today, for speedup reporting")
    calibration: str | None = Field(
        None, description="overlay file written by `madmax-opt calibrate` (relative to this file): its fitted "
        "(GPU, framework) calibrations replace the catalog's"
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

    @property
    def training_task(self) -> Task:
        """The task of a training problem (inference problems go to ``madmax_opt.search.serving``)."""
        if not isinstance(self.task, Task):
            raise ProblemError("this command needs a training task (kind pretrain or finetune)", file=self.source,
                               field="task.kind")
        return self.task

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


# ------------------------------------------------------------------------------------------- loading


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML (or JSON) file; a missing, unreadable or malformed file is a one-line ProblemError."""
    text = read_text(Path(path), what=what, file=str(path))
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ProblemError(f"malformed YAML at {where}: {problem}", file=str(path)) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:  # a constructor's error:
        # a timestamp such as 2024-13-45, an unhashable key, an integer of more than 4,300 digits
        raise ProblemError(f"malformed YAML: {type(exc).__name__}: {exc}", file=str(path)) from None


def read_text(path: Path, *, what: str, file: str, field: str | None = None) -> str:
    """A text file's contents; not found / a directory / unreadable / not UTF-8 become one-line errors."""
    named = what if str(path) == file else f"{what} {path}"
    if not path.exists():
        raise ProblemError(f"{what} not found (looked for {path.resolve()})", file=file, field=field)
    if path.is_dir():
        raise ProblemError(f"{named} is a directory; allowed: a file", file=file, field=field)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ProblemError(f"{named} has {path.stat().st_size:,} bytes; allowed: at most {MAX_FILE_BYTES:,}",
                               file=file, field=field)
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProblemError(f"{named} is not UTF-8 text (byte {exc.start})", file=file, field=field) from None
    except OSError as exc:
        raise ProblemError(f"cannot read {named}: {exc.strerror}", file=file, field=field) from None


_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster, nesting capped at 1000


class _UniqueKeyLoader(_SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML would silently keep the last) and
    nesting deeper than MAX_DEPTH (PyYAML's composer recurses once per level: 20,000 brackets overflow it; with
    libyaml, which stops at 1,000 levels, ``check_input`` applies MAX_DEPTH)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_overlay(path: Path, *, file: str) -> calibration.Overlay:
    """A `calibration:` overlay file (written by madmax-opt calibrate), validated; one-line errors."""
    calibration.check_overlay_file(path, file=file)
    data = read_yaml(path, what="calibration overlay")
    overlay: calibration.Overlay = validate(calibration.Overlay, data, file=str(path))
    return overlay


def load_problem(path: str | Path) -> Problem:
    """Read, validate and resolve a problem file (``madmax-opt schema`` prints its format)."""
    data = read_yaml(path, what="problem file")
    if data is None:
        keys = ", ".join(ProblemFile.model_fields)
        raise ProblemError(f"empty problem file; allowed: a mapping with keys {{{keys}}}", file=str(path))
    if not isinstance(data, dict):
        validate(ProblemFile, data, file=str(path))  # raises the one-line "wrong type; allowed: ..." error
    return problem_from_dict(data, source=str(path))


def hardware_options(
    hardware: HardwareEntry | list[HardwareEntry], *, file: str | None
) -> list[HardwareOption]:
    """Every (system, GPU, cluster size) a ``hardware`` section stands for, catalog names and derivations resolved."""
    entries = hardware if isinstance(hardware, list) else [hardware]
    options: list[HardwareOption] = []
    for i, e in enumerate(entries):
        field = f"hardware[{i}]" if isinstance(hardware, list) else "hardware"
        system = resolve_system(e, file=file, field=field)
        gpu: GPU = (
            derive_hardware(e.derive, file=file, field=f"{field}.derive")[1]
            if e.derive is not None
            else catalog.lookup("gpu", system.gpu, file=file, field=f"{field}.system.gpu")
        )
        options.extend(HardwareOption(system, gpu, n, e.supply) for n in e.sizes())
    return options


def problem_from_dict(data: dict[str, Any], source: str = "<inline>") -> Problem:
    pf = validate(ProblemFile, data, file=source)
    model = resolve_model(pf.model, file=source)
    options = hardware_options(pf.hardware, file=source)
    overlay = None if pf.calibration is None else load_overlay(
        (Path(source).parent if source != "<inline>" else Path(".")) / pf.calibration, file=source)
    if isinstance(pf.task, Task):  # the training (GPU, framework) fit prices the plan (serving: serving_calibration)
        options = calibration.apply(options, pf.stack.framework, overlay)
    if isinstance(pf.task, InferenceTask) and model.family != "llm":
        raise ProblemError(f"kind inference needs an llm, got a {model.family}", file=source, field="task.kind")
    if isinstance(pf.task, InferenceTask) and OBJECTIVES[pf.objective].needs_total_units:
        allowed = ", ".join(n for n, o in OBJECTIVES.items() if not o.needs_total_units)
        raise ProblemError(f"{pf.objective!r} needs a training run; allowed for inference: {allowed}", file=source,
                           field="objective")
    if isinstance(pf.task, Task) and model.family == "llm" and pf.task.seq_len is None:
        raise ProblemError("missing, required for an llm; allowed: tokens per sequence, an integer > 0",
                           file=source, field="task.seq_len")
    if isinstance(pf.task, Task) and pf.task.frozen_layers > model.layers:
        raise ProblemError(
            f"{pf.task.frozen_layers} exceeds the model's {model.layers} layers; allowed: 0 to {model.layers}",
            file=source,
            field="task.frozen_layers",
        )
    if isinstance(pf.task, Task):
        check_training_precision(pf.task.precision, options, file=source)
    check_space(pf.space, file=source)
    if pf.objective == "time_to_train" and isinstance(pf.task, Task) and pf.task.train_tokens is None:
        raise ProblemError("missing, objective time_to_train needs it; allowed: a token count > 0, e.g. 2.0e+12",
                           file=source, field="task.train_tokens")
    return Problem(
        model=model,
        task=pf.task,
        stack=pf.stack,
        hardware=tuple(options),
        space=pf.space,
        objective=pf.objective,
        constraints=pf.constraints,
        baseline=pf.baseline,
        source=source,
    )


# The tensor-core format a training precision needs: FP8 runs on FP8 tensor cores (Hopper, CDNA3, Blackwell); MXFP8's
# block scaling came with Blackwell's 5th-generation tensor cores, the ones that also run FP4 (NVIDIA Blackwell
# architecture technical brief, 2024), so a GPU with an fp4 peak in the catalog is one that runs MXFP8.
TRAINING_FORMAT: dict[str, str] = {"mxfp8": "fp4"}


def check_training_precision(precision: str, options: list[HardwareOption], *, file: str) -> None:
    """One-line error when a hardware option's GPU cannot run the training precision (fp8 on A100, mxfp8 on H100)."""
    need = TRAINING_FORMAT.get(precision, precision)
    lacking = list(dict.fromkeys(o.gpu.name for o in options if need not in o.gpu.peak_flops))
    if lacking:
        able = sorted(g.name for g in catalog.gpus().values() if need in g.peak_flops)
        raise ProblemError(f"{precision} needs {'MX block-scaled FP8' if precision == 'mxfp8' else need} tensor "
                           f"cores, which {', '.join(lacking)} lack; {precision} runs on {', '.join(able)}; "
                           "allowed on every GPU: bf16", file=file, field="task.precision")


EMPTY_KNOB = "empty list, nothing to search; allowed: one or more values (omit the key to search all)"


def check_space(space: BaseModel, *, file: str | None, field: str = "space") -> None:
    """Every integer knob of a (training, serving or DLRM) ``space`` names allowed values: >= 1 (ZeRO 0-3), a
    non-empty list; knob combinations that cannot mean anything are refused by name."""
    for name, given in space:
        if isinstance(given, bool) or not isinstance(given, int | list) or name == "column_splits":
            continue
        values = [given] if isinstance(given, int) else given
        if not values:
            raise ProblemError(EMPTY_KNOB, file=file, field=f"{field}.{name}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            continue  # a list of names (recompute, shardings): the schema checked them
        lowest, highest = (0, 3) if name == "zero" else (1, None)
        if any(v < lowest or (highest is not None and v > highest) for v in values):
            allowed = "ZeRO stages 0, 1, 2, 3" if name == "zero" else f"integers >= {lowest}"
            raise ProblemError(f"got {values}; allowed: {allowed}", file=file, field=f"{field}.{name}")
    if not isinstance(space, Space):
        return
    if space.mixed_stages and not space.uneven_stages:
        raise ProblemError("mixed_stages needs uneven_stages: true (stages of other GPU types are searched by the "
                           "uneven pipeline search); allowed: add uneven_stages: true, or drop mixed_stages",
                           file=file, field=f"{field}.mixed_stages")
    pp = [space.pp] if isinstance(space.pp, int) else space.pp
    vpp = [space.vpp] if isinstance(space.vpp, int) else space.vpp
    if pp and vpp and max(pp) == 1 and min(vpp) > 1:
        raise ProblemError(f"vpp={space.vpp} needs a pipeline, but pp is {space.pp} (interleaving splits each "
                           "pipeline stage into vpp chunks); allowed: vpp 1 at pp 1, or pp > 1",
                           file=file, field=f"{field}.vpp")


def resolve_model(spec: str | HFConfig | TransformerModel, *, file: str | None) -> TransformerModel:
    if isinstance(spec, TransformerModel):
        return spec
    if isinstance(spec, HFConfig):
        base = Path(file).parent if file and file != "<inline>" else Path(".")
        return model_from_hf_config(base / spec.hf_config, file=file)
    model: TransformerModel = catalog.lookup("model", spec, file=file, field="model")
    return model


def resolve_system(e: HardwareEntry, *, file: str | None, field: str) -> System:
    if e.derive is not None:
        return derive_hardware(e.derive, file=file, field=f"{field}.derive")[0]
    if isinstance(e.system, System):
        return e.system
    if e.system is not None:
        system: System = catalog.lookup("system", e.system, file=file, field=f"{field}.system")
        return system
    assert e.gpu is not None
    return catalog.standard_system(e.gpu, file=file, field=f"{field}.gpu")


_HF_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
}


def model_from_hf_config(path: Path, *, file: str | None) -> TransformerModel:
    """Hugging Face ``config.json`` (LLaMA/Mistral/GPT-2/GPT-NeoX style keys) -> TransformerModel."""
    field = "model.hf_config"
    text = read_text(path, what="hf_config file (relative to the problem file)", file=str(file), field=field)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ProblemError(f"malformed JSON {path}, {where}: {exc.msg}", file=file, field=field) from None
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer of more than 4,300 digits
        raise ProblemError(f"malformed JSON {path}: {type(exc).__name__}: {exc}", file=file, field=field) from None
    if not isinstance(cfg, dict):
        raise ProblemError(f"{path} is not a JSON object; allowed: a Hugging Face config.json", file=file,
                           field="model.hf_config")
    values: dict[str, Any] = {}
    for key, names in _HF_KEYS.items():
        for n in names:
            if cfg.get(n) is not None:
                values[key] = cfg[n]
                break
    for key in ("layers", "hidden", "heads", "vocab"):
        if key not in values:
            raise ProblemError(
                f"{path} lacks {' / '.join(_HF_KEYS[key])}", file=file, field="model.hf_config"
            )
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu")))
    gated = act in ("silu", "swish") or "llama" in str(cfg.get("model_type", "")) or "mistral" in str(
        cfg.get("model_type", "")
    )
    values.setdefault("ffn", 4 * values["hidden"])
    values["ffn_kind"] = "swiglu" if gated else "gelu"
    values["norm"] = "rmsnorm" if "rms_norm_eps" in cfg else "layernorm"
    values["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", not gated))
    values["bias"] = not gated
    values["name"] = str(cfg.get("_name_or_path") or cfg.get("model_type") or path.stem)
    values["source"] = f"Hugging Face config {path}"
    return validate(TransformerModel, values, file=file, prefix="model.hf_config")


# -------------------------------------------------------------------------------- one-line errors

Loc = tuple[str | int, ...]


def validate(cls: type[Any], data: Any, *, file: str | None, prefix: str = "") -> Any:
    """``cls.model_validate(data)``; failing, one ProblemError line: field, what is wrong, what is allowed."""
    check_input(data, file=file, prefix=prefix)  # sizes bounded, numbers finite, nesting and lists limited
    try:
        record = cls.model_validate(data)
    except ValidationError as exc:
        field, message = _one_line(cls, exc)
        raise ProblemError(message, file=file, field=_join_field(prefix, field) or None) from None
    check_booleans(data, boolean_fields(cls), file=file, prefix=prefix)  # `gpus: true` is not 1 GPU
    check_finite(record.model_dump(warnings=False), file=file, prefix=prefix)  # 'inf' given as a string
    return record


_BOOLEAN_FIELDS: dict[type[Any], frozenset[str]] = {}


def boolean_fields(cls: type[Any]) -> frozenset[str]:
    """Names of the fields of ``cls`` and the records inside it that take true/false (anywhere else a boolean is
    an error: pydantic would read ``gpus: true`` as 1 and ``ttft_s: true`` as 1.0)."""
    if cls in _BOOLEAN_FIELDS:
        return _BOOLEAN_FIELDS[cls]
    names: set[str] = set()
    seen: set[Any] = set()
    stack: list[Any] = [cls]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            todo = [info.annotation]
            while todo:
                a = _strip(todo.pop())
                if a is bool:
                    names.add(name)
                elif _is_model(a):
                    stack.append(a)
                else:
                    todo.extend(get_args(a))
    _BOOLEAN_FIELDS[cls] = frozenset(names)
    return _BOOLEAN_FIELDS[cls]


def _one_line(cls: type[BaseModel], exc: ValidationError) -> tuple[str, str]:
    """The most specific error of ``exc`` as (field, "what is wrong; allowed: ...")."""
    errors = [(_walk(cls, e["loc"], unknown_last=e["type"] == "extra_forbidden"), e) for e in exc.errors()]
    # every member of a union reports an error; the member that got deepest into the input is the one meant
    depth = max(len(w.path) for w, _ in errors)
    deepest = [(w, e) for w, e in errors if len(w.path) == depth]
    where, err = min(deepest, key=lambda we: _rank(we[1]))
    field = _field_name(where.path)
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _walk(cls, err["loc"][:-1]).cursor
        return field, f"unknown key; allowed: {', '.join(_allowed_keys(parent)) or 'no keys'}"
    if kind == "missing":
        siblings = [w for w, e in deepest if e["type"] == "missing" and w.path[:-1] == where.path[:-1]]
        names = [str(w.path[-1]) for w in siblings]
        if len(names) == 1:
            return field, f"required key missing; allowed: {_describe(where.annotation, where.metadata)}"
        return _field_name(where.path[:-1]), f"required keys missing: {', '.join(names)}"
    allowed = _describe(where.annotation, where.metadata)
    got = _shown(err.get("input"))
    if kind == "literal_error":
        return field, f"unknown value {err.get('input')!r}; allowed: {allowed}"
    if all(_is_type_error(e) for w, e in deepest if w.path == where.path):
        return field, f"wrong type ({got}); allowed: {allowed}"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Input ")
    if kind == "value_error":  # our own validators: the message says what is allowed
        return field, msg
    if kind == "too_short" and not err.get("input"):
        return field, f"empty list; allowed: {allowed}"
    return field, f"{msg} ({got}); allowed: {allowed}"


@dataclass(frozen=True)
class _Where:
    path: list[str | int]  # field names and list indices, union branch tags removed
    annotation: Any  # the annotation of the last field on the path (the whole union, for "allowed")
    metadata: tuple[Any, ...]  # that field's constraints (Field(ge=...) etc.)
    cursor: Any  # the union member the location went through last (for the keys of a mapping)


def _walk(cls: type[BaseModel], loc: Loc, *, unknown_last: bool = False) -> _Where:
    """Follow a pydantic error location through ``cls``, dropping the union branch tags pydantic inserts."""
    path: list[str | int] = []
    annotation: Any = cls
    metadata: tuple[Any, ...] = ()
    cursor: Any = cls
    for i, part in enumerate(loc):
        members = [_strip(m) for m in _members(cursor)]
        lists = [m for m in members if get_origin(m) is list]
        owners = [m for m in members if _is_model(m) and part in m.model_fields]
        dicts = [m for m in members if get_origin(m) is dict]
        branch = [m for m in _members(cursor) if isinstance(part, str) and _names_branch(m, part)]
        if isinstance(part, int) and lists:
            annotation = cursor = get_args(lists[0])[0]
            metadata = ()
        elif owners:
            info = owners[0].model_fields[str(part)]
            annotation = cursor = info.annotation
            metadata = tuple(info.metadata)
        elif branch:
            cursor = branch[0]
            continue
        elif dicts:
            annotation = cursor = get_args(dicts[0])[1]
            metadata = ()
        elif not (unknown_last and i == len(loc) - 1):
            continue  # a branch tag we cannot place: not part of the user's field path
        path.append(part)
    return _Where(path, annotation, metadata, cursor)


def _field_name(path: list[str | int]) -> str:
    """['hardware', 0, 'gpus'] -> 'hardware[0].gpus'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _join_field(prefix: str, field: str) -> str:
    if not prefix or not field:
        return prefix or field
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


def _rank(err: Any) -> int:
    """Which of several errors at one depth to report: an unknown key (often a misspelt required key) first,
    then a bound or value error, then a missing key, then a type error (the other members of a union)."""
    if err["type"] == "extra_forbidden":
        return 0
    if err["type"] == "missing":
        return 2
    return 3 if _is_type_error(err) else 1


def _is_type_error(err: Any) -> bool:
    kind = str(err["type"])
    return kind.endswith(("_type", "_parsing")) or kind in ("int_from_float", "union_tag_invalid")


def _shown(value: Any) -> str:
    """The offending input, short: 'got 3', "got 'eight'", 'got a mapping'."""
    if value is None:
        return "got null"
    if isinstance(value, dict):
        return "got a mapping"
    if isinstance(value, list | tuple):
        return "got a list"
    return f"got {value!r}"


def _strip(annotation: Any) -> Any:
    """Annotated[X, ...] -> X."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a (possibly Annotated) union, each still Annotated; ``[annotation]`` otherwise."""
    base = _strip(annotation)
    if _is_union(base):
        return [m for a in get_args(base) for m in _members(a)]
    return [annotation]


_PRIMITIVE_TAGS: dict[Any, tuple[str, ...]] = {
    int: ("int", "constrained-int"),
    float: ("float", "constrained-float"),
    str: ("str", "constrained-str"),
    bool: ("bool",),
}


def _names_branch(member: Any, tag: str) -> bool:
    """Whether ``tag`` (e.g. 'inline', 'list[constrained-int]', 'function-after[_one_of(), HardwareEntry]') is
    the branch pydantic took through union ``member``."""
    explicit = [m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)]
    if explicit:
        return tag in explicit
    base = _strip(member)
    if _is_model(base):
        return not tag.startswith("list[") and re.search(rf"\b{base.__name__}\b", tag) is not None
    if get_origin(base) is list:
        return tag.startswith("list[")
    if get_origin(base) is Literal:
        return tag.startswith("literal[")
    return tag in _PRIMITIVE_TAGS.get(base, ())


def _allowed_keys(annotation: Any) -> list[str]:
    """Keys of the mapping(s) at ``annotation``, sorted."""
    models = [m for m in (_strip(a) for a in _members(annotation)) if _is_model(m)]
    return sorted({k for m in models[:1] for k in m.model_fields})


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _bounds(metadata: tuple[Any, ...] | list[Any]) -> list[str]:
    """Numeric bounds of annotated_types/pydantic constraints: ['> 0', '<= 3']."""
    out: list[str] = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            out.extend(_bounds(m.metadata))
            continue
        for attr, sign in _BOUNDS:
            value = getattr(m, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}")
        if getattr(m, "min_length", None):
            out.append(f"with at least {m.min_length} item{'s' if m.min_length > 1 else ''}")
    return out


def _describe(annotation: Any, metadata: tuple[Any, ...] = (), *, plural: bool = False) -> str:
    """An annotation in words: 'an integer > 0 or a list of integers > 0 or a mapping with keys {...}'."""
    inner = list(metadata)
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        inner.extend(extra)
    if any(isinstance(m, Tag) and m.tag == "catalog-name" for m in inner):
        return "catalog names" if plural else "a catalog name"
    if _is_union(annotation):
        alternatives = [a for a in get_args(annotation) if a is not type(None)]
        words = [_describe(a, tuple(inner), plural=plural) for a in alternatives]
        return " or ".join(dict.fromkeys(words))
    bounds = " and ".join(_bounds(tuple(inner)))
    bounded = f" {bounds}" if bounds else ""
    if get_origin(annotation) is Literal:
        values = ", ".join(str(v) for v in get_args(annotation))
        return f"{'values from' if plural else 'one of'} {{{values}}}"
    if get_origin(annotation) is list:
        item = _describe(get_args(annotation)[0], plural=True)
        return f"{'lists' if plural else 'a list'} of {item}{bounded}"
    if get_origin(annotation) is dict or annotation is dict:
        return "mappings" if plural else "a mapping"
    if _is_model(annotation):
        keys = ", ".join(annotation.model_fields)
        return f"{'mappings' if plural else 'a mapping'} with keys {{{keys}}}"
    nouns = {
        bool: ("true or false", "booleans"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        str: ("a string", "strings"),
        type(None): ("null", "nulls"),
    }
    singular, many = nouns.get(annotation, (f"a {getattr(annotation, '__name__', annotation)}", "values"))
    return f"{many if plural else singular}{bounded}"


def load_plans(path: Path, problem: Problem | None = None) -> list[Plan]:
    """Plans from a YAML/JSON file (a mapping or a list); with ``problem``, each must fit its hardware."""
    data = read_yaml(path, what="plan file")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        keys = ", ".join(Plan.model_fields)
        allowed = f"a mapping with keys {{{keys}}} or a non-empty list of them"
        raise ProblemError(f"expected a plan; allowed: {allowed}", file=str(path))
    plans = []
    for i, item in enumerate(items):
        prefix = f"[{i}]" if isinstance(data, list) else ""
        plan = validate(Plan, item, file=str(path), prefix=prefix)
        # a plan for other hardware is an input error, not an invalid plan (heterogeneous stages span several)
        if problem is not None and getattr(plan, "stage_systems", None) is None:
            systems = {o.system.name for o in problem.hardware}
            if plan.system is not None and plan.system not in systems | {o.name for o in problem.hardware}:
                raise ProblemError(
                    f"{plan.system!r} is not a hardware option of {problem.source}; allowed: "
                    f"{', '.join(sorted(systems))}",
                    file=str(path),
                    field=f"{prefix}.system".lstrip("."),
                )
            sizes = sorted({o.gpus for o in problem.hardware if plan.system in (None, o.system.name, o.name)})
            if plan.gpus not in sizes:
                raise ProblemError(
                    f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.gpus} GPUs matches no cluster size of "
                    f"{problem.source}; allowed: {', '.join(map(str, sizes))}",
                    file=str(path),
                    field=f"{prefix}.dp*tp*pp*cp".lstrip("."),
                )
        plans.append(plan)
    return plans
