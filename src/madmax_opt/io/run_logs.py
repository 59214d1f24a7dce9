"""What a measured run writes, read back: training step times from Megatron-LM / NeMo and torchtitan logs, and the
result JSON of a benchmark-serving client (``vllm bench serve``, ``python -m sglang.bench_serving``, InferenceX).

Formats, read in the frameworks' sources (the pins of data/flags/):

- Megatron-LM ``megatron/training/training.py`` ``training_log`` (core_v0.19.0, commit 5be96267) and Megatron-Bridge
  (NeMo 2) ``src/megatron/bridge/training/utils/train_utils.py`` (commit 067f987d) print, every ``--log-interval``
  iterations, one line with ``iteration {:8d}/{:8d} |`` ... ``elapsed time per iteration (ms): {:.1f} |`` ...
  ``global batch size: {:5d} |``: the mean wall time of the iterations since the previous line.
- torchtitan ``torchtitan/components/metrics.py`` ``MetricsProcessor.log`` (v0.2.2, commit 73a0e697) logs, every
  ``metrics.log_freq`` steps, ``step: N  loss: ...  memory: ...  tps: T  tflops: ...  mfu: ...%`` (ANSI colours
  unless disabled), with ``tps`` = tokens since the last line / (seconds x cp x tp x pp) of one data-parallel
  rank: tokens per second per GPU, so the step time is global_batch x seq_len / (tps x GPUs).
- ``vllm bench serve --save-result`` (vllm/benchmarks/serve.py) writes one JSON object: ``max_concurrency``,
  ``num_prompts``, ``request_rate`` plus ``completed``, ``duration``, ``total_input_tokens``,
  ``total_output_tokens``, ``request_throughput``, ``output_throughput`` and ``mean_/median_/p99_`` ``ttft_ms``,
  ``tpot_ms``, ``itl_ms``; SGLang's ``bench_serving`` and InferenceX's result files use the same key names.

Every error is one line naming the file (and the line, for a log).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_text

LogFormat = Literal["auto", "megatron", "torchtitan"]
LOG_FORMATS: tuple[str, ...] = ("auto", "megatron", "torchtitan")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_TITAN = re.compile(r"step:\s*(\d+)\s+loss:.*?tps:\s*([0-9,]+)")


@dataclass(frozen=True)
class StepLine:
    """One timing line of a training log: the iteration it ends, its value, the line number (1-based)."""

    iteration: int
    value: float  # Megatron: seconds per iteration; torchtitan: tokens per second per GPU
    line: int
    global_batch: int | None = None  # Megatron prints it on every line


@dataclass(frozen=True)
class LogSteps:
    """The timing lines of a training log and its format."""

    format: Literal["megatron", "torchtitan"]
    lines: list[StepLine]


def parse_training_log(text: str, fmt: LogFormat = "auto", *, file: str = "log") -> LogSteps:
    """The timing lines of a Megatron-LM / NeMo or torchtitan log (``auto``: whichever the text holds)."""
    megatron: list[StepLine] = []
    titan: list[StepLine] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = _ANSI.sub("", raw)
        if fmt in ("auto", "megatron") and (m := _MEGATRON.search(line)):
            b = _MEGATRON_BATCH.search(line)
            megatron.append(StepLine(int(m.group(1)), float(m.group(2)) / 1e3, n, int(b.group(1)) if b else None))
        elif fmt in ("auto", "torchtitan") and (t := _TITAN.search(line)):
            titan.append(StepLine(int(t.group(1)), float(t.group(2).replace(",", "")), n))
    if megatron and titan:
        raise ProblemError("holds both Megatron 'elapsed time per iteration (ms)' lines and torchtitan 'step: ... "
                           "tps:' lines; allowed: the log of one run (or set log_format)", file=file)
    if megatron:
        return LogSteps("megatron", megatron)
    if titan:
        return LogSteps("torchtitan", titan)
    wanted = {"megatron": "Megatron-LM / NeMo 'iteration N/M | ... elapsed time per iteration (ms): X |'",
              "torchtitan": "torchtitan 'step: N  loss: ...  tps: T'"}
    allowed = " or ".join(v for k, v in wanted.items() if fmt in ("auto", k))
    raise ProblemError(f"no timing line found; allowed: a training log with {allowed} lines", file=file)


def step_time_s(steps: LogSteps, *, skip: int, tokens_per_step: float, gpus: int, global_batch: int,
                file: str) -> float:
    """Median step time over the timing lines after the first ``skip`` iterations (warm-up, compilation).

    Megatron: the logged seconds per iteration. torchtitan: tokens_per_step / (tps x GPUs).
    """
    kept = [s for s in steps.lines if s.iteration > skip]
    if not kept:
        last = steps.lines[-1]
        raise ProblemError(f"no timing line after the first {skip} iteration(s) (the last line, {last.line}, ends "
                           f"iteration {last.iteration}); allowed: skip below {last.iteration}", file=file)
    for s in kept:
        if s.global_batch is not None and s.global_batch != global_batch:
            raise ProblemError(f"line {s.line}: global batch size {s.global_batch}, the run's task says "
                               f"{global_batch}; allowed: the log of this run", file=file)
        if s.value <= 0:
            raise ProblemError(f"line {s.line}: a timing value of {s.value:g}; allowed: > 0", file=file)
    if steps.format == "megatron":
        return statistics.median(s.value for s in kept)
    return statistics.median(tokens_per_step / (s.value * gpus) for s in kept)


def read_training_log(path: Path, fmt: LogFormat = "auto", *, file: str, field: str) -> LogSteps:
    """A training log's timing lines (size-capped read, one-line errors naming the runs file and field)."""
    text = read_text(path, what="log", file=file, field=field)
    return parse_training_log(text, fmt, file=f"{file}: {field}: {path}")


# ---------------------------------------------------------------------------------- benchmark-serving JSON


class BenchResult(BaseModel):
    """The fields madmax-opt reads from a benchmark-serving result (the others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    completed: int = Field(gt=0, description="requests that finished")
    duration: float = Field(gt=0, description="benchmark wall time, s")
    total_input_tokens: int = Field(ge=0)
    total_output_tokens: int = Field(gt=0)
    request_throughput: float = Field(gt=0, description="requests/s")
    output_throughput: float = Field(gt=0, description="generated tokens/s")
    mean_ttft_ms: float = Field(gt=0)
    median_ttft_ms: float = Field(gt=0)
    mean_tpot_ms: float = Field(gt=0)
    median_tpot_ms: float = Field(gt=0)
    max_concurrency: int | None = Field(None, gt=0)
    num_prompts: int | None = Field(None, gt=0)
    request_rate: float | Literal["inf"] | None = None

    @property
    def mean_input_len(self) -> float:
        return self.total_input_tokens / self.completed

    @property
    def mean_output_len(self) -> float:
        return self.total_output_tokens / self.completed


def parse_bench_json(text: str, *, file: str) -> BenchResult:
    """One benchmark-serving result; a file of several (``--append-result``: one object a line) is refused."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise ProblemError("holds several JSON objects (--append-result); allowed: one result per file",
                               file=file) from None
        raise ProblemError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=file) from None
    if not isinstance(data, dict):
        raise ProblemError(f"expected a JSON object, got {type(data).__name__}; allowed: the result file of "
                           "vllm bench serve / sglang.bench_serving", file=file)
    result: BenchResult = validate(BenchResult, data, file=file)
    return result


def read_bench_json(path: Path, *, file: str, field: str) -> BenchResult:
    return parse_bench_json(read_text(path, what="benchmark result", file=file, field=field),
                            file=f"{file}: {field}: {path}")
