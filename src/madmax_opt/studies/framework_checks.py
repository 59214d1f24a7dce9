"""The frameworks' own parsers and start-up checks run on emitted configurations (issue 21, "start-up conformance").

Each checker takes one emitted configuration (the JSON of ``launch.common.Emitted``) and returns None when the
framework's own code accepts it, else the framework's message (first line). The frameworks are imported lazily
and only here: run with an interpreter where they are installed at the versions ``data/flags/`` pins, e.g.

    python -m madmax_opt.studies.launch_conformance /tmp/configs.jsonl          # the madmax-opt venv: emit
    PYTHONPATH=src:MEGATRON_LM:TORCHTITAN python -m madmax_opt.studies.framework_checks /tmp/configs.jsonl

(the second in a venv with CPU torch, triton, einops, tyro, torchdata, tensorboard, datasets and the two sources at
their pinned commits; Megatron core_v0.19.0 needs Python 3.12 for ``typing.override``, or on 3.11 a
``sitecustomize`` setting it from typing_extensions; vLLM 0.11.0 ``--no-deps`` with its pure-Python requirements).
Measured on the examples' top-5 plans: megatron 14 of 14, torchtitan 5 of 5, vllm 25 of 25, deepspeed 4 of 4
emitted configurations pass (deepspeed was 1 of 4 before the emitter exported CUDA_DEVICE_MAX_CONNECTIONS=1
with sequence parallelism).

What runs (nothing of the frameworks is copied here; file and commit cited per checker):
- megatron: Megatron-LM core_v0.19.0 (5be9626) ``megatron/training/arguments.py`` ``parse_args`` on the command's
  argv, ``validate_args`` with pretrain_gpt.py's ``args_defaults``, then ``core_transformer_config_from_args``
  (TransformerConfig.__post_init__'s checks).
- torchtitan: v0.2.2 (73a0e69) ``ConfigManager.parse_args`` on the emitted job.toml, the ``[experimental]
  custom_import`` flavor file, ``update_from_config`` of the model args, ``ParallelDims`` (its ``_validate``), the
  pipeline stage split of ``distributed/pipeline_parallel.py`` (``pipeline_llm``'s stage count checks and
  ``generate_llm_fqn_per_model_part``) and the data-parallel check of ``models/llama3/infra/parallelize.py``.
- vllm: 0.11.0 wheel (installed without its torch 2.8.0 pin): the ``vllm serve`` CLI parser, its validate and
  ``AsyncEngineArgs.from_cli_args`` (see :func:`vllm`).
- deepspeed: Megatron-DeepSpeed 4efb479 + DeepSpeed 0.19.6: parse_args + validate_args (see :func:`deepspeed`;
  its ``megatron`` package shadows Megatron-LM's: run it with its own PYTHONPATH).
- bridge: Megatron-Bridge 067f987 with Megatron-LM 2a75ac1 (its submodule pin): run_recipe.py's parser, the
  recipe, the Bridge's own override parser, ``runtime_config_update`` (pretrain's first step), then the built
  model compared with what was priced (:mod:`madmax_opt.studies.framework_checks_bridge`, which lists its stubs); 2026-12-07: 14 of
  14 emitted configurations of the examples' top-5 plans pass, 0 of 14 from the emitter before the start-up rules).
- vllm-engine: vLLM 0.11.0's ``create_engine_config`` from the catalog model's config.json, compared with what was
  priced (see :func:`vllm_engine`).
- sglang: SGLang 0.5.23 wheel: prepare_server_args, resolve_once, check_server_args (see :func:`sglang`), in a
  second venv with torch 2.14.1 + torchvision 0.29.1 (its resolution imports torchvision's compiled ops).
Measured on the examples' top-5 plans (2026-12-03): vllm-engine 15 of 15, sglang 15 of 15 (the 5 DeepSeek-V3
servers not built: no config.json from the catalog for MLA); before the context rule 10 of 25 of each failed on
requests longer than Llama-2's 4096-token context. 2026-12-07, with DeepSeek-V3's config.json: vllm 25 of 25,
vllm-engine 25 of 25, sglang 30 of 30 (the 5 DeepSeek-V3 servers pass; vLLM's 5 DeepSeek-V3 plans are refused by
the emitter). The venvs: vLLM 0.11.0 --no-deps on CPU torch 2.13 with its pure-Python requirements and ray (multi-
node replicas run on Ray); SGLang 0.5.23 --no-deps on torch 2.14.1 + torchvision 0.29.1 and the nvidia-* / cuda-*
wheels torch needs to import, transformers 5.19.0 (SGLang's pin), dill, gguf, IPython.

Stubbed, because this machine has no GPU (said in each checker): the world size and rank (``WORLD_SIZE`` from the
configuration's GPU count, rank 0), the device's compute capability (from the system's GPU generation), and the
process group (torch's fake backend for torchtitan; Megatron's argument checks run before it is created).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

# compute capability by GPU generation in the system's name (NVIDIA, "CUDA GPUs" compute capability table)
CAPABILITY = {"a100": (8, 0), "h100": (9, 0), "h200": (9, 0), "b200": (10, 0), "gb200": (10, 0)}

Checker = Callable[[dict[str, Any]], str | None]


def capability(system: str) -> tuple[int, int]:
    return next(cc for gpu, cc in sorted(CAPABILITY.items(), key=lambda kv: -len(kv[0])) if gpu in system)


@contextlib.contextmanager
def environment(env: dict[str, str], argv: list[str]) -> Iterator[None]:
    """``os.environ`` holding exactly the launch's variables for the names it sets (others that a framework reads,
    e.g. CUDA_DEVICE_MAX_CONNECTIONS, removed), and ``sys.argv``; both restored after."""
    names = {*env, "CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"}
    saved_env, saved_argv = {k: os.environ.get(k) for k in names}, sys.argv
    for k in names:
        os.environ.pop(k, None)
    os.environ.update(env)
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def first_line(exc: BaseException, stderr: str = "") -> str:
    """The framework's message in one line (pydantic's "N validation error for X" with the error beneath it)."""
    text = str(exc) if not isinstance(exc, SystemExit) else (stderr.strip().splitlines() or [f"exit {exc}"])[-1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or [""]
    return f"{type(exc).__name__}: {lines[0]}" + (f" {lines[1]}" if "validation error" in lines[0] and
                                                   len(lines) > 1 else "")


def guarded(check: Callable[[], None]) -> str | None:
    """Run ``check``; None if it returns, else the framework's message (argparse's from its stderr)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            check()
    except (Exception, SystemExit) as exc:  # the framework's own refusal, whatever it raises
        return first_line(exc, err.getvalue())
    return None


# -------------------------------------------------------------------------- Megatron-LM


def megatron(e: dict[str, Any]) -> str | None:
    """Megatron-LM core_v0.19.0: parse_args, validate_args, core_transformer_config_from_args (arguments.py).
    Stubbed: WORLD_SIZE = the configuration's GPUs, RANK 0; torch.cuda.get_device_capability and the major/minor
    of get_device_properties = the system's; Transformer Engine (a CUDA library) = the version Megatron's uv.lock
    pins at 5be9626 (2.17.1, line 35), with its fused RoPE kernel present."""
    from types import SimpleNamespace

    import torch

    arguments = import_module("megatron.training.arguments")
    cmd = next(c for c in e["commands"] if c["program"][-1].endswith("pretrain_gpt.py"))
    env = {**cmd["env"], "WORLD_SIZE": str(e["gpus"]), "RANK": "0", "LOCAL_RANK": "0"}
    cc = capability(e["system"])
    utils, rope = import_module("megatron.core.utils"), import_module(
        "megatron.core.models.common.embeddings.rope_utils")
    setattr(utils, "_te_version", import_module("packaging.version").Version("2.17.1"))  # noqa: B010
    setattr(rope, "fused_apply_rotary_pos_emb",  # noqa: B010
            getattr(rope, "fused_apply_rotary_pos_emb", None) or (lambda *a, **k: None))

    def check() -> None:
        with environment(env, [cmd["program"][-1], *cmd["args"]]), \
                _patched(torch.cuda, "get_device_capability", lambda *a, **k: cc), \
                _patched(torch.cuda, "get_device_properties", lambda *a, **k: SimpleNamespace(major=cc[0], minor=cc[1])):
            args = arguments.parse_args()
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's defaults
            arguments.core_transformer_config_from_args(args)

    return guarded(check)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


# -------------------------------------------------------------------------- torchtitan


def torchtitan(e: dict[str, Any]) -> str | None:
    """torchtitan v0.2.2: the steps of ``Trainer.__init__`` (torchtitan/train.py) up to the parallelized model:
    ConfigManager.parse_args on job.toml, the custom_import flavor, ParallelDims and its meshes, update_from_config,
    the model on the meta device, the batch-size checks, then ``pipelining_fn`` (pipeline_llm) or
    ``parallelize_fn`` (TP, FSDP / DDP). Stubbed: the process group is torch's fake backend (no GPUs, one
    process standing for rank 0 of ``gpus``), the device type is cpu (the model stays on meta)."""
    import tempfile

    import torch

    dist = import_module("torch.distributed")
    fake_pg = import_module("torch.testing._internal.distributed.fake_pg")
    utils = import_module("torchtitan.tools.utils")
    dims_module = import_module("torchtitan.distributed.parallel_dims")
    manager = import_module("torchtitan.config")
    spec_module = import_module("torchtitan.protocols.train_spec")
    cmd = next(c for c in e["commands"] if c["program"] == ["torchtitan.train"])

    def check() -> None:
        with tempfile.TemporaryDirectory() as d, environment({**cmd["env"], "LOCAL_RANK": "0"}, ["train"]), \
                _patched(dims_module, "device_type", "cpu"), _patched(utils, "device_type", "cpu"):
            for name, text in e["files"].items():
                Path(d, name).write_text(text, encoding="utf-8")
            sys.path.insert(0, d)
            try:
                dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=e["gpus"])
                _titan_trainer_checks(manager.ConfigManager().parse_args(
                    ["--job.config_file", str(Path(d, "job.toml"))]), dims_module, spec_module, e["gpus"], torch)
            finally:
                sys.path.remove(d)
                sys.modules.pop("madmax_flavor", None)
                if dist.is_initialized():
                    dist.destroy_process_group()

    return guarded(check)


def _titan_trainer_checks(job: Any, dims_module: Any, spec_module: Any, world: int, torch: Any) -> None:
    """Trainer.__init__'s start-up path (train.py lines 83-254 at 73a0e69), in its order, with the real calls."""
    if job.experimental.custom_import:
        import_module(job.experimental.custom_import)
    p = job.parallelism
    dims = dims_module.ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
                                    cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                                    pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
                                    etp=p.expert_tensor_parallel_degree, world_size=world)
    dims.build_mesh()
    batch_degree = dims.get_mesh("batch").size() if dims.dp_enabled else 1
    spec = spec_module.get_train_spec(job.model.name)
    model_args = spec.model_args[job.model.flavor]
    model_args.update_from_config(job)
    with torch.device("meta"):
        model = spec.model_cls(model_args)
    loss_fn = spec.build_loss_fn(job, parallel_dims=dims)
    gbs = job.training.global_batch_size
    gbs = job.training.local_batch_size * batch_degree if gbs < 0 else gbs
    if gbs <= 0 or gbs % (job.training.local_batch_size * batch_degree):  # train.py lines 199-207
        raise AssertionError(f"global batch size must be multiple of local batch size times data-parallel degree "
                             f"({gbs} % ({job.training.local_batch_size} * {batch_degree}) != 0)")
    if dims.pp_enabled:
        if not spec.pipelining_fn:
            raise RuntimeError(f"Pipeline Parallel is enabled but {job.model.name} does not support pipelining")
        spec.pipelining_fn(model, dims, job, torch.device("meta"), model_args, spec.parallelize_fn, loss_fn)
    else:
        spec.parallelize_fn(model, dims, job)


# -------------------------------------------------------------------------- vLLM


def vllm(e: dict[str, Any]) -> str | None:
    """vLLM 0.11.0 (wheel): each ``vllm serve`` command through the CLI's own parser (entrypoints/cli/main.py:
    FlexibleArgumentParser + the serve subcommand's make_arg_parser), ``ServeSubcommand.validate``
    (validate_parsed_serve_args) and ``AsyncEngineArgs.from_cli_args``. Not run: ``create_engine_config``, which reads the checkpoint's config.json
    from the hub (no network here). Stubbed: the platform's device type is cuda (vLLM finds no GPU here and its
    DeviceConfig refuses an unknown device)."""
    platform = import_module("vllm.platforms").current_platform
    platform.device_type = platform.device_type or "cuda"
    utils = import_module("vllm.utils")
    serve = import_module("vllm.entrypoints.cli.serve")
    engine_args = import_module("vllm.engine.arg_utils")
    cmds = [c for c in e["commands"] if c["program"][:2] == ["vllm", "serve"]]

    def check() -> None:
        for cmd in cmds:
            parser = utils.FlexibleArgumentParser(description="vLLM CLI")
            subparsers = parser.add_subparsers(required=False, dest="subparser")
            sub = serve.ServeSubcommand()
            sub.subparser_init(subparsers).set_defaults(dispatch_function=sub.cmd)
            with environment(cmd["env"], ["vllm"]):
                args = parser.parse_args(["serve", *cmd["program"][2:], *cmd["args"]])
                sub.validate(args)
                if getattr(args, "model_tag", None) is not None:
                    args.model = args.model_tag
                engine_args.AsyncEngineArgs.from_cli_args(args)

    return guarded(check)


# the serving node's host memory, which vLLM's CacheConfig.verify_with_parallel_config (config/cache.py) weighs the
# CPU swap space (4 GiB per TP rank) against: 2 TB (NVIDIA DGX H100 / H200 / B200 datasheets), not this machine's
HOST_MEMORY_BYTES = 2 * 1000**4
# torch dtype vLLM computes in by the priced weight precision (fp8 weights: bf16 activations, quantization fp8)
PRICED_DTYPE = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8")}


def vllm_engine(r: dict[str, Any]) -> str | None:
    """vLLM 0.11.0's ``EngineArgs.create_engine_config`` (engine/arg_utils.py) on each ``vllm serve`` command, with
    the checkpoint replaced by a local directory holding the catalog model's config.json (``r["hf_config"]``; no
    hub), then the model and parallel config vLLM built compared with what was priced (``r["priced"]``): layers,
    attention and KV heads, hidden, vocabulary, max_model_len, dtype / quantization, tp, pp, dp, and for an MLA
    model the cached latent per token and layer (vLLM's KV heads x head size under MLA). Stubbed as
    :func:`vllm`, and the host memory that the swap-space check reads is the serving node's (HOST_MEMORY_BYTES).
    Rows without a config.json are not checked here (their reason is ``hf_config_refused``)."""
    import tempfile

    import_module("vllm.platforms").current_platform.device_type = "cuda"
    utils = import_module("vllm.utils")
    serve = import_module("vllm.entrypoints.cli.serve")
    engine_args = import_module("vllm.engine.arg_utils")
    cache = import_module("vllm.config.cache")
    cmds = [c for c in r["emitted"]["commands"] if c["program"][:2] == ["vllm", "serve"]]
    p = r["priced"]

    def check() -> None:
        with tempfile.TemporaryDirectory() as d, _patched(cache, "get_cpu_memory", lambda: HOST_MEMORY_BYTES):
            Path(d, "config.json").write_text(json.dumps(r["hf_config"]), encoding="utf-8")
            dp = 0  # the deployment's replicas: each front-end server's data-parallel size (headless ones join one)
            for cmd in cmds:
                parser = utils.FlexibleArgumentParser(description="vLLM CLI")
                sub = serve.ServeSubcommand()
                sub.subparser_init(parser.add_subparsers(required=False, dest="subparser"))
                with environment(cmd["env"], ["vllm"]):
                    args = parser.parse_args(["serve", d, *cmd["args"]])
                    sub.validate(args)
                    args.model = args.model_tag
                    config = engine_args.AsyncEngineArgs.from_cli_args(args).create_engine_config()
                _compare_engine(config, p)
                dp += 0 if args.headless else config.parallel_config.data_parallel_size
            if dp != p["dp"]:
                raise AssertionError(f"vLLM built dp = {dp} over the servers, priced {p['dp']}")

    return guarded(check)


def _compare_engine(config: Any, p: dict[str, Any]) -> None:
    """AssertionError naming the first field where one server's engine config differs from the priced plan."""
    mc, pc = config.model_config, config.parallel_config
    dtype, quantization = PRICED_DTYPE.get(p["precision"], (None, None))
    built = {"layers": mc.hf_text_config.num_hidden_layers, "heads": mc.get_num_attention_heads(pc) * p["tp"],
             "kv_heads": mc.get_total_num_kv_heads(), "hidden": mc.get_hidden_size(), "vocab": mc.get_vocab_size(),
             "max_model_len": mc.max_model_len, "tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size}
    if dtype is not None:
        built |= {"dtype": str(mc.dtype).removeprefix("torch."), "quantization": mc.quantization}
    if p.get("mla_kv_dim") is not None:  # MLA caches one latent "head" of kv_lora_rank + qk_rope_head_dim per token
        built["mla_kv_dim"] = mc.get_num_kv_heads(pc) * mc.get_head_size() if mc.use_mla else None
    priced = {**{k: p[k] for k in built if k in p}, "dtype": dtype, "quantization": quantization}
    for k, v in built.items():
        if v != priced[k]:
            raise AssertionError(f"vLLM built {k} = {v}, priced {priced[k]}")


# -------------------------------------------------------------------------- SGLang


def sglang(r: dict[str, Any]) -> str | None:
    """SGLang 0.5.23 (wheel): each server command (``python -m sglang.launch_server``) through
    ``server_args.prepare_server_args`` (its argparse parser), ``ServerArgs.resolve_once`` (the resolution
    pipeline: model config, parallel, memory and serving defaults) and ``check_server_args`` (arg_groups/
    validation_hook.py), what launch_server runs before a GPU is touched; the checkpoint is a local directory
    holding the catalog model's config.json (``r["hf_config"]``). Stubbed: ``get_device`` in
    srt/utils/common.py and arg_groups/serving_hook.py returns cuda (no accelerator here). Run in a venv with
    torch 2.14.1 + torchvision 0.29.1 (README)."""
    import tempfile

    common, hook = import_module("sglang.srt.utils.common"), import_module("sglang.srt.arg_groups.serving_hook")
    server_args = import_module("sglang.srt.server_args")
    cmds = [c for c in r["emitted"]["commands"] if "--tp-size" in c["args"]]

    def check() -> None:
        with tempfile.TemporaryDirectory() as d, _patched(common, "get_device", lambda *a, **k: "cuda"), \
                _patched(hook, "get_device", lambda *a, **k: "cuda"):
            Path(d, "config.json").write_text(json.dumps(r["hf_config"]), encoding="utf-8")
            for cmd in cmds:
                args = list(cmd["args"])
                args[args.index("--model-path") + 1] = d
                with environment(cmd["env"], ["sglang"]):
                    parsed = server_args.prepare_server_args(args)
                    parsed.resolve_once()
                    parsed.check_server_args()

    return guarded(check)


# -------------------------------------------------------------------------- Megatron-DeepSpeed


def deepspeed(e: dict[str, Any]) -> str | None:
    """Megatron-DeepSpeed 4efb479 with DeepSpeed 0.19.6: ``megatron/arguments.py`` ``parse_args`` (with DeepSpeed's
    add_config_arguments) and ``validate_args`` with pretrain_gpt.py's ``args_defaults``. Stubbed: WORLD_SIZE =
    the configuration's GPUs, RANK 0; the accelerator's device name is cuda (DeepSpeed finds none here)."""
    arguments = import_module("megatron.arguments")
    accelerator = import_module("deepspeed.accelerator").get_accelerator()
    cmd = next(c for c in e["commands"] if c["program"][-1].endswith("pretrain_gpt.py"))
    env = {**cmd["env"], "WORLD_SIZE": str(e["gpus"]), "RANK": "0", "LOCAL_RANK": "0"}

    def check() -> None:
        with environment(env, [cmd["program"][-1], *cmd["args"]]), \
                _patched(accelerator, "device_name", lambda *a, **k: "cuda"):
            args = arguments.parse_args()
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's defaults

    return guarded(check)


CHECKERS: dict[str, Checker] = {"megatron": megatron, "torchtitan": torchtitan, "vllm": vllm,
                                "deepspeed": deepspeed}


def bridge(r: dict[str, Any]) -> str | None:
    """Megatron-Bridge 067f987: run_recipe.py's parser, recipe, override parser and ``runtime_config_update``, then
    the built model compared with what was priced (see :mod:`madmax_opt.studies.framework_checks_bridge`)."""
    return import_module("madmax_opt.studies.framework_checks_bridge").bridge(r)


# checks on the whole row (the emitted configuration with what was priced): name -> (format, checker, applies)
ROW_CHECKERS: dict[str, tuple[str, Checker, Callable[[dict[str, Any]], bool]]] = {
    "vllm-engine": ("vllm", vllm_engine, lambda r: r.get("hf_config") is not None),
    "sglang": ("sglang", sglang, lambda r: r.get("hf_config") is not None),
    "bridge": ("nemo", bridge, lambda r: bool(r.get("priced")))}
MODULES = {"megatron": "megatron.training.arguments", "torchtitan": "torchtitan.config",
           "sglang": "sglang.srt.server_args", "vllm": "vllm.engine.arg_utils", "deepspeed": "megatron.arguments"}


def importable(check: str) -> bool:
    """Whether the framework a check runs can be imported here."""
    fmt = ROW_CHECKERS[check][0] if check in ROW_CHECKERS else check
    if fmt == "nemo":  # the Bridge imports only with its stubs in place
        return bool(import_module("madmax_opt.studies.framework_checks_bridge").importable())
    try:
        import_module(MODULES[fmt])
    except Exception:  # not installed, or installed without what it needs to import
        return False
    return True


def checked_rows(rows: list[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    """The rows ``check`` applies to (emitted configurations of its format)."""
    fmt, _, applies = ROW_CHECKERS.get(check, (check, None, lambda r: True))
    return [r for r in rows if r["format"] == fmt and "emitted" in r and applies(r)]


def check_rows(rows: list[dict[str, Any]], checks: list[str]) -> list[dict[str, Any]]:
    """Each row a check applies to, with ``check`` and ``failure`` (None: the framework accepts it)."""
    return [{**r, "check": c, "failure": ROW_CHECKERS[c][1](r) if c in ROW_CHECKERS else CHECKERS[c](r["emitted"])}
            for c in checks for r in checked_rows(rows, c)]


def main(argv: list[str]) -> int:
    rows = [json.loads(line) for line in Path(argv[0]).read_text(encoding="utf-8").splitlines() if line]
    checks = [c for c in (argv[1:] or [*CHECKERS, *ROW_CHECKERS]) if importable(c)]
    checked = check_rows(rows, checks)
    for r in checked:
        if r["failure"]:
            print(f"FAIL {r['check']} {r['problem']} #{r['rank']}: {r['failure']}")
    for c in checks:
        fmt = ROW_CHECKERS[c][0] if c in ROW_CHECKERS else c
        mine = [r for r in checked if r["check"] == c]
        refused = sum(1 for r in rows if r["format"] == fmt and "refused" in r)
        skipped = sorted({r.get("hf_config_refused") or "no priced record" for r in rows if r["format"] == fmt
                          and "emitted" in r and not ROW_CHECKERS[c][2](r)}) if c in ROW_CHECKERS else []
        ok = sum(1 for r in mine if r["failure"] is None)
        print(f"{c}: {ok} of {len(mine)} emitted configurations pass the framework's own checks "
              f"({refused} refused by the emitter" + (f"; not built: {'; '.join(skipped)}" if skipped else "") + ")")
    return 0 if all(r["failure"] is None for r in checked) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
