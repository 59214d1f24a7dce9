"""Megatron-Bridge's own start-up path run on an emitted NeMo / Megatron-Bridge configuration (issue 21).

Pinned: Megatron-Bridge 067f987 (data/flags/nemo.yaml) with the Megatron-LM commit its 3rdparty submodule pins
(2a75ac1). The check follows ``scripts/training/run_recipe.py`` ``main`` at that commit: its argument parser
(``parse_args``: --recipe, --mode and the trailing KEY=VALUE overrides), the named recipe built
(``recipe_runner.load_recipe``), the overrides applied by the Bridge's own Hydra/OmegaConf override parser
(``recipe_runner.apply_cli_overrides`` -> ``training/utils/omegaconf_utils.process_config_with_overrides``), the
pipeline-layout, runtime-environment and sequence-length syncs, and then, where ``run_config`` would call the
training loop, the first thing ``training/pretrain.py`` ``pretrain`` does (line 75): ``runtime_config_update``
(mixed precision resolved and applied, data-parallel size, communication overlap, ``ConfigContainer.validate``
with the model's ``finalize``, i.e. Megatron-Core's TransformerConfig checks); the GPU is first touched after it.
The built config's model is then compared with what was priced (launch_conformance's
``priced``): layers, hidden, heads, KV heads, FFN, vocabulary, RoPE base, tp / pp / vpp / cp / ep, expert tp,
sequence parallelism, recompute, precision, experts and top-k.

Run in a venv with CPU torch, triton and the Bridge's pure-Python requirements (docs/launch.md):

    PYTHONPATH=src:$B/src:$B/scripts/training:$B/scripts/common:$MLM python -m madmax_opt.studies.framework_checks \
        OUT.jsonl bridge

Stubbed, because this machine has no GPU and no network (each said where it is done):
- Transformer Engine (a CUDA library; the Bridge's peft/lora_layers.py imports it unconditionally): where it does
  not import, a placeholder package whose every name is an empty torch.nn.Module subclass, version 2.18.0 (the
  Bridge's uv.lock pin, e7c550c), FusedAdam with its constructor's keywords at that commit (Megatron-Core inspects
  them). Nothing of it is called before the GPU is touched.
- ``typing.override`` on Python 3.11 (the Bridge needs 3.12): typing_extensions' ``override``.
- The hub: the Llama-3 recipes build their model from ``AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-70B")``
  (recipes/llama/h100/llama3.py line 724); that id reads a local directory holding the catalog llama3-70b's
  config.json (``launch.hf_config``) instead.
- WORLD_SIZE = the configuration's GPUs and RANK 0 (torchrun's variables), and the recipe runner's re-exec
  bootstrap marker set to this process (recipe_runner.py line 89: a benchmark recipe re-executes the script once to
  apply its environment; here that environment is applied in process).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

from madmax_opt.studies.framework_checks import _patched, environment, guarded

TE_VERSION = "2.18.0"  # Megatron-Bridge uv.lock @067f987: transformer-engine 2.18.0+e7c550c5
HUB_CHECKPOINTS = {"meta-llama/Meta-Llama-3-70B": "llama3-70b"}  # recipes/llama/h100/llama3.py line 724 @067f987
# Bridge mixed-precision recipe name -> the precision madmax-opt priced (training/mixed_precision.py @067f987)
PRECISION = {"bf16_mixed": "bf16", "fp16_mixed": "fp16", "bf16_with_fp8_current_scaling_mixed": "fp8",
             "bf16_with_mxfp8_mixed": "fp8", "bf16_with_fp8_delayed_scaling_mixed": "fp8"}


class _Placeholder(type):
    """A placeholder class whose attributes are placeholder classes (Transformer Engine's names, not called here)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _fused_adam_init(self: Any, params: Any, *, master_weight_dtype: Any = None, exp_avg_dtype: Any = None,
                     exp_avg_sq_dtype: Any = None, use_decoupled_grad: bool = False, **kwargs: Any) -> None:
    """The keywords of TE's FusedAdam that Megatron-Core's OptimizerConfig looks for before allowing the precision-
    aware optimizer (optimizer_config.py lines 449-466 @2a75ac1); TE e7c550c has them
    (pytorch/optimizers/fused_adam.py lines 125-128)."""
    raise NotImplementedError("Transformer Engine is a placeholder here")


def _placeholder(name: str) -> type:
    """A torch.nn.Module subclass (libraries register Transformer Engine's layers as modules); FusedAdam with
    its constructor's keywords."""
    import torch

    return _Placeholder(name, (torch.nn.Module,), {"__init__": _fused_adam_init} if name == "FusedAdam" else {})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
        setattr(self, name, value)
        return value


class _TransformerEngineStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``transformer_engine[.x]`` import gives a placeholder module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "transformer_engine" or fullname.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        module.__version__ = TE_VERSION  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def prepare() -> None:
    """The stubs that let the Bridge import here (see the module docstring); idempotent."""
    import typing

    if not hasattr(typing, "override"):
        setattr(typing, "override", import_module("typing_extensions").override)  # noqa: B010
    try:
        import_module("transformer_engine.pytorch")
    except ImportError:
        if not any(isinstance(f, _TransformerEngineStub) for f in sys.meta_path):
            sys.meta_path.insert(0, _TransformerEngineStub())


def importable() -> bool:
    """Whether the Bridge's sources are on the path and import with the stubs (installed only then)."""
    try:
        if importlib.util.find_spec("run_recipe") is None or importlib.util.find_spec("megatron.bridge") is None:
            return False
        prepare()
        import_module("run_recipe")
        import_module("megatron.bridge.training.config")
    except Exception:  # not installed, or installed without what it needs to import
        return False
    return True


@contextlib.contextmanager
def _hub_checkpoints(directory: str) -> Iterator[None]:
    """``AutoBridge.from_hf_pretrained(hub id)`` reading a local directory with the catalog model's config.json."""
    from madmax_opt.io.catalog import models
    from madmax_opt.launch.hf_config import hf_config

    auto = import_module("megatron.bridge.models.conversion.auto_bridge").AutoBridge
    local = {}
    for hub_id, name in HUB_CHECKPOINTS.items():
        path = Path(directory, name)
        path.mkdir()
        cfg = hf_config(models()[name])
        assert isinstance(cfg, dict), cfg
        (path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        local[hub_id] = str(path)
    original = auto.__dict__["from_hf_pretrained"]

    def from_hf_pretrained(cls: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        return original.__func__(cls, local.get(str(path), path), *args, **kwargs)

    auto.from_hf_pretrained = classmethod(from_hf_pretrained)
    try:
        yield
    finally:
        auto.from_hf_pretrained = original


def build(e: dict[str, Any]) -> Any:
    """The ConfigContainer Megatron-Bridge builds from emitted configuration ``e`` and validates at start-up
    (``runtime_config_update``); raises what the Bridge raises."""
    prepare()
    run_recipe, runner = import_module("run_recipe"), import_module("recipe_runner")
    config_module = import_module("megatron.bridge.training.config")
    cmd = next(c for c in e["commands"] if c["program"][-1].endswith("run_recipe.py"))
    built: dict[str, Any] = {}

    def run_config(*, config: Any, **_: Any) -> bool:  # where the training loop would start: pretrain's first call
        config_module.runtime_config_update(config)
        built["config"] = config
        return True

    env = {**cmd.get("env", {}), "WORLD_SIZE": str(e["gpus"]), "RANK": "0", "LOCAL_RANK": "0",
           runner.RECIPE_ENV_BOOTSTRAP_MARKER: str(os.getpid())}
    cwd = os.getcwd()
    logging.disable(logging.INFO)  # run_recipe.main's INFO log of the recipe and the dataset split
    try:
        with environment(env, [cmd["program"][-1], *cmd["args"]]), _patched(run_recipe, "run_config", run_config), \
                tempfile.TemporaryDirectory() as d, _hub_checkpoints(d):
            run_recipe.main(list(cmd["args"]))
    finally:
        logging.disable(logging.NOTSET)
        os.chdir(cwd)  # main() changes to the Bridge's checkout
    return built["config"]


def built_model(config: Any) -> dict[str, Any]:
    """The fields of the Bridge's built model config that the cost model prices (priced's names)."""
    m, mp = config.model, config.mixed_precision
    vpp = m.virtual_pipeline_model_parallel_size
    recompute = m.recompute_granularity or "none"
    precision = PRECISION.get(mp, mp) if isinstance(mp, str) else (
        "fp8" if getattr(mp, "fp8", None) else "bf16" if getattr(mp, "bf16", False) else
        "fp16" if getattr(mp, "fp16", False) else "fp32")
    return {"layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads,
            "kv_heads": m.num_query_groups or m.num_attention_heads, "ffn": m.ffn_hidden_size,
            "vocab": m.vocab_size,
            "rope_base": m.rotary_base if m.position_embedding_type == "rope" else None,
            "experts": m.num_moe_experts, "top_k": m.moe_router_topk if m.num_moe_experts else None,
            "tp": m.tensor_model_parallel_size, "pp": m.pipeline_model_parallel_size, "vpp": vpp or 1,
            "cp": m.context_parallel_size, "ep": m.expert_model_parallel_size,
            "etp": m.expert_tensor_parallel_size if m.num_moe_experts else None, "sp": bool(m.sequence_parallel),
            "recompute": recompute, "precision": precision, "seq_len": m.seq_length}


def expected(priced: dict[str, Any]) -> dict[str, Any]:
    """What the Bridge should build for the priced plan: sequence parallelism only with tp > 1 (Megatron-Core
    turns it off at tp 1); the experts sharded by tp (expert tp = tp, the cost model's expert groups,
    model/groups.py)."""
    return {**priced, "sp": bool(priced["sp"] and priced["tp"] > 1),
            "etp": priced["tp"] if priced.get("experts") else None}


def bridge(r: dict[str, Any]) -> str | None:
    """None when Megatron-Bridge builds and validates the row's emitted configuration and its model and plan are
    what was priced; else the Bridge's message (first line) or the first field that differs."""
    def check() -> None:
        built = built_model(build(r["emitted"]))
        want = expected(r["priced"])
        for k, v in built.items():
            if k in want and v != want[k]:
                raise AssertionError(f"Megatron-Bridge built {k} = {v}, priced {want[k]}")

    return guarded(check)
