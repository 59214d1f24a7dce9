"""Issue 25, inputs: the one input-file reader (FIFOs, devices, directories, symlink loops, size caps), overlays
that cannot apply, a damaged sweep folder under ``report``, sensitivity factors, MoE Hugging Face configs, training
with a serving engine, ep that cannot split the experts, long values in error lines. Every case is checked in
process (no solve), so the file runs in a few seconds."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from madmax_opt.core.errors import InputWarning, ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.limits import MAX_FILE_BYTES
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.yaml_files import read_input_bytes, read_yaml
from madmax_opt.studies.sensitivity import FACTOR_RANGE, MAX_FACTORS, check_study
from madmax_opt.studies.sweep_schema import load_folder
from test_cli import assert_one_line_error, run_main

TRAIN: dict[str, Any] = {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": 8},
                         "task": {"kind": "pretrain", "seq_len": 2048, "global_batch": 64}}
FIT = {"runs": 3, "sources": ["test"], "fitted": ["gemm_eff"], "in_sample_median_err": 0.05, "method": "test"}
ENTRY = {"gpu": "h100-sxm", "framework": "megatron-core", "gemm_eff": 0.7, "fit": FIT}


# ------------------------------------------------------------------------------------------ reading files


def test_special_files_are_refused_without_reading_them(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO for reading would block until a writer comes: never opened
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    cases = {tmp_path / "fifo": "a FIFO", tmp_path / "a": "symlink loop", tmp_path: "a directory",
             Path("/dev/zero"): "a character device", tmp_path / "missing.yaml": "not found"}
    for path, words in cases.items():
        with pytest.raises(ProblemError, match=words) as err:
            read_input_bytes(path, what="problem file", file=str(path))
        assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_symlink_chain_is_followed_and_the_cap_holds_on_bytes_read(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("model: llama2-7b\n")
    (tmp_path / "l1").symlink_to(tmp_path / "p.yaml")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    assert read_yaml(tmp_path / "l2") == {"model": "llama2-7b"}
    with pytest.raises(ProblemError, match="at most 4"):
        read_input_bytes(tmp_path / "l2", what="f", file="f", max_bytes=4)  # 17 bytes on a 4-byte cap
    proc = Path("/proc/self/status")  # a regular file whose st_size is 0: only the bytes read can enforce the cap
    if proc.is_file() and proc.stat().st_size == 0:
        with pytest.raises(ProblemError, match="more than 10 bytes"):
            read_input_bytes(proc, what="f", file="f", max_bytes=10)
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ProblemError, match=f"{MAX_FILE_BYTES + 1:,} bytes"):
        read_yaml(big)


def test_every_input_kind_goes_through_the_reader(tmp_path: Path) -> None:
    """A FIFO as the problem, a plan, an hf_config, an overlay and a fleet job's problem: one line, exit 2."""
    os.mkfifo(tmp_path / "fifo")
    good = tmp_path / "p.yaml"
    good.write_text(yaml.safe_dump(TRAIN))
    for name, data in {"hf": TRAIN | {"model": {"hf_config": "fifo"}}, "ov": TRAIN | {"calibration": "fifo"}}.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
        assert_one_line_error(run_main("solve", tmp_path / f"{name}.yaml"), 2, "FIFO")
    assert_one_line_error(run_main("solve", tmp_path / "fifo"), 2, "FIFO", str(tmp_path / "fifo"))
    assert_one_line_error(run_main("evaluate", good, "--plan", tmp_path / "fifo"), 2, "FIFO")
    fleet = {"objective": "throughput", "systems": {"h": {"system": "dgx-h100", "gpus": 64, "sizes": [8]}},
             "jobs": {"a": {"problem": "fifo", "train_tokens": 1.0e9, "deadline_h": 720}}}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    assert_one_line_error(run_main("fleet", tmp_path / "fleet.yaml"), 2, "FIFO")


def test_a_two_megabyte_value_gives_a_short_error_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(TRAIN | {"model": "x" * 2_000_000}))
    line = assert_one_line_error(run_main("solve", path), 2, "unknown model", "2,000,002 characters")
    assert len(line) < 2_000  # the value is cut at 200 characters; the catalog's names follow


# ------------------------------------------------------------------------------------------ overlays


def _with_overlay(tmp_path: Path, entries: list[dict[str, Any]], problem: dict[str, Any] = TRAIN) -> Path:
    (tmp_path / "ov.yaml").write_text(yaml.safe_dump({"kind": "madmax-opt calibration overlay",
                                                      "calibrations": entries}))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(problem | {"calibration": "ov.yaml"}))
    return path


@pytest.mark.parametrize(("entries", "problem", "field", "words"), [
    ([ENTRY, ENTRY | {"gemm_eff": 0.5}], TRAIN, "calibrations[1]", "listed twice"),
    ([ENTRY | {"gpu": "no-such-gpu"}], TRAIN, "calibrations[0].gpu", "unknown gpu"),
    ([ENTRY | {"layer_overhead_s": 1e9}], TRAIN, "calibrations[0].layer_overhead_s", "0 to 0.1 s"),
    ([ENTRY | {"gpu": "a100-80gb"}], TRAIN, "calibration", "no entry applies"),
    ([ENTRY], TRAIN | {"stack": {"framework": "torchtitan"}}, "calibration", "no entry applies"),
    ([ENTRY], {"model": "llama2-7b", "hardware": {"gpu": "h100-sxm", "gpus": 8},
               "task": {"kind": "inference", "prompt_len": 512, "output_len": 128}}, "calibration", "serving"),
])
def test_overlays_that_cannot_apply_are_refused_by_field(tmp_path: Path, entries: list[dict[str, Any]],
                                                         problem: dict[str, Any], field: str, words: str) -> None:
    assert_one_line_error(run_main("solve", _with_overlay(tmp_path, entries, problem)), 2, f": {field}: ", words)


def test_overlay_entries_for_other_gpus_warn_once_and_the_rest_applies(tmp_path: Path) -> None:
    path = _with_overlay(tmp_path, [ENTRY, ENTRY | {"gpu": "a100-80gb"}])
    with pytest.warns(InputWarning, match=r"1 overlay entry not used .*\(a100-80gb, megatron-core\)"):
        problem = problem_from_dict(yaml.safe_load(path.read_text()), source=str(path))
    # the h100 entry applies: on a catalog GPU the fitted value is the overlay's own (io/calibration.py)
    assert problem.hardware[0].gpu.calibration.gemm_eff >= 0.7


# ------------------------------------------------------------------------------------------ report's sweep folder


def _folder(tmp_path: Path, manifest: Any, rows: list[Any]) -> Path:
    (tmp_path / "sweep.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _row() -> dict[str, Any]:
    plan = {"dp": 8, "tp": 1, "pp": 1, "mbs": 1, "zero": 1, "recompute": "none"}
    best = {"plan": plan, "tokens_per_s": 1.0e5, "step_time_s": 1.3, "mfu": 0.4, "cost_per_hour_usd": 20.0,
            "usd_per_million_tokens": 0.05, "memory_bytes_per_gpu": {"total": 5.0e10}, "model_flops_per_step": 2e18}
    comb = {"model": "llama2-7b", "task": 0, "system": "dgx-h100", "gpu": "h100-sxm", "gpus": 8,
            "objective": "throughput", "power_w_per_gpu": 1000.0}
    return {"key": "k1", "combination": comb, "status": "ok", "result": {"status": "optimal", "best": best},
            "error": None}


def test_a_sound_folder_loads_and_a_torn_line_is_counted(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"keys": ["k1", "k2"]}, [_row()])
    with (folder / "results.jsonl").open("a") as f:
        f.write("{not json\n")
    manifest, rows, damaged = load_folder(folder)
    assert [r["key"] for r in rows] == ["k1"] and damaged == 1 and manifest["keys"] == ["k1", "k2"]


def _damaged(row: dict[str, Any], *path_value: Any) -> dict[str, Any]:
    *path, value = path_value
    node = row
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return row


@pytest.mark.parametrize(("manifest", "change", "where", "words"), [
    ("{}", None, "sweep.json: keys", "required key missing"),
    ("[]", None, "sweep.json", "a JSON list"),
    ('{"keys": ["k1"', None, "sweep.json", "malformed JSON"),
    ({"keys": 5}, None, "sweep.json: keys", "wrong type"),
    ({"keys": ["k1"]}, ("result", "best", "tokens_per_s", "fast"), "line 1: result.best.tokens_per_s", "wrong type"),
    ({"keys": ["k1"]}, ("result", "best", "tokens_per_s", 0), "line 1: result.best.tokens_per_s", "greater than 0"),
    ({"keys": ["k1"]}, ("result", "best", "plan", KeyError), "line 1: result.best.plan", "required key missing"),
    ({"keys": ["k1"]}, ("result", None), "line 1", "status ok needs a result"),
    ({"keys": ["k1"]}, ("combination", "gpus", "many"), "line 1: combination.gpus", "wrong type"),
    ({"keys": ["k1"]}, ("status", "weird"), "line 1: status", "unknown value"),
])
def test_a_damaged_sweep_folder_is_one_line_naming_file_line_and_field(
        tmp_path: Path, manifest: Any, change: tuple[Any, ...] | None, where: str, words: str) -> None:
    row = _row() if change is None else _damaged(_row(), *change)
    folder = _folder(tmp_path, manifest, [row])
    assert_one_line_error(run_main("report", folder), 2, where, words)


# ------------------------------------------------------------------------------------------ other items


def test_sensitivity_factors_are_bounded_before_any_solve() -> None:
    low, high = FACTOR_RANGE
    check_study(["gemm_efficiency"], [low, 1.0, high])
    for factors in ([1e308], [0.0], [-1.0], [math.nan], [math.inf], [low / 2], [2.0, 2.0],
                    [1.0 + i / 100 for i in range(MAX_FACTORS + 1)]):
        with pytest.raises(ProblemError, match="--factors"):
            check_study(["gemm_efficiency"], factors)
    with pytest.raises(ProblemError, match="listed twice"):
        check_study(["gemm_efficiency", "gemm_efficiency"], [2.0])


MIXTRAL_CONFIG = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "vocab_size": 32000, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
DEEPSEEK_CONFIG = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                   "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                   "num_experts_per_tok": 8, "num_attention_heads": 128, "num_hidden_layers": 61,
                   "num_key_value_heads": 128, "vocab_size": 129280, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                   "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128, "tie_word_embeddings": False}


@pytest.mark.parametrize(("config", "name"), [(MIXTRAL_CONFIG, "mixtral-8x7b"), (DEEPSEEK_CONFIG, "deepseek-v3")])
def test_moe_hf_configs_import_as_the_catalog_models(tmp_path: Path, config: dict[str, Any], name: str) -> None:
    """The catalog entries were written from the papers (models.yaml sources); the import must agree on shape."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = problem_from_dict(TRAIN | {"model": {"hf_config": "config.json"}}, source=str(tmp_path / "p.yaml")).model
    ref = catalog.models()[name]
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "ffn_kind", "mla"):
        assert getattr(model, field) == getattr(ref, field), field
    assert model.moe is not None and ref.moe is not None
    assert (model.moe.num_experts, model.moe.top_k, model.moe.expert_ffn, model.moe.shared_experts) == (
        ref.moe.num_experts, ref.moe.top_k, ref.moe.expert_ffn, ref.moe.shared_experts)


def test_a_moe_config_without_top_k_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in MIXTRAL_CONFIG.items()
                                                      if k != "num_experts_per_tok"}))
    with pytest.raises(ProblemError, match="num_local_experts = 8 but no num_experts_per_tok"):
        problem_from_dict(TRAIN | {"model": {"hf_config": "config.json"}}, source=str(tmp_path / "p.yaml"))


def test_training_with_a_serving_engine_and_unsplittable_ep_are_refused() -> None:
    with pytest.raises(ProblemError, match=r"stack\.framework: vllm is a serving engine"):
        problem_from_dict(TRAIN | {"stack": {"framework": "vllm"}})
    with pytest.raises(ProblemError, match=r"space\.ep: ep 3 does not divide deepseek-v3's 256 experts"):
        problem_from_dict(TRAIN | {"model": "deepseek-v3", "space": {"ep": [3]}})
    with pytest.raises(ProblemError, match=r"space\.ep: .*dense"):
        problem_from_dict(TRAIN | {"space": {"ep": [1, 2]}})


def test_top_k_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(TRAIN))
    assert_one_line_error(run_main("solve", path, "--top-k", "100000000"), 2, "--top-k", "1000")


def test_numpy_warnings_reach_stderr_as_one_line_and_input_warnings_once() -> None:
    import warnings

    import numpy as np

    from madmax_opt.cli.app import app

    def noisy() -> None:
        with np.errstate(all="warn"):
            print(np.float64(1e308) * np.float64(10.0), np.float64(1.0) / np.float64(0.0))
        for _ in range(3):
            warnings.warn("overlay entry not used", InputWarning, stacklevel=1)

    app.command("zz-noisy", hidden=True)(noisy)
    try:
        result = run_main("zz-noisy")
    finally:
        app.registered_commands.pop()
    assert result.returncode == 0 and result.stdout.split() == ["inf", "inf"]
    lines = result.stderr.splitlines()
    assert lines[0] == "warning: overlay entry not used" and len(lines) == 2, result.stderr
    assert lines[1].startswith("warning: 2 numerical warning(s) held back, first: overflow"), lines[1]


def test_a_resumed_sweep_drops_rows_of_the_wrong_shape(tmp_path: Path) -> None:
    from madmax_opt.studies.sweep_results import read_rows

    bad = _row() | {"key": "k2"}
    del bad["status"]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(bad) + "\n" + json.dumps([1, 2]) + "\n")
    assert list(read_rows(path, repair=True)) == ["k1"]
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["k1"]  # rewritten: k2 re-solved
