"""``--benchmark N``: an emitted launch turned into a short measured run, and the files that take its output back
to ``madmax-opt calibrate`` and to a re-solve (plan, launch, measure, calibrate, plan again).

Training: N iterations with a timing line each, flags read at the versions data/flags/ pins:

- Megatron-LM core_v0.19.0 (megatron/training/config/training_config.py, flags derived from the dataclass fields):
  ``--train-iters N --log-interval 1 --log-throughput --eval-iters 0``; Megatron-DeepSpeed 4efb479
  (megatron/arguments.py): ``--train-iters N --log-interval 1 --eval-iters 0``.
- Megatron-Bridge 067f987 (src/megatron/bridge/training/config.py, ConfigContainer ``train`` / ``logger`` /
  ``validation``): ``train.train_iters=N logger.log_interval=1 logger.log_throughput=true validation.eval_iters=0``.
- torchtitan v0.2.2 (torchtitan/config/job_config.py ``Training.steps``, ``Metrics.log_freq``; command-line
  overrides of the TOML): ``--training.steps N --metrics.log_freq 1``.

``measure.sh`` runs each plan's ``launch.sh`` with its output kept in ``train.log`` (on several nodes ``sbatch --wait
--output=train.log launch.sbatch``: every node's output in one file, since Megatron prints the line on the last rank
and torchtitan on rank 0), ``runs.yaml`` lists
each plan as a run of calibrate's minimal schema whose measurement is that log, and ``<problem>-calibrated.yaml``
is the problem naming the overlay calibrate writes (``calibration: cluster.yaml``).

Serving: ``benchmark.sh`` waits for the endpoint and runs the benchmark client at the problem's lengths (fixed,
EOS ignored) and the plan's concurrency (batch x replicas), 10 requests per concurrent slot, writing the result
JSON that io/run_logs reads: ``vllm bench serve`` (vllm/benchmarks/serve.py: ``--dataset-name random
--random-input-len --random-output-len --random-range-ratio 0 --ignore-eos --max-concurrency --num-prompts
--save-result --result-filename``) for vLLM and TensorRT-LLM (``--backend openai``, its OpenAI server), and
``python -m sglang.bench_serving`` (``--random-range-ratio 1`` is fixed lengths there; ``--output-file``) for SGLang.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.launch.common import Command, Emitted
from madmax_opt.model.family_name import serving_task
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import InferenceTask, Plan, Task
from madmax_opt.search.family import family_of

MIN_ITERATIONS = 3  # calibrate leaves out the first iteration (warm-up) and takes the median of the rest
MAX_ITERATIONS = 10_000
REQUESTS_PER_SLOT = 10  # benchmark requests per concurrent request: the steady state outweighs ramp-up and tail
LOG = "train.log"
RUNS = "runs.yaml"
MEASURE = "measure.sh"
CLIENT = "benchmark.sh"
RESULT = "bench.json"
OVERLAY = "cluster.yaml"


def _iteration_flags(fmt: str, n: int) -> list[tuple[str, str | None]]:
    """(flag or override key, value; None = a bare flag) that make ``fmt`` run n iterations, each logged."""
    if fmt == "megatron":
        return [("--train-iters", str(n)), ("--log-interval", "1"), ("--log-throughput", None), ("--eval-iters", "0")]
    if fmt == "deepspeed":
        return [("--train-iters", str(n)), ("--log-interval", "1"), ("--eval-iters", "0")]
    if fmt == "nemo":
        return [("train.train_iters", str(n)), ("logger.log_interval", "1"), ("logger.log_throughput", "true"),
                ("validation.eval_iters", "0")]
    if fmt == "torchtitan":
        return [("--training.steps", str(n)), ("--metrics.log_freq", "1")]
    raise ProblemError(f"{fmt} has no training benchmark; allowed: megatron, nemo, torchtitan, deepspeed",
                       field="--benchmark")


def with_flags(args: list[str], flags: list[tuple[str, str | None]]) -> list[str]:
    """``args`` with each flag set: an existing ``--flag VALUE`` / ``key=VALUE`` replaced in place, else appended."""
    out = list(args)
    for flag, value in flags:
        if not flag.startswith("-"):  # a KEY=VALUE override
            item = f"{flag}={value}"
            at = [i for i, a in enumerate(out) if a.split("=", 1)[0] == flag]
            out = [item if i in at else a for i, a in enumerate(out)] if at else [*out, item]
        elif flag in out:
            i = out.index(flag)
            if value is not None:
                out[i + 1] = value
        else:
            out += [flag] if value is None else [flag, value]
    return out


def check_iterations(n: int) -> None:
    if not MIN_ITERATIONS <= n <= MAX_ITERATIONS:
        raise ProblemError(f"{n} iterations; allowed: {MIN_ITERATIONS} to {MAX_ITERATIONS:,} (calibrate drops the "
                           "first as warm-up)", field="--benchmark")


def benchmark_emitted(emitted: Emitted, problem: Problem, plan: Plan, n: int) -> Emitted:
    """The emitted launch as a measured run: n logged training iterations, or a serving client script."""
    check_iterations(n)
    if family_of(problem).serving:
        return emitted.model_copy(update={"files": {**emitted.files, CLIENT: client_script(emitted, problem, plan)},
                                          "notes": [*emitted.notes, f"benchmark: start launch.sh, then run "
                                                    f"{CLIENT}: it writes {RESULT} (benchmark-serving result JSON)"]})
    flags = _iteration_flags(emitted.format, n)
    commands = [c.model_copy(update={"args": with_flags(c.args, flags)}) if c.role == "run" else c
                for c in emitted.commands]
    note = (f"benchmark: {n} iterations, each logged; measure.sh keeps the output in {LOG} for madmax-opt calibrate "
            "(the median step after the first)")
    return emitted.model_copy(update={"commands": commands, "notes": [*emitted.notes, note]})


# ------------------------------------------------------------------------------------------------- serving


def _port(c: Command) -> str | None:
    if "--port" in c.args and c.args.index("--port") + 1 < len(c.args):
        return c.args[c.args.index("--port") + 1]
    return None


def endpoints(emitted: Emitted) -> list[str]:
    """Base URLs the client sends to: the router when there is one, else every server (one per replica)."""
    router = [c for c in emitted.commands if c.role == "router" and _port(c)]
    if router:
        return [f"http://127.0.0.1:{_port(router[0])}"]
    if any(c.role == "prefill" for c in emitted.commands):  # vLLM disaggregation: the proxy the notes ask for
        return ["${PROXY_URL:?set PROXY_URL to the disaggregation proxy in front of the prefill and decode servers}"]
    urls = [re.sub(r"/health$", "", c.ready) for c in emitted.commands if c.ready and c.role != "prefill"]
    if not urls:
        raise ProblemError(f"{emitted.format}: no server endpoint to benchmark", field="--benchmark")
    return urls


def client_script(emitted: Emitted, problem: Problem, plan: Plan) -> str:
    """``benchmark.sh``: wait for each endpoint, then one client per endpoint at its share of the concurrency."""
    task = problem.serving_task
    if task.prompt_len is None or task.output_len is None:
        raise ProblemError("a request mix has no single length to benchmark; allowed: prompt_len and output_len",
                           file=problem.source, field="task.mix")
    batch = getattr(plan, "batch", None) or 1
    urls = endpoints(emitted)
    total = batch * (plan.dp - (getattr(plan, "prefill_replicas", 0) or 0))  # decode replicas hold the batch
    per = max(1, total // len(urls))
    model = next((c.program[-1] for c in emitted.commands  # the checkpoint the server loads
                  if c.program[:2] == ["vllm", "serve"] or c.program[:1] == ["trtllm-serve"]), None)
    model = model or next((c.args[c.args.index("--model-path") + 1] for c in emitted.commands
                           if "--model-path" in c.args), None) or problem.model.name
    lines = ["#!/usr/bin/env bash", "set -euo pipefail",
             f"# benchmark client: {task.prompt_len} prompt + {task.output_len} generated tokens, concurrency {per} "
             f"per endpoint ({len(urls)} endpoint(s)), {REQUESTS_PER_SLOT * per} requests each"]
    for i, url in enumerate(urls):
        result = RESULT if len(urls) == 1 else f"bench-{i}.json"
        if emitted.format == "sglang":
            argv = ["python", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
                    "--dataset-name", "random", "--random-input-len", str(task.prompt_len), "--random-output-len",
                    str(task.output_len), "--random-range-ratio", "1", "--max-concurrency", str(per),
                    "--num-prompts", str(REQUESTS_PER_SLOT * per), "--output-file", result]
        else:
            backend = "vllm" if emitted.format == "vllm" else "openai"
            argv = ["vllm", "bench", "serve", "--backend", backend, "--base-url", url, "--model", model,
                    "--dataset-name", "random", "--random-input-len", str(task.prompt_len), "--random-output-len",
                    str(task.output_len), "--random-range-ratio", "0", "--ignore-eos", "--max-concurrency",
                    str(per), "--num-prompts", str(REQUESTS_PER_SLOT * per), "--save-result", "--result-filename",
                    result]
        if not url.startswith("${PROXY_URL"):
            lines.append(f"until curl -sf {url}/health > /dev/null; do sleep 5; done")
        else:  # expanded by the shell (unquoted), failing with its message when PROXY_URL is unset
            argv = [a if a != url else "$PROXY_URL" for a in argv]
            lines.append(f': "{url}"')
        lines.append(Command(program=argv[:1], args=argv[1:]).shell() + (" &" if len(urls) > 1 else ""))
    if len(urls) > 1:
        lines.append("wait")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ training


def _run_entry(raw: dict[str, Any], problem: Problem, plan: Plan, log: str, name: str) -> dict[str, Any]:
    """One run of calibrate's minimal schema: the problem's model, task and stack, the plan's hardware option."""
    option = problem.hardware[problem.hw_index(plan)]
    task = {k: v for k, v in dict(raw.get("task") or {}).items() if k != "precision"}
    stack = {k: v for k, v in dict(raw.get("stack") or {}).items() if k != "framework"}
    entry: dict[str, Any] = {
        "name": name, "model": raw["model"], "hardware": {"system": option.system.name, "gpus": option.gpus},
        "task": task, "precision": problem.training_task.precision, "framework": problem.stack.framework,
    }
    if stack:
        entry["stack"] = stack
    entry["plan"] = plan.model_dump(mode="json", exclude_defaults=True, exclude={"system"})
    entry["measured"] = {"log": log, "skip": 1}
    return entry


def loop_files(problem_file: Path, raw: Any, problem: Problem, plans: list[Plan], dirs: list[str]) -> dict[str, str]:
    """measure.sh, runs.yaml and the calibrated problem for the plans emitted into ``dirs`` (relative to the
    folder these files go to); ``raw``: the problem file as read (the CLI reads it; launch reads no files)."""
    if not isinstance(raw, dict) or "model" not in raw:
        raise ProblemError("expected a problem mapping with model", file=str(problem_file))
    runs = [_run_entry(raw, problem, p, f"{d}/{LOG}" if d != "." else LOG, f"plan-{i}" if d != "." else "plan")
            for i, (p, d) in enumerate(zip(plans, dirs, strict=True))]
    header = (f"# written by madmax-opt --benchmark for {problem_file}: run measure.sh, then\n"
              f"#   madmax-opt calibrate {RUNS} --out {OVERLAY}\n")
    measure = ["#!/usr/bin/env bash", "set -euo pipefail", 'cd "$(dirname "$0")"']
    for plan, d in zip(plans, dirs, strict=True):  # one node: launch.sh here; more: the Slurm script, all nodes'
        option = problem.hardware[problem.hw_index(plan)]  # output in one file (the timing line is on one rank)
        if option.gpus > option.system.gpus_per_node:
            measure.append(f"(cd {shlex.quote(d)} && sbatch --wait --output={LOG} launch.sbatch)")
        else:
            measure.append(f"(cd {shlex.quote(d)} && bash ./launch.sh 2>&1 | tee {LOG})")
    measure += [f"madmax-opt calibrate {RUNS} --out {OVERLAY}"]
    again = {k: v for k, v in raw.items() if k != "calibration"}
    again["calibration"] = OVERLAY
    for key in ("hf_config",):  # paths in a problem are relative to its file: keep them pointing there
        if isinstance(again.get("model"), dict) and key in again["model"]:
            again["model"] = {**again["model"], key: str((problem_file.parent / again["model"][key]).resolve())}
    calibrated = (f"# {problem_file} priced with the overlay madmax-opt calibrate writes from {RUNS}\n"
                  + yaml.safe_dump(again, sort_keys=False, width=110))
    return {RUNS: header + yaml.safe_dump({"runs": runs}, sort_keys=False, width=110),
            MEASURE: "\n".join(measure) + "\n", f"{problem_file.stem}-calibrated.yaml": calibrated}


def write_loop_files(files: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            path.chmod(0o755)
        paths.append(path)
    return paths


def benchmark_plans(problem_file: Path, raw: Any, problem: Problem, records: list[dict[str, Any]], fmt: str,
                    out: Path, n: int) -> list[Path]:
    """``solve --emit FMT --benchmark N --out DIR``: every returned plan FMT can express, as a measured run in
    DIR/plan-i, plus (training) measure.sh, runs.yaml and the calibrated problem in DIR; the paths written."""
    from madmax_opt.launch.emit import emit_plan, plan_of_record, write_emitted

    check_iterations(n)
    plans: list[Plan] = []
    dirs: list[str] = []
    paths: list[Path] = []
    for record in records:
        plan = plan_of_record(problem, record["plan"])
        try:
            emitted = emit_plan(problem, plan, fmt)
        except ProblemError:  # solve --emit reports why; the benchmark measures the plans FMT can run
            continue
        d = f"plan-{len(plans)}"
        paths += write_emitted(benchmark_emitted(emitted, problem, plan, n), out / d)
        plans.append(plan)
        dirs.append(d)
    if plans and not family_of(problem).serving:
        paths += write_loop_files(loop_files(problem_file, raw, problem, plans, dirs), out)
    return paths


def check_benchmark_options(n: int, fmt: str | None, out: Path | None, task: Task | InferenceTask | None = None,
                            problem_file: Path | None = None) -> None:
    """--benchmark needs a format and --out (the files it writes are the point), and 3..10,000 iterations; a
    serving problem's requests need one length (a mix has no single benchmark client), checked before the search."""
    check_iterations(n)
    serve = serving_task(task) if task is not None else None
    if serve is not None and (serve.prompt_len is None or serve.output_len is None):
        raise ProblemError("a request mix has no single length to benchmark; allowed: --benchmark with "
                           "prompt_len and output_len (benchmark a mix one shape at a time)",
                           file=str(problem_file), field="task.mix")
    if fmt is None:
        raise ProblemError("--benchmark needs --emit FORMAT; allowed: --emit with --out", field="--benchmark")
    if out is None:
        raise ProblemError("--benchmark needs --out DIR (it writes the launch, measure.sh and runs.yaml there)",
                           field="--benchmark")
