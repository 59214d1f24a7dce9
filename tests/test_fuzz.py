"""Fuzz: malformed and extreme problem, plan and sweep files through every command that reads them, each run in
its own process with a time limit: exit 2 (bad input) or 3 (infeasible), one ``error:`` line on stderr, no
traceback, no hang. Valid inputs are mutated at one field (a size beyond its bound, zero, a negative number, a
boolean, a non-finite number, a wrong type, deep nesting, a long list) or in their text (a bracket or brace that
breaks the YAML, bytes that are not UTF-8, YAML bombs).

Start-up costs about a second per process, so one server process imports the package once and forks a child per
command (``python tests/test_fuzz.py --serve``, one JSON request per line); the child is a separate process that
runs ``madmax-opt``'s ``main()`` with its own stdout and stderr, killed at the time limit. The default run tries
FUZZ_EXAMPLES examples per file kind (well under two minutes); ``pytest -m slow`` runs SLOW_EXAMPLES.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from madmax_opt.core.errors import MadmaxError
from madmax_opt.io.limits import MAX_CLUSTER_SIZES, bounds

FUZZ_EXAMPLES = 25  # per file kind in the default run
SLOW_EXAMPLES = 300
TIME_LIMIT_S = 60.0  # per command; a hang is a failure
SCRATCH = Path(tempfile.mkdtemp(prefix="madmax-fuzz-"))  # where the in-process loaders read a candidate file

PROBLEM: dict[str, Any] = {
    "model": "llama2-7b",
    "hardware": {"gpu": "h100-sxm", "gpus": 8},
    "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64, "train_tokens": 1.0e9},
    "space": {"tp": [1, 2, 8], "recompute": ["none", "full"]},
    "constraints": {"max_cost_per_hour": 1000.0},
}
INLINE_MODEL = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 32000}
SERVING: dict[str, Any] = {
    "model": "llama2-7b",
    "hardware": {"gpu": "h100-sxm", "gpus": 8},
    "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "ttft_s": 1.0},
}
DLRM: dict[str, Any] = {
    "model": {"family": "dlrm", "tables": [{"name": "t", "count": 8, "rows": 1000, "dim": 64, "pooling": 10}],
              "dense_features": 13, "bottom_mlp": {"layers": 2, "width": 64}, "top_mlp": {"layers": 2, "width": 64}},
    "hardware": {"system": "zionex", "gpus": 8},
    "task": {"kind": "train", "global_batch": 4096},
    "space": {"tp": [1, 2]},
}
PLAN: dict[str, Any] = {"dp": 8, "tp": 1, "pp": 1, "mbs": 1, "zero": 1, "recompute": "none"}
SWEEP: dict[str, Any] = {
    "models": ["llama2-7b"],
    "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64},
    "hardware": [{"gpu": "h100-sxm", "gpus": [8, 16]}],
    "objectives": ["throughput"],
    "solver": {"top_k": 1, "time_limit_s": 10.0},
}

# (base, field paths a mutation may hit); a path is keys and list indices
PROBLEM_PATHS = [
    ("hardware", "gpus"), ("task", "seq_len"), ("task", "global_batch"), ("task", "train_tokens"),
    ("space", "tp"), ("space", "tp", 0), ("space", "pp"), ("space", "vpp"), ("space", "mbs"), ("space", "dp"),
    ("space", "cp"), ("space", "ep"), ("constraints", "max_cost_per_hour"), ("constraints", "max_gpus"),
]
INLINE_PATHS = [("model", k) for k in INLINE_MODEL]
SERVING_PATHS = [("task", "prompt_len"), ("task", "output_len"), ("task", "ttft_s"), ("hardware", "gpus"),
                 ("space", "tp")]
DLRM_PATHS = [("model", "tables", 0, "count"), ("model", "tables", 0, "rows"), ("model", "tables", 0, "dim"),
              ("model", "tables", 0, "pooling"), ("model", "dense_features"), ("task", "global_batch"),
              ("space", "tp"), ("hardware", "gpus")]
PLAN_PATHS = [(k,) for k in ("dp", "tp", "pp", "mbs", "zero", "cp", "vpp")]
SWEEP_PATHS = [("task", "global_batch"), ("task", "seq_len"), ("hardware", 0, "gpus"), ("hardware", 0, "gpus", 0),
               ("solver", "top_k"), ("solver", "time_limit_s"), ("models", 0)]

FLOAT_FIELDS = {"train_tokens", "max_cost_per_hour", "ttft_s", "pooling", "time_limit_s"}


# ------------------------------------------------------------------------------------------- bad values


def _bad_count(field: str) -> st.SearchStrategy[Any]:
    """A value no count field accepts: beyond its bound, zero or negative, a boolean, a non-integer, a wrong
    type, nested too deep."""
    bound = int(bounds()[field].limit) if field in bounds() else 10**18
    return st.one_of(
        st.integers(min_value=bound + 1, max_value=10**40),
        st.integers(min_value=-(10**30), max_value=0),
        st.booleans(),
        st.sampled_from([math.inf, -math.inf, math.nan, 0.5, 1e300]),
        st.sampled_from(["eight", "", "1e400", "inf", "NaN"]),
        st.just({"a": 1}),
        st.integers(min_value=65, max_value=400).map(_nested),
    )


def _bad_float(field: str) -> st.SearchStrategy[Any]:
    """A value no positive finite float field accepts."""
    bound = bounds()[field].limit if field in bounds() else None
    beyond = [st.floats(min_value=bound * 1.01, max_value=1e300)] if bound is not None else []
    return st.one_of(
        *beyond,
        st.sampled_from([math.inf, -math.inf, math.nan, "inf", "-Infinity", "nan", 0.0, -1.0, True]),
        st.just(["a"]),
        st.integers(min_value=65, max_value=400).map(_nested),
    )


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _bad_value(path: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    field = next(str(p) for p in reversed(path) if isinstance(p, str))
    if path == ("models", 0):
        return st.sampled_from(["no-such-model", 7, {"layers": 10**9}])
    if field in FLOAT_FIELDS:
        return _bad_float(field)
    if field == "gpus" and path[-1] == "gpus":  # also: more cluster sizes than allowed
        many = st.integers(min_value=MAX_CLUSTER_SIZES + 1, max_value=3 * MAX_CLUSTER_SIZES).map(
            lambda n: list(range(8, 8 * n + 1, 8)))
        return st.one_of(_bad_count(field), many)
    if field == "zero":
        return st.one_of(st.integers(min_value=4, max_value=10**30), st.integers(max_value=-1), st.booleans())
    return _bad_count(field)


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    data = json.loads(json.dumps(data))  # a deep copy
    node = data
    for p in path[:-1]:
        node = node.setdefault(p, {}) if isinstance(node, dict) else node[p]  # a section the base leaves out
    node[path[-1]] = value
    return data


@st.composite
def mutated(draw: st.DrawFn, bases: list[tuple[dict[str, Any], list[tuple[Any, ...]]]]) -> str:
    """YAML text of a base with one field replaced by a bad value."""
    base, paths = draw(st.sampled_from(bases))
    path = draw(st.sampled_from(paths))
    data = _set(base, path, draw(_bad_value(path)))
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=10**6)


BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
SPECIAL_TEXTS = [
    "", "\n", "~\n", "[]\n", "42\n", "!!python/object/apply:os.system ['true']\n", BOMB + "model: *i\n",
    "model: llama2-7b\nmodel: llama2-7b\n", "%YAML 9.9\n---\nmodel: x\n", "key: 2024-13-45\n",
    "gpus: 1" + "0" * 5000 + "\n", "a: " + "[" * 20000 + "]" * 20000 + "\n", "{" * 2000 + "\n",
    "? [a, b]\n: 1\n", "a: !!binary AAAA\n", "a: !!set {x}\n",
]


@st.composite
def broken_text(draw: st.DrawFn, bases: list[dict[str, Any]], loads: Any) -> bytes:
    """A valid file with a brace, bracket or bad byte inserted (kept only if it no longer loads), or a special
    document (empty, a scalar, a python tag, a YAML bomb, nesting 20,000 deep, a 5,000-digit integer ...)."""
    if draw(st.booleans()):
        return draw(st.sampled_from(SPECIAL_TEXTS)).encode()
    text = yaml.safe_dump(draw(st.sampled_from(bases)), sort_keys=False, default_flow_style=None).encode()
    at = draw(st.integers(min_value=0, max_value=len(text)))
    bad = draw(st.sampled_from([b"{", b"[", b"]", b"}", b"\xff", b"\xc3\x28", b"\x00", b": :", b"- - ["]))
    text = text[:at] + bad + text[at:]
    assume(not loads(text))  # the insertion happened to keep the file valid: not a bad input
    return text


# ---------------------------------------------------------------------------------------- the server


def serve() -> None:
    """Read {"argv", "cwd", "timeout_s"} lines; fork a child per request that runs main(); reply one JSON line."""
    from madmax_opt.cli import main as cli

    for module in ("madmax_opt.search.solver", "madmax_opt.analysis.trace", "madmax_opt.studies.sweep_results",
                   "madmax_opt.report.timeline", "madmax_opt.report.families", "madmax_opt.io.dlrm_problem",
                   "madmax_opt.search.serving", "madmax_opt.studies.sensitivity", "matplotlib.pyplot"):
        with contextlib.suppress(ImportError):
            __import__(module)  # imported once here, not in every child
    from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict
    from madmax_opt.io.problem import problem_from_dict

    problem_from_dict(PROBLEM)  # fills the catalog and calibration caches the children inherit
    problem_from_dict(SERVING)
    dlrm_problem_from_dict(DLRM)
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            t0 = time.monotonic()
            pid = os.fork()
            if pid == 0:  # the child: one command, as the console script runs it
                child_code = 98
                try:
                    os.setsid()
                    os.chdir(req["cwd"])
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    sys.argv = ["madmax-opt", *req["argv"]]
                    cli.main()
                    child_code = 0
                except SystemExit as stop:
                    child_code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                except BaseException:
                    import traceback

                    traceback.print_exc()
                    child_code = 99
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(child_code)
            code: int | None = None
            while time.monotonic() - t0 < req["timeout_s"]:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    code = os.waitstatus_to_exitcode(status)
                    break
                time.sleep(0.002)
            if code is None:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = {"code": code, "stdout": out.read().decode(errors="replace"),
                     "stderr": err.read().decode(errors="replace"), "wall_s": time.monotonic() - t0}
        print(json.dumps(reply), flush=True)


class Server:
    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "80",
               "NO_COLOR": "1", "MPLBACKEND": "Agg"}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.runs = 0

    def run(self, *argv: str | Path, cwd: Path) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd),
                                          "timeout_s": TIME_LIMIT_S}) + "\n")
        self.proc.stdin.flush()
        self.runs += 1
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()
    print(f"\nfuzz: {s.runs} commands run")


def check(result: dict[str, Any], what: str) -> None:
    """Exit 2 or 3, nothing but one 'error:' line on stderr, no traceback, within the time limit."""
    assert result["code"] is not None, f"{what}: no answer within {TIME_LIMIT_S} s"
    assert "Traceback" not in result["stderr"] + result["stdout"], f"{what}: {result['stderr'][-3000:]}"
    assert result["code"] in (2, 3), f"{what}: exit {result['code']}: {result['stderr'][-2000:]}"
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {result['stderr'][-2000:]}"


# ----------------------------------------------------------------------------------------- loaders


def _loads_as(kind: str) -> Any:
    """Whether a file's bytes load as a valid ``kind`` file in this process (an insertion that kept it valid)."""

    def loads(text: bytes) -> bool:
        from madmax_opt.io.dlrm_problem import load_dlrm_problem
        from madmax_opt.io.file_family import file_family
        from madmax_opt.io.plans import load_plans
        from madmax_opt.io.problem import load_problem
        from madmax_opt.io.yaml_files import read_yaml
        from madmax_opt.model.family_name import FamilyName
        from madmax_opt.studies.sweep_spec import load_sweep

        path = SCRATCH / f"{kind}.yaml"  # a fixed name: tempfile's random names would upset hypothesis
        path.write_bytes(text)
        if True:
            try:
                if kind == "plan":
                    load_plans(path)
                elif kind == "sweep":
                    load_sweep(path)
                elif file_family(read_yaml(path, what="problem file")) is FamilyName.RECOMMENDER:
                    load_dlrm_problem(path)
                else:
                    load_problem(path)
            except MadmaxError:
                return False
            except Exception:
                return False  # a loader crash is a bad input here: the subprocess check will catch it
            return True

    return loads


def _problem_commands(path: Path, plan: Path, out: Path) -> list[list[str | Path]]:
    return [
        ["solve", path, "--time-limit", "10"],
        ["evaluate", path, "--plan", plan],
        ["verify", path],
        ["timeline", path, "--plan", plan, "--out", out],
        ["sensitivity", path, "--params", "nic_bandwidth", "--factors", "2", "--out", out],
        ["pareto", path, "--out", out],
        ["emit", path, "megatron", "--plan", plan],
    ]


def _valid_files(d: Path) -> tuple[Path, Path]:
    problem = d / "ok-problem.yaml"
    problem.write_text(yaml.safe_dump(PROBLEM))
    plan = d / "ok-plan.yaml"
    plan.write_text(yaml.safe_dump(PLAN))
    return problem, plan


PROBLEM_BASES = [(PROBLEM, PROBLEM_PATHS), (PROBLEM | {"model": INLINE_MODEL}, INLINE_PATHS),
                 (SERVING, SERVING_PATHS), (DLRM, DLRM_PATHS)]


def _fuzz_problems(server: Server, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(text=st.one_of(mutated(PROBLEM_BASES).map(str.encode),
                          broken_text([PROBLEM, SERVING, DLRM], _loads_as("problem"))))
    def one(text: bytes) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            path = tmp / "problem.yaml"
            path.write_bytes(text)
            _, plan = _valid_files(tmp)
            for argv in _problem_commands(path, plan, tmp / "out"):
                check(server.run(*argv, cwd=tmp), f"{argv[0]} on {text[:300]!r}")

    one()


def _fuzz_plans(server: Server, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(text=st.one_of(mutated([(PLAN, PLAN_PATHS)]).map(str.encode), broken_text([PLAN], _loads_as("plan"))))
    def one(text: bytes) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            problem, _ = _valid_files(tmp)
            plan = tmp / "plan.yaml"
            plan.write_bytes(text)
            for argv in (["evaluate", problem, "--plan", plan], ["timeline", problem, "--plan", plan, "--out", tmp],
                         ["emit", problem, "megatron", "--plan", plan]):
                check(server.run(*argv, cwd=tmp), f"{argv[0]} on plan {text[:300]!r}")

    one()


def _fuzz_sweeps(server: Server, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(text=st.one_of(mutated([(SWEEP, SWEEP_PATHS)]).map(str.encode), broken_text([SWEEP], _loads_as("sweep"))))
    def one(text: bytes) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            sweep = tmp / "sweep.yaml"
            sweep.write_bytes(text)
            check(server.run("sweep", sweep, "--out", tmp / "out", "--workers", "1", cwd=tmp),
                  f"sweep on {text[:300]!r}")
            assert not (tmp / "out" / "results.jsonl").exists()  # refused before any work

    one()


@pytest.mark.parametrize("kind", ["problem", "plan", "sweep"])
def test_fuzz_bad_files_give_one_line_and_exit_2_or_3(server: Server, kind: str) -> None:
    {"problem": _fuzz_problems, "plan": _fuzz_plans, "sweep": _fuzz_sweeps}[kind](server, FUZZ_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["problem", "plan", "sweep"])
def test_fuzz_many_bad_files(server: Server, kind: str) -> None:
    {"problem": _fuzz_problems, "plan": _fuzz_plans, "sweep": _fuzz_sweeps}[kind](server, SLOW_EXAMPLES)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
