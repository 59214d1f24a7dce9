"""What ``madmax-opt report`` reads from a sweep folder, as a schema: ``sweep.json`` (the manifest) and the rows of
``results.jsonl`` it lists. A damaged folder (a manifest that is ``{}``, a list or cut short; a row whose
``tokens_per_s`` is ``"fast"``, that has no plan or a null result) is one ProblemError line naming the file, the
line and the field, never a KeyError deep in the report. Fields the report does not read are not checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.limits import MAX_FILE_BYTES, MAX_RESULTS_BYTES
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_input_bytes, read_text
from madmax_opt.model.objectives import ObjectiveName
from madmax_opt.model.plan import Plan
from madmax_opt.studies.sweep_spec import MANIFEST_FILE, RESULTS_FILE


class _Read(BaseModel):
    """Strict types (``"fast"`` is not a number, ``"8"`` not an integer); keys the report does not read pass."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class RunRecord(_Read):
    """The manifest's record of the last sweep run."""

    backend: str
    workers: int = Field(ge=1)
    cpu_count: int | None = None
    solved: int = Field(ge=0)
    skipped: int = Field(ge=0)
    wall_s: float = Field(ge=0.0)
    interrupted: str | None = None
    validate_s: float | None = None
    load_avg_1m_at_end: float | None = None


class Manifest(_Read):
    """``sweep.json``: the sweep's combinations (by key, in order) and its description."""

    keys: list[str]
    objectives: list[ObjectiveName] = Field(["throughput"], min_length=1)
    title: str | None = None
    description: str | None = None
    command: str | None = None
    sweep_file: str | None = None
    run: RunRecord | None = None


class Combination(_Read):
    """One model x task x system x size x objective of the sweep."""

    model: str
    task: int = Field(ge=0)
    system: str
    gpu: str
    gpus: int = Field(ge=1)
    objective: ObjectiveName
    power_w_per_gpu: float = Field(gt=0.0)
    train_tokens: float | None = Field(None, gt=0.0)
    seq_len: int | None = Field(None, ge=1)
    global_batch: int | None = Field(None, ge=1)


class TimeToTrain(_Read):
    hours: float = Field(gt=0.0)
    cost_usd: float = Field(ge=0.0)
    energy_mwh: float = Field(ge=0.0)


class Memory(_Read):
    total: float = Field(ge=0.0)


class Best(_Read):
    """The solved plan and the metrics the report ranks by (SI units)."""

    plan: Plan
    tokens_per_s: float = Field(gt=0.0)
    step_time_s: float = Field(gt=0.0)
    mfu: float = Field(ge=0.0)
    cost_per_hour_usd: float = Field(ge=0.0)
    usd_per_million_tokens: float = Field(ge=0.0)
    memory_bytes_per_gpu: Memory
    time_to_train: TimeToTrain | None = None


class Baseline(_Read):
    feasible: bool
    infeasible_reason: str | None = None
    tokens_per_s: float | None = Field(None, ge=0.0)


class Result(_Read):
    status: str
    best: Best
    baseline: Baseline | None = None
    speedup_vs_baseline: float | None = Field(None, gt=0.0)


class RowError(_Read):
    message: str = ""


class Row(_Read):
    """One line of ``results.jsonl``: a solved (``ok``), infeasible or failed combination."""

    key: str
    combination: Combination
    status: Literal["ok", "infeasible", "error"]
    result: Result | None = None
    error: RowError | None = None

    @model_validator(mode="after")
    def _result_when_ok(self) -> Row:
        if self.status == "ok" and self.result is None:
            raise ValueError("status ok needs a result; allowed: a result with a best plan, or status infeasible "
                             "/ error")
        return self


def load_folder(outdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """The manifest, the rows of its combinations in sweep order (validated, as read) and the number of damaged
    lines skipped (a line cut by a crash or not JSON: its combination counts as not run, as ``sweep`` would
    solve it again)."""
    if not outdir.is_dir():
        what = "not found" if not outdir.exists() else "not a directory"
        raise ProblemError(f"{what}; allowed: a directory written by madmax-opt sweep", file=str(outdir))
    manifest_path = outdir / MANIFEST_FILE
    if not manifest_path.exists() and not manifest_path.is_symlink():
        raise ProblemError(f"no {MANIFEST_FILE} here; allowed: a directory written by madmax-opt sweep",
                           file=str(outdir))
    text = read_text(manifest_path, what="sweep manifest", file=str(manifest_path), max_bytes=MAX_FILE_BYTES)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProblemError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; allowed: the "
                           "sweep.json madmax-opt sweep writes (rerun the sweep)", file=str(manifest_path)) from None
    except (RecursionError, ValueError) as exc:
        raise ProblemError(f"malformed JSON: {type(exc).__name__}", file=str(manifest_path)) from None
    if not isinstance(data, dict):
        keys = ", ".join(Manifest.model_fields)
        raise ProblemError(f"a JSON {type(data).__name__}; allowed: an object with keys {keys}",
                           file=str(manifest_path))
    manifest: Manifest = validate(Manifest, _read_part(Manifest, data), file=str(manifest_path))
    wanted = set(manifest.keys)
    results_path = outdir / RESULTS_FILE
    rows: dict[str, dict[str, Any]] = {}
    damaged = 0
    if results_path.exists() or results_path.is_symlink():
        raw = read_input_bytes(results_path, what="sweep results", file=str(results_path),
                               max_bytes=MAX_RESULTS_BYTES)
        end = raw.rfind(b"\n") + 1  # after the last newline: a partial write, not yet a row
        for number, line in enumerate(raw[:end].splitlines(), start=1):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                damaged += 1
                continue
            key = row.get("key") if isinstance(row, dict) else None
            if not isinstance(key, str) or key not in wanted or key in rows:
                damaged += not isinstance(key, str)
                continue
            validate(Row, _read_part(Row, row), file=f"{results_path} line {number}")
            rows[key] = row
    return data, [rows[k] for k in manifest.keys if k in rows], damaged


def _read_part(cls: type[BaseModel], data: Any) -> Any:
    """The part of ``data`` that ``cls`` declares (recursively): what the report reads is checked (bounds, finite
    numbers, booleans); the rest of a row (solver statistics, the top-k list) is not the report's to judge."""
    if not isinstance(data, dict) or not issubclass(cls, _Read):
        return data
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in cls.model_fields:
            inner = [a for a in (cls.model_fields[name].annotation, *get_args(cls.model_fields[name].annotation))
                     if isinstance(a, type) and issubclass(a, BaseModel)]
            out[name] = _read_part(inner[0], value) if inner else value
    return out


def is_row(row: Any) -> bool:
    """Whether ``row`` (a parsed line of results.jsonl) holds what the report and the table read: a resumed sweep
    treats any other line as damaged and solves its problem again."""
    try:
        Row.model_validate(_read_part(Row, row))
    except ValidationError:
        return False
    return True
