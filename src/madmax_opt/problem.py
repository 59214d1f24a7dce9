"""Problem files: YAML -> validated, catalog-resolved :class:`Problem` with one-line errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator, Field, PositiveInt, Tag, ValidationError, model_validator

from madmax_opt import catalog
from madmax_opt.errors import ProblemError
from madmax_opt.hardware import HardwareOption
from madmax_opt.spec import (
    GPU,
    Constraints,
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

    @model_validator(mode="after")
    def _one_of(self) -> HardwareEntry:
        if (self.system is None) == (self.gpu is None) and not isinstance(self.system, System):
            raise ValueError("give exactly one of 'system' or 'gpu'")
        if isinstance(self.gpus, list) and not self.gpus:
            raise ValueError("gpus: the list of cluster sizes is empty")
        return self

    def sizes(self) -> list[int]:
        if isinstance(self.gpus, int):
            return [self.gpus]
        if isinstance(self.gpus, GpuRange):
            return self.gpus.values()
        return list(self.gpus)


class HFConfig(Strict):
    hf_config: str


ModelRef = Annotated[
    Annotated[str, Tag("catalog-name")]
    | Annotated[HFConfig, Tag("hf-config")]
    | Annotated[TransformerModel, Tag("inline")],
    Discriminator(_by_shape),
]


class ProblemFile(Strict):
    """The YAML problem file. ``madmax-opt schema`` prints its JSON Schema."""

    model: ModelRef = Field(description="catalog name, {hf_config: path}, or an inline model mapping")
    hardware: HardwareEntry | list[HardwareEntry]
    task: Task
    space: Space = Space()
    stack: Stack = Stack()
    objective: Objective = "throughput"
    constraints: Constraints = Constraints()
    baseline: Plan | None = Field(None, description="the plan run today, for speedup reporting")


@dataclass(frozen=True)
class Problem:
    """A resolved problem: catalog names replaced by their entries; ``hardware`` lists every option."""

    model: TransformerModel
    task: Task
    stack: Stack
    hardware: tuple[HardwareOption, ...]
    space: Space
    objective: Objective
    constraints: Constraints
    baseline: Plan | None
    source: str = "<inline>"

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


def read_yaml(path: str | Path) -> Any:
    p = Path(path)
    if not p.exists():
        raise ProblemError("file not found", file=str(path))
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ProblemError(f"malformed YAML at {where}: {getattr(exc, 'problem', exc)}", file=str(path)) from None


def load_problem(path: str | Path) -> Problem:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ProblemError("expected a mapping with keys model, hardware, task, ...", file=str(path))
    return problem_from_dict(data, source=str(path))


def problem_from_dict(data: dict[str, Any], source: str = "<inline>") -> Problem:
    pf = validate(ProblemFile, data, file=source)
    model = resolve_model(pf.model, file=source)
    entries = pf.hardware if isinstance(pf.hardware, list) else [pf.hardware]
    options = []
    for i, e in enumerate(entries):
        field = f"hardware[{i}]" if isinstance(pf.hardware, list) else "hardware"
        system = resolve_system(e, file=source, field=field)
        gpu: GPU = catalog.lookup("gpu", system.gpu, file=source, field=f"{field}.system.gpu")
        options.extend(HardwareOption(system, gpu, n, e.supply) for n in e.sizes())
    if pf.task.kind in ("pretrain", "finetune") and model.family == "llm" and pf.task.seq_len is None:
        raise ProblemError("required for an llm (tokens per sequence)", file=source, field="task.seq_len")
    if pf.task.frozen_layers > model.layers:
        raise ProblemError(
            f"{pf.task.frozen_layers} exceeds the model's {model.layers} layers", file=source, field="task.frozen_layers"
        )
    if pf.objective == "time_to_train" and pf.task.train_tokens is None:
        raise ProblemError("objective time_to_train needs task.train_tokens", file=source, field="task.train_tokens")
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


def resolve_model(spec: str | HFConfig | TransformerModel, *, file: str | None) -> TransformerModel:
    if isinstance(spec, TransformerModel):
        return spec
    if isinstance(spec, HFConfig):
        base = Path(file).parent if file and file != "<inline>" else Path(".")
        return model_from_hf_config(base / spec.hf_config, file=file)
    return catalog.lookup("model", spec, file=file, field="model")  # type: ignore[no-any-return]


def resolve_system(e: HardwareEntry, *, file: str | None, field: str) -> System:
    if isinstance(e.system, System):
        return e.system
    if e.system is not None:
        return catalog.lookup("system", e.system, file=file, field=f"{field}.system")  # type: ignore[no-any-return]
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
    if not path.exists():
        raise ProblemError(f"hf_config file not found: {path}", file=file, field="model.hf_config")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProblemError(f"malformed JSON in {path}: {exc.msg}", file=file, field="model.hf_config") from None
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


def validate(cls: type[Any], data: Any, *, file: str | None, prefix: str = "") -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        line = _one_line(cls, exc)
        raise ProblemError(f"{prefix}.{line}" if prefix else line, file=file, field=None) from None


def _one_line(cls: type[BaseModel], exc: ValidationError) -> str:
    errors = exc.errors()
    # Prefer the most specific error: union branches produce several; take the deepest location.
    err = max(errors, key=lambda e: (e["type"] != "model_type", len(e["loc"])))
    loc = [str(p) for p in err["loc"] if not _is_branch_tag(p)]
    field = ".".join(loc) or "<root>"
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(cls, loc[:-1])
        return f"{field}: unknown key; allowed: {', '.join(allowed)}"
    if err["type"] == "missing":
        return f"{field}: required field missing"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
    return f"{field}: {msg}{shown}"


def _is_branch_tag(p: Any) -> bool:
    """pydantic inserts union member names (e.g. 'str', 'TransformerModel', 'list[int]') into locations."""
    s = str(p)
    tags = ("str", "int", "bool", "float", "inline", "catalog-name", "hf-config")
    return not isinstance(p, int) and (s[:1].isupper() or "[" in s or s in tags)


def _allowed_keys(cls: type[BaseModel], loc: list[str]) -> list[str]:
    current: Any = cls
    for part in loc:
        if part.isdigit():
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
        if current is None:
            return []
    return sorted(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None or get_args(annotation):
        for a in get_args(annotation):
            found = _model_in(a)
            if found is not None:
                return found
    return None
