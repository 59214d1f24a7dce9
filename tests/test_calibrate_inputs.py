"""`madmax-opt calibrate` on bad runs files: one line naming the file and field, exit 2; the leave-one-out memo
gives the fit the plain model evaluations give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import run_main
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.spec import Plan
from madmax_opt.studies import calibrate as C
from madmax_opt.studies import fit as F

MODEL: dict[str, Any] = {"name": "toy", "layers": 8, "hidden": 2048, "heads": 16, "ffn": 8192, "vocab": 32000}
RUN: dict[str, Any] = {"name": "a", "model": MODEL, "hardware": {"gpu": "h100-sxm", "gpus": 8},
                       "task": {"seq_len": 2048, "global_batch": 64}, "plan": {"dp": 8, "mbs": 2, "zero": 1},
                       "measured": {"step_time_s": 0.5}}


def _write(tmp_path: Path, runs: list[dict[str, Any]], name: str = "runs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"runs": runs}))
    return path


def _refused(path: Path, out: Path, *fragments: str) -> None:
    r = run_main("calibrate", path, "--out", out)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize(("change", "fragments"), [
    ({"plan": {"dp": 8, "mbs": 3}}, ("runs[0].plan", "dp*mbs must divide global_batch")),  # 24 does not divide 64
    ({"plan": {"dp": 16}}, ("runs[0].plan", "16 GPUs", "the run's 8 GPUs")),
    ({"plan": {"dp": 8, "ep": 2}}, ("runs[0].plan", "ep = 1 for dense models")),
    ({"plan": {"dp": 4, "tp": 2, "sp": True, "mbs": 2}, "task": {"seq_len": 2048, "global_batch": 64}}, None),
    ({"framework": "vllm"}, ("runs[0].framework", "'vllm' is not a training framework", "megatron-core")),
    ({"measured": {"step_time_s": 1.0, "tokens_per_s": 1000.0}},
     ("runs[0].measured", "step_time_s gives a step of 1 s, tokens_per_s 131.1 s", "within 2 %")),
])
def test_invalid_runs_are_refused_by_field(tmp_path: Path, change: dict[str, Any],
                                           fragments: tuple[str, ...] | None) -> None:
    if fragments is None:  # a valid plan: the same checks let it through (the control of this test)
        C.read_runs(_write(tmp_path, [{**RUN, **change}]))
        return
    _refused(_write(tmp_path, [{**RUN, **change}]), tmp_path / "out.yaml", *fragments)


def test_agreeing_measurements_are_one_step_time(tmp_path: Path) -> None:
    # 64 x 2048 tokens a step: 0.5 s is 262,144 tokens/s (32,768 per GPU); 1 % off is within the tolerance
    runs, _ = C.read_runs(_write(tmp_path, [{**RUN, "measured": {"step_time_s": 0.5, "tokens_per_s": 262144 * 1.01,
                                                                 "tokens_per_s_per_gpu": 32768}}]))
    assert runs[0].measured_s == 0.5


def test_out_equal_to_the_runs_file_is_refused(tmp_path: Path) -> None:
    runs = _write(tmp_path, [RUN, {**RUN, "name": "b"}])
    before = runs.read_text()
    for out in (runs, tmp_path / "." / "runs.yaml"):
        r = run_main("calibrate", runs, "--out", out)
        assert r.returncode == 2 and "--out" in r.stderr and "is the runs file" in r.stderr
    link = tmp_path / "link.yaml"
    link.symlink_to(runs)
    r = run_main("calibrate", runs, "--out", link)
    assert r.returncode == 2 and "is the runs file" in r.stderr
    assert runs.read_text() == before


def test_empty_modern_cases_and_alias_bombs_are_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("cases: []\nmodel_catalog: {}\n")
    _refused(empty, tmp_path / "o.yaml", "cases: no case to fit")
    # 10 x 10 x ... nested aliases: 10^9 values once expanded, 100 bytes of text
    lines = ["runs:", "- name: a", "  model: llama3-8b", "  hardware: {gpu: h100-sxm, gpus: 8}",
             "  task: {seq_len: 2048, global_batch: 64}", "  plan: {dp: 8}", "  measured: {step_time_s: 1.0}",
             "  stack:", "    a0: &a0 [1,1,1,1,1,1,1,1,1,1]"]
    lines += [f"    a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    _refused(bomb, tmp_path / "o.yaml", "once its YAML aliases are expanded")
    assert C.expanded_nodes({"a": [1, 2, {"b": 3}]}, 100) == 6  # dict, 'a' list, 1, 2, inner dict, 3


def test_memory_and_uneven_layers_are_notes_not_refusals(tmp_path: Path) -> None:
    big = {**RUN, "model": "llama3-70b", "plan": {"dp": 8, "mbs": 1, "zero": 1}}  # 70B on 8 GPUs at ZeRO-1
    runs, notes = C.read_runs(_write(tmp_path, [big]))
    assert len(runs) == 1 and "the memory model says memory per GPU" in notes[0][1]


def _run(seq: int, mbs: int, precision: str) -> F.Run:
    problem = problem_from_dict({"model": MODEL, "hardware": {"gpu": "h100-sxm", "gpus": 8},
                                 "task": {"seq_len": seq, "global_batch": 8 * mbs * 4, "precision": precision}})
    return F.Run(f"{precision}-{seq}-{mbs}", "synthetic", problem, Plan(dp=8, mbs=mbs, zero=1), 1.0)


def test_memo_gives_the_plain_fit_and_prices_each_set_once() -> None:
    runs = [_run(s, b, "bf16") for s, b in ((2048, 2), (4096, 1), (32768, 1), (65536, 1))]
    truth = F.predict(runs, [{"gemm_eff": 0.6, "attn_eff": 0.4}])[:, 0] * np.array([1.03, 0.98, 1.01, 0.97])
    runs = [F.Run(r.name, r.source, r.problem, r.plan, float(t)) for r, t in zip(runs, truth, strict=True)]
    memo = C.MemoPredict()  # noisy runs, so that leave-one-out fits differ
    for i in (0, 3):  # a leave-one-out fit: the same as without the memo
        rest = runs[:i] + runs[i + 1:]
        names = ["gemm_eff", "attn_eff"]
        plain, kept = F.fit(rest, names), F.fit(rest, names, predict=memo)
        assert plain.factors == kept.factors and np.array_equal(plain.predicted_s, kept.predicted_s)
    calls: list[int] = []
    original = F.predict_scaled

    def counting(rs: Any, sets: Any, bases: Any) -> Any:
        calls.append(len(sets))
        return original(rs, sets, bases)

    F.predict_scaled = counting  # type: ignore[assignment]
    try:
        F.fit(runs[1:], ["gemm_eff", "attn_eff"], predict=memo)  # every set of this fit was priced above: no model evaluation
    finally:
        F.predict_scaled = original  # type: ignore[assignment]
    assert calls == []


def test_link_loops_and_unwritable_outputs_are_one_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.symlink_to(b)
    b.symlink_to(a)
    r = run_main("calibrate", a, "--out", tmp_path / "o.yaml")
    assert r.returncode == 2 and "symlink loop" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    runs = _write(tmp_path, [RUN, {**RUN, "name": "b"}])
    for out in (tmp_path, Path("/proc/version")):  # a directory; a file that answers EIO to a write
        if out.exists():
            r = run_main("calibrate", runs, "--out", out)
            assert r.returncode == 2 and str(out) in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


FIELDS = ["name", "model", "hardware", "hardware.gpu", "hardware.gpus", "task", "task.seq_len", "task.global_batch",
          "precision", "framework", "stack", "plan", "plan.dp", "plan.mbs", "plan.tp", "plan.ep", "plan.zero",
          "measured", "measured.step_time_s", "measured.tokens_per_s", "measured.log", "measured.skip", "extra"]
VALUES: list[Any] = [None, 0, -1, 1, 3, 7, 10**30, 1e-300, 1e300, float("nan"), "inf", True, "", "x" * 300, [],
                     [1, 2], {}, {"a": 1}, "vllm", "llama3-70b", "h100-sxm", "../../etc/passwd", "/dev/zero"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=st.sampled_from(VALUES))
def test_fuzz_one_field_is_fitted_or_one_line(tmp_path: Path, field: str, value: Any) -> None:
    run: dict[str, Any] = json.loads(json.dumps(RUN))
    *parents, leaf = field.split(".")
    node = run
    for p in parents:
        node = node[p]
    node[leaf] = value
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump({"runs": [run, {**RUN, "name": "b"}]}))
    r = run_main("calibrate", path, "--out", tmp_path / "o.yaml")
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
