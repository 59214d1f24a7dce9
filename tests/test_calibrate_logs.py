"""Reading what a measured run writes (io/run_logs.py) on the shipped synthetic examples of docs/examples/: the
expected values are the medians of the numbers written in those files, worked out by hand below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import run_logs as L
from madmax_opt.studies import calibrate as C

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
PLAN0 = EXAMPLES / "loop" / "plan-0.log"
TITAN = EXAMPLES / "logs" / "torchtitan-llama3-8b.log"
BENCH = EXAMPLES / "logs" / "vllm-bench-serve.json"
TOKENS = 128 * 8192  # global batch x sequence length of the examples


def test_megatron_log_median_after_warmup() -> None:
    steps = L.parse_training_log(PLAN0.read_text())
    assert steps.format == "megatron" and [s.iteration for s in steps.lines] == list(range(1, 13))
    assert steps.lines[0].value == pytest.approx(31.2507) and steps.lines[0].global_batch == 128
    # iterations 2..12 sorted: 14389.4 14398.9 14399.0 14402.5 14405.6 [14411.2] 14417.1 14420.3 14428.3 ...
    t = L.step_time_s(steps, skip=1, tokens_per_step=TOKENS, gpus=8, global_batch=128, file="f")
    assert t == pytest.approx(14.4112, rel=1e-12)
    # skip 0 keeps the 31 s first iteration: 12 values, median of the 6th and 7th = (14411.2 + 14417.1) / 2
    t0 = L.step_time_s(steps, skip=0, tokens_per_step=TOKENS, gpus=8, global_batch=128, file="f")
    assert t0 == pytest.approx((14.4112 + 14.4171) / 2, rel=1e-12)


def test_torchtitan_log_tps_is_per_gpu() -> None:
    steps = L.parse_training_log(TITAN.read_text())  # step 1 is written with ANSI colours
    assert steps.format == "torchtitan" and [s.value for s in steps.lines][:2] == [3105.0, 8974.0]
    # steps 2..10 tps sorted: 8962 8969 8974 8978 [8981] 8985 8987 8990 8991 -> 128 x 8192 / (8981 x 8 GPUs)
    t = L.step_time_s(steps, skip=1, tokens_per_step=TOKENS, gpus=8, global_batch=128, file="f")
    assert t == pytest.approx(1048576 / (8981 * 8), rel=1e-12)


@pytest.mark.parametrize(("text", "fmt", "message"), [
    ("nothing to see\n", "auto", "no timing line found"),
    (PLAN0.read_text(), "torchtitan", "no timing line found; allowed: a training log with torchtitan"),
    (PLAN0.read_text() + TITAN.read_text(), "auto", "holds both Megatron"),
])
def test_log_errors_are_one_line(text: str, fmt: L.LogFormat, message: str) -> None:
    with pytest.raises(ProblemError, match=message) as exc:
        L.parse_training_log(text, fmt, file="x.log")
    assert "\n" not in str(exc.value)


def test_log_of_another_batch_or_all_warmup_is_refused() -> None:
    steps = L.parse_training_log(PLAN0.read_text())
    with pytest.raises(ProblemError, match="global batch size 128, the run's task says 256"):
        L.step_time_s(steps, skip=1, tokens_per_step=TOKENS, gpus=8, global_batch=256, file="f")
    with pytest.raises(ProblemError, match="no timing line after the first 12 iteration"):
        L.step_time_s(steps, skip=12, tokens_per_step=TOKENS, gpus=8, global_batch=128, file="f")


def test_bench_json_fields() -> None:
    b = L.parse_bench_json(BENCH.read_text(), file=str(BENCH))
    raw = json.loads(BENCH.read_text())
    assert b.max_concurrency == 64 and b.completed == 640 and b.median_tpot_ms == 19.81
    assert b.mean_input_len == raw["total_input_tokens"] / 640 == 1024.0
    assert b.mean_output_len == 1024.0


@pytest.mark.parametrize(("text", "message"), [
    ("{", "malformed JSON at line 1"),
    ('{"completed": 1}\n{"completed": 2}\n', "holds several JSON objects"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"completed": 0}', "completed"),
])
def test_bench_json_errors_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ProblemError, match=message) as exc:
        L.parse_bench_json(text, file="b.json")
    assert "\n" not in str(exc.value)


def test_runs_file_reads_a_log_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text(TITAN.read_text())
    run = {"name": "tt", "model": "llama3-8b", "hardware": {"gpu": "h100-sxm", "gpus": 8},
           "task": {"seq_len": 8192, "global_batch": 128}, "framework": "torchtitan",
           "plan": {"dp": 8, "mbs": 1, "zero": 3}, "measured": {"log": "logs/train.log"}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"runs": [run]}))
    runs, _ = C.read_runs(path)
    assert runs[0].measured_s == pytest.approx(1048576 / (8981 * 8), rel=1e-12)
    # the log and a quoted step time must agree (2 %)
    path.write_text(yaml.safe_dump({"runs": [{**run, "measured": {"log": "logs/train.log", "step_time_s": 16.0}}]}))
    with pytest.raises(ProblemError, match=r"runs\[0\].measured: step_time_s gives a step of 16 s, log 14.59 s"):
        C.read_runs(path)
    path.write_text(yaml.safe_dump({"runs": [{**run, "measured": {"log": "missing.log"}}]}))
    with pytest.raises(ProblemError, match=r"runs\[0\].measured.log: log not found"):
        C.read_runs(path)


def test_a_serving_result_given_as_runs_file_says_what_it_is() -> None:
    with pytest.raises(ProblemError, match=r"a benchmark-serving result .* alone: .* serving_runs entry"):
        C.read_runs(BENCH)
