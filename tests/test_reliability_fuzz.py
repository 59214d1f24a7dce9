"""Issue 25, fuzz (hypothesis, like tests/test_fuzz.py but in process and small): report's sweep folder, pareto,
sensitivity, calibration overlays and the input-file reader. A candidate is a valid input damaged at one place;
what may happen is a one-line ProblemError (the CLI: exit 2 or 3 and one ``error:`` line) or success, never
another exception. The other helpers' commands (calibrate, emit, fleet, online serving) have their own fuzz tests."""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.report.sweep_report import markdown
from madmax_opt.studies.sensitivity import _floats, check_study
from madmax_opt.studies.sweep_schema import load_folder
from test_cli import run_main
from test_reliability_inputs import ENTRY, TRAIN, _row

EXAMPLES = 30
FAST = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SCRATCH = Path(tempfile.mkdtemp(prefix="madmax-reliability-fuzz-"))

# values that break a field: wrong types, non-finite, out of range, huge strings, deep nesting
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([math.inf, -math.inf, math.nan, 0.0, -1.0, 1e308, 5e-324]),
    st.text(max_size=20), st.just("x" * 100_000), st.just([]), st.just({}), st.just([[[[[[1]]]]]]),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested dict/list (the places a damage may hit)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _damage(data: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    data = copy.deepcopy(data)
    node = data
    for p in path[:-1]:
        node = node[p]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def _one_line(result: Any) -> None:
    """CLI result: success, or exit 2/3 with one error line and nothing that looks like a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 2, 3), (result.returncode, result.stderr)
    if result.returncode:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) < 5_000, result.stderr[:500]


# ------------------------------------------------------------------------------------------ report


ROW_PATHS = _paths(_row())
MANIFEST = {"keys": ["k1"], "objectives": ["throughput"], "title": "t"}


@FAST
@given(st.sampled_from(ROW_PATHS), JUNK, st.booleans())
def test_report_on_a_damaged_row(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    row = _damage(_row(), path, value, delete)
    folder = SCRATCH / "report-row"
    folder.mkdir(exist_ok=True)
    (folder / "sweep.json").write_text(json.dumps(MANIFEST))
    (folder / "results.jsonl").write_text(json.dumps(row, allow_nan=True) + "\n")
    try:
        manifest, rows, _ = load_folder(folder)
    except ProblemError as exc:
        assert "\n" not in str(exc) and "results.jsonl" in str(exc)
        return
    markdown(folder, folder / "report.md", manifest, rows, {})  # what passed the schema is reportable


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(st.one_of(st.sampled_from(_paths(MANIFEST)).flatmap(
    lambda p: st.tuples(st.just(p), JUNK, st.booleans()).map(lambda t: json.dumps(_damage(MANIFEST, *t)))),
    st.text(max_size=50), st.binary(max_size=50).map(lambda b: b.decode("latin-1"))))
def test_report_on_a_damaged_manifest(text: str) -> None:
    folder = SCRATCH / "report-manifest"
    folder.mkdir(exist_ok=True)
    (folder / "sweep.json").write_text(text)
    (folder / "results.jsonl").write_text(json.dumps(_row()) + "\n")
    _one_line(run_main("report", folder, "--md", folder / "out" / "report.md"))


# ------------------------------------------------------------------------------------------ overlays


OVERLAY = {"kind": "madmax-opt calibration overlay", "calibrations": [ENTRY]}


@FAST
@given(st.sampled_from(_paths(OVERLAY)), JUNK, st.booleans())
def test_damaged_overlays_are_one_line_errors(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    folder = SCRATCH / "overlay"
    folder.mkdir(exist_ok=True)
    (folder / "ov.yaml").write_text(yaml.safe_dump(_damage(OVERLAY, path, value, delete)))
    try:
        problem_from_dict(TRAIN | {"calibration": "ov.yaml"}, source=str(folder / "p.yaml"))
    except ProblemError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 5_000


# ------------------------------------------------------------------------------------------ sensitivity


@FAST
@given(st.one_of(st.text(max_size=40), st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                                          st.integers(-5, 5)), max_size=60).map(
    lambda xs: ",".join(map(str, xs)))))
def test_sensitivity_factor_lists(text: str) -> None:
    try:
        factors = _floats(text, "--factors")
        check_study(["gemm_efficiency"], factors)
    except ProblemError as exc:
        assert exc.field == "--factors" and "\n" not in str(exc)
        return
    assert all(math.isfinite(f) and f > 0 for f in factors) and len(set(factors)) == len(factors)


# ------------------------------------------------------------------------------------------ pareto


SERVING = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": 8},
           "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "ttft_s": 1.0}}
BAD_SERVING = st.one_of(st.none(), st.booleans(), st.integers(max_value=0), st.integers(min_value=10**9),
                        st.sampled_from([math.inf, math.nan, -1.0, "fast", [], {}, "x" * 10_000]))


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(_paths(SERVING)), BAD_SERVING, st.booleans())
def test_pareto_on_damaged_serving_problems(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    folder = SCRATCH / "pareto"
    folder.mkdir(exist_ok=True)
    (folder / "p.yaml").write_text(yaml.safe_dump(_damage(SERVING, path, value, delete)))
    result = run_main("pareto", folder / "p.yaml", "--out", folder / "front")
    _one_line(result)


# ------------------------------------------------------------------------------------------ reading files


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_as_a_yaml_file(data: bytes) -> None:
    path = SCRATCH / "bytes.yaml"
    path.write_bytes(data)
    try:
        read_yaml(path, what="problem file")
    except ProblemError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(["solve", "evaluate", "timeline", "sensitivity", "pareto", "report", "calibrate", "sweep",
                        "fleet"]), st.sampled_from(["fifo", "loop", "dir", "/dev/zero", "missing"]))
def test_special_files_through_each_command(command: str, kind: str) -> None:
    files = SCRATCH / "special"
    if not files.exists():
        files.mkdir()
        os.mkfifo(files / "fifo")
        (files / "loop").symlink_to(files / "loop2")
        (files / "loop2").symlink_to(files / "loop")
        (files / "dir").mkdir()
    path = kind if kind.startswith("/") else str(files / kind)
    args = {"evaluate": [path, "--plan", path], "timeline": [path, "--plan", path]}.get(command, [path])
    result = run_main(command, *args)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, (command, kind, result.stderr)
