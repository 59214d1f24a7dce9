"""Plan, launch, measure, calibrate, plan again: exactly the commands of docs/launch.md on the shipped example, and
the --benchmark additions of every format."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from cli_helpers import run_main
from madmax_opt.io.problem import load_problem
from madmax_opt.launch.benchmark import with_flags
from madmax_opt.studies import calibrate as C
from madmax_opt.studies import fit as F

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "launch.md"
EXAMPLE = ROOT / "docs" / "examples" / "loop"


def _doc_commands() -> list[list[str]]:
    text = DOC.read_text()
    block = text.split("## Plan, launch, measure, calibrate, plan again", 1)[1].split("```bash", 1)[1].split("```")[0]
    return [line.split("#")[0].split() for line in block.strip().splitlines() if line.split("#")[0].strip()]


def test_the_documented_loop_runs_on_the_shipped_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("docs",):  # the commands name repository paths: run them from a copy of what they read
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    commands = _doc_commands()
    assert [c[:2] for c in commands] == [["madmax-opt", "solve"], ["bash", "run/measure.sh"], ["cp", "docs/examples/"
                                         "loop/plan-0.log"], ["cp", "docs/examples/loop/plan-1.log"],
                                         ["madmax-opt", "calibrate"], ["madmax-opt", "solve"]]
    outputs = []
    for argv in commands:
        if argv[0] == "bash":  # the cluster run; the shipped logs stand in for its output
            continue
        if argv[0] == "cp":
            shutil.copyfile(argv[1], argv[2])
            continue
        r = run_main(*argv[1:], *(["--json"] if argv[1] in ("calibrate", "solve") else []))
        assert r.returncode == 0, r.stderr
        outputs.append(r)
    written = {line.removeprefix("wrote ") for line in outputs[0].stderr.splitlines() if line.startswith("wrote ")}
    for name in ("run/runs.yaml", "run/measure.sh", "run/llama3-8b-h100-calibrated.yaml", "run/plan-0/launch.sh",
                 "run/plan-1/launch.sh"):
        assert name in written
    first = json.loads(outputs[0].stdout)
    launch = Path("run/plan-0/launch.sh").read_text()
    assert re.search(r"--train-iters 12 --log-interval 1 --log-throughput --eval-iters 0", launch)
    assert "(cd plan-0 && bash ./launch.sh 2>&1 | tee train.log)" in Path("run/measure.sh").read_text()
    # runs.yaml: the two returned plans, measured by their logs
    runs = yaml.safe_load(Path("run/runs.yaml").read_text())["runs"]
    top = [{k: v for k, v in t["plan"].items() if k in r["plan"]} for t, r in zip(first["top"], runs, strict=True)]
    assert [r["plan"] for r in runs] == top and [r["measured"]["log"] for r in runs] == ["plan-0/train.log",
                                                                                         "plan-1/train.log"]
    # calibrate: medians of iterations 2..12 of the shipped logs, by hand (sorted, the 6th of 11)
    cal = json.loads(outputs[1].stdout)["calibrations"][0]
    assert [x["measured_s"] for x in cal["runs"]] == pytest.approx([14.4112, 15.3075], rel=1e-12)
    # the fitted gemm_eff is the grid value that minimises the objective (brute force over the grid, from the
    # calibration that priced the pair before)
    fitted_runs, _ = C.read_runs(Path("run/runs.yaml"))
    base = load_problem(Path("docs/examples/loop/llama3-8b-h100.yaml")).hardware[0].gpu.calibration
    bases = {"h100-sxm": base}
    grid = [{"gemm_eff": v / base.gemm_eff} for v in F.FIT_GRID["gemm_eff"]]
    measured = np.array([r.measured_s for r in fitted_runs])
    loss = np.mean(np.abs(np.log(F.predict_scaled(fitted_runs, grid, bases) / measured[:, None])), axis=0)
    loss += np.array([F.factor_penalty(g) for g in grid])
    assert cal["fit"]["fitted"] == ["gemm_eff"]
    assert cal["gemm_eff"] == F.FIT_GRID["gemm_eff"][int(np.argmin(loss))]
    # plan again: the problem the tool wrote, priced with the overlay; plan-0 at its fitted prediction
    again = json.loads(outputs[2].stdout)
    plan0 = C.read_runs(Path("run/runs.yaml"))[0][0].plan
    rec = next(t for t in again["top"] if all(t["plan"][k] == v for k, v in plan0.model_dump().items()
                                              if k in ("dp", "tp", "pp", "cp", "zero", "mbs", "recompute")))
    assert rec["step_time_s"] == pytest.approx(14.4112 * (1 + cal["runs"][0]["after_err"]), rel=1e-9)
    assert rec["calibration"]["status"] == "calibrated" and rec["calibration"]["runs"] == 2


def test_with_flags_replaces_or_appends() -> None:
    assert with_flags(["--train-iters", "500", "--bf16"], [("--train-iters", "12"), ("--log-throughput", None)]) == [
        "--train-iters", "12", "--bf16", "--log-throughput"]
    assert with_flags(["train.train_iters=9", "x=1"], [("train.train_iters", "12"), ("logger.log_interval", "1")]) == [
        "train.train_iters=12", "x=1", "logger.log_interval=1"]


@pytest.mark.parametrize(("fmt", "expect"), [
    ("nemo", "train.train_iters=5 logger.log_interval=1 logger.log_throughput=true validation.eval_iters=0"),
    ("deepspeed", "--train-iters 5 --log-interval 1 --eval-iters 0"),
])
def test_emit_benchmark_training_formats(tmp_path: Path, fmt: str, expect: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 4, "tp": 2, "sp": True, "mbs": 1, "zero": 1, "recompute": "selective"}))
    problem = EXAMPLE / "llama3-8b-h100.yaml"
    r = run_main("emit", problem, fmt, "--plan", plan, "--benchmark", "5", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert expect in (tmp_path / "run" / "launch.sh").read_text()
    runs = yaml.safe_load((tmp_path / "run" / "runs.yaml").read_text())["runs"]
    assert runs[0]["plan"] == {"dp": 4, "tp": 2, "sp": True, "zero": 1, "recompute": "selective"}
    assert runs[0]["measured"] == {"log": "train.log", "skip": 1}


@pytest.mark.parametrize(("fmt", "client"), [
    ("vllm", "vllm bench serve --backend vllm --base-url http://127.0.0.1:8000"),
    ("sglang", "python -m sglang.bench_serving --backend sglang --base-url http://127.0.0.1:30000"),
])
def test_emit_benchmark_serving_client(tmp_path: Path, fmt: str, client: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 2, "tp": 4, "batch": 64}))
    r = run_main("emit", ROOT / "problems" / "serve-llama3-70b.yaml", fmt, "--plan", plan, "--benchmark", "5",
                 "--out", tmp_path / "run", "--force")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "run" / "benchmark.sh").read_text()
    assert client in script
    # the problem's 1024 + 256 tokens; concurrency = 64 per replica x 2 replicas through one endpoint
    assert "--random-input-len 1024 --random-output-len 256" in script
    assert "--max-concurrency 128 --num-prompts 1280" in script


@pytest.mark.parametrize(("args", "message"), [
    (["--benchmark", "5"], "--benchmark: --benchmark needs --out DIR"),
    (["--benchmark", "2", "--out", "x"], "--benchmark: 2 iterations; allowed: 3 to 10,000"),
])
def test_benchmark_options_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 8, "zero": 2}))
    r = run_main("emit", EXAMPLE / "llama3-8b-h100.yaml", "megatron", "--plan", plan, *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_benchmark_clients_of_replicas_and_disaggregation(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 2, "tp": 4, "batch": 64}))
    r = run_main("emit", ROOT / "problems" / "serve-llama3-70b.yaml", "trtllm", "--plan", plan, "--benchmark", "5",
                 "--out", tmp_path / "t", "--force")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "t" / "benchmark.sh").read_text()  # no router: one client per replica, 64 each
    for port, result in ((8000, "bench-0.json"), (8001, "bench-1.json")):
        assert (f"--backend openai --base-url http://127.0.0.1:{port} --model meta-llama/Meta-Llama-3-70B" in script
                and f"--max-concurrency 64 --num-prompts 640 --save-result --result-filename {result} &" in script)
    problem = tmp_path / "pd.yaml"
    problem.write_text(yaml.safe_dump({"model": "llama2-70b", "hardware": {"gpu": "h100-sxm", "gpus": 16},
                                       "task": {"kind": "inference", "prompt_len": 3840, "output_len": 256,
                                                "disaggregated": True}}))  # within Llama-2's 4096 context
    plan.write_text(yaml.safe_dump({"dp": 4, "tp": 4, "batch": 32, "prefill_replicas": 1}))
    r = run_main("emit", problem, "vllm", "--plan", plan, "--benchmark", "5", "--out", tmp_path / "v", "--force")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "v" / "benchmark.sh").read_text()  # 3 decode replicas x 32; through the proxy
    assert "--base-url $PROXY_URL" in script and "--max-concurrency 96 --num-prompts 960" in script
    mix = ROOT / "problems" / "serve-llama2-70b-disaggregated.yaml"
    r = run_main("solve", mix, "--emit", "vllm", "--benchmark", "5", "--out", tmp_path / "m")
    assert r.returncode == 2 and "task.mix: a request mix has no single length" in r.stderr
    assert not (tmp_path / "m").exists()  # refused before the search


def test_measure_sh_runs_several_nodes_through_slurm(tmp_path: Path) -> None:
    problem = tmp_path / "p.yaml"
    problem.write_text(yaml.safe_dump({"model": "llama3-8b", "hardware": {"system": "dgx-h100", "gpus": 16},
                                       "task": {"kind": "pretrain", "seq_len": 8192, "global_batch": 128}}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"dp": 16, "mbs": 1, "zero": 1, "recompute": "full"}))
    r = run_main("emit", problem, "megatron", "--plan", plan, "--benchmark", "5", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    measure = (tmp_path / "run" / "measure.sh").read_text()  # 16 GPUs = 2 DGX nodes: every node's output in one log
    assert "(cd . && sbatch --wait --output=train.log launch.sbatch)" in measure
