"""Problem files to validated problems: loading, hardware options, calibration overlays, checks that need the
resolved catalog (precisions, spaces), models from catalogs and Hugging Face configs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import calibration, catalog
from madmax_opt.io.derive import derive_hardware
from madmax_opt.io.overlays import check_overlay
from madmax_opt.io.problem_file import HardwareEntry, HFConfig, ProblemFile
from madmax_opt.io.serving_catalog import serving_data
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_text, read_yaml, shorten
from madmax_opt.model.family_name import serving_task, training_task
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.objectives import OBJECTIVES
from madmax_opt.model.problem import Problem
from madmax_opt.model.serving_calibration import serving_framework
from madmax_opt.model.spec import (
    FRAMEWORKS,
    GPU,
    MLA,
    Space,
    System,
    TransformerModel,
)


def load_overlay(path: Path, *, file: str) -> calibration.Overlay:
    """A `calibration:` overlay file (written by madmax-opt calibrate), validated; one-line errors."""
    if not os.path.lexists(path):
        calibration.check_overlay_file(path, file=file)  # not found: named with the problem file and its field
    data = read_yaml(path, what="calibration overlay")  # a FIFO, device, directory or symlink loop: one line
    overlay: calibration.Overlay = validate(calibration.Overlay, data, file=str(path))
    return overlay


def load_problem(path: str | Path) -> Problem:
    """Read, validate and resolve a problem file (``madmax-opt schema`` prints its format)."""
    data = read_yaml(path, what="problem file")
    if data is None:
        keys = ", ".join(ProblemFile.model_fields)
        raise ProblemError(f"empty problem file; allowed: a mapping with keys {{{keys}}}", file=str(path))
    if not isinstance(data, dict):
        validate(ProblemFile, data, file=str(path))  # raises the one-line "wrong type; allowed: ..." error
    return problem_from_dict(data, source=str(path))


def hardware_options(
    hardware: HardwareEntry | list[HardwareEntry], *, file: str | None
) -> list[HardwareOption]:
    """Every (system, GPU, cluster size) a ``hardware`` section stands for, catalog names and derivations resolved."""
    entries = hardware if isinstance(hardware, list) else [hardware]
    options: list[HardwareOption] = []
    for i, e in enumerate(entries):
        field = f"hardware[{i}]" if isinstance(hardware, list) else "hardware"
        system = resolve_system(e, file=file, field=field)
        gpu: GPU = (
            derive_hardware(e.derive, file=file, field=f"{field}.derive")[1]
            if e.derive is not None
            else catalog.lookup("gpu", system.gpu, file=file, field=f"{field}.system.gpu")
        )
        options.extend(HardwareOption(system, gpu, n, e.supply) for n in e.sizes())
    return options


def problem_from_dict(data: dict[str, Any], source: str = "<inline>") -> Problem:
    pf = validate(ProblemFile, data, file=source)
    model = resolve_model(pf.model, file=source)
    options = hardware_options(pf.hardware, file=source)
    overlay = None
    train, serve = training_task(pf.task), serving_task(pf.task)
    if pf.calibration is not None:
        overlay_path = (Path(source).parent if source != "<inline>" else Path(".")) / pf.calibration
        overlay = load_overlay(overlay_path, file=source)
        framework = pf.stack.framework if train is not None else serving_framework(pf.stack, file=source)
        check_overlay(overlay, options=options, framework=framework, training=train is not None,
                      file=source, overlay_file=str(overlay_path))
    if train is not None:  # the training (GPU, framework) fit prices the plan (serving: serving_calibration)
        options = calibration.apply(options, pf.stack.framework, overlay)
    if train is not None and pf.stack.framework not in FRAMEWORKS:  # a serving engine prices no training
        raise ProblemError(f"{pf.stack.framework} is a serving engine, it does not train; allowed for kind "
                           f"{train.kind}: {', '.join(FRAMEWORKS)}", file=source, field="stack.framework")
    if serve is not None and model.family != "llm":
        raise ProblemError(f"kind inference needs an llm, got a {model.family}", file=source, field="task.kind")
    if serve is not None and OBJECTIVES[pf.objective_name].needs_total_units:
        allowed = ", ".join(n for n, o in OBJECTIVES.items() if not o.needs_total_units)
        raise ProblemError(f"{pf.objective_name!r} needs a training run; allowed for inference: {allowed}",
                           file=source, field="objective")
    if serve is not None and pf.robust:
        raise ProblemError("true needs a training task (the error bars are the training fit's); allowed for kind "
                           "inference: false", file=source, field="objective.robust")
    if train is not None and model.family == "llm" and train.seq_len is None:
        raise ProblemError("missing, required for an llm; allowed: tokens per sequence, an integer > 0",
                           file=source, field="task.seq_len")
    if train is not None and train.frozen_layers > model.layers:
        raise ProblemError(
            f"{train.frozen_layers} exceeds the model's {model.layers} layers; allowed: 0 to {model.layers}",
            file=source,
            field="task.frozen_layers",
        )
    if train is not None:
        check_training_precision(train.precision, options, file=source)
    check_space(pf.space, file=source)
    check_expert_parallel(getattr(pf.space, "ep", None), model, file=source)
    if pf.objective_name == "time_to_train" and train is not None and train.train_tokens is None:
        raise ProblemError("missing, objective time_to_train needs it; allowed: a token count > 0, e.g. 2.0e+12",
                           file=source, field="task.train_tokens")
    if pf.constraints.deadline_hours is not None and (train is None or train.train_tokens is None):
        raise ProblemError("needs task.train_tokens (the token budget) of a training task; allowed: a training task "
                           "with train_tokens, or min_throughput", file=source, field="constraints.deadline_hours")
    if pf.constraints.budget_usd is not None and (train is None or train.train_tokens is None):
        raise ProblemError("needs task.train_tokens (the token budget) of a training task; allowed: a training task "
                           "with train_tokens, or max_cost_per_hour", file=source, field="constraints.budget_usd")
    return Problem(
        model=model,
        task=pf.task,
        stack=pf.stack,
        hardware=tuple(options),
        space=pf.space,
        objective=pf.objective_name,
        robust=pf.robust,
        constraints=pf.constraints,
        baseline=pf.baseline,
        source=source,
        serving=serving_data(overlay) if serve is not None else None,
    )


# The tensor-core format a training precision needs: FP8 runs on FP8 tensor cores (Hopper, CDNA3, Blackwell); MXFP8's
# block scaling came with Blackwell's 5th-generation tensor cores, the ones that also run FP4 (NVIDIA Blackwell
# architecture technical brief, 2024), so a GPU with an fp4 peak in the catalog is one that runs MXFP8.
TRAINING_FORMAT: dict[str, str] = {"mxfp8": "fp4"}


def check_training_precision(precision: str, options: list[HardwareOption], *, file: str) -> None:
    """One-line error when a hardware option's GPU cannot run the training precision (fp8 on A100, mxfp8 on H100)."""
    need = TRAINING_FORMAT.get(precision, precision)
    lacking = list(dict.fromkeys(o.gpu.name for o in options if need not in o.gpu.peak_flops))
    if lacking:
        able = sorted(g.name for g in catalog.gpus().values() if need in g.peak_flops)
        raise ProblemError(f"{precision} needs {'MX block-scaled FP8' if precision == 'mxfp8' else need} tensor "
                           f"cores, which {', '.join(lacking)} lack; {precision} runs on {', '.join(able)}; "
                           "allowed on every GPU: bf16", file=file, field="task.precision")


EMPTY_KNOB = "empty list, nothing to search; allowed: one or more values (omit the key to search all)"


def check_expert_parallel(ep: int | list[int] | None, model: TransformerModel, *, file: str | None) -> None:
    """Each allowed ep must split the model's experts evenly (a dense model has one MLP: ep 1); named here rather
    than later as an empty plan space."""
    values = [ep] if isinstance(ep, int) else ep or []
    if model.moe is None:
        if any(e != 1 for e in values):
            raise ProblemError(f"got {values}; {model.name} is a dense model (no experts to split); allowed: 1, or "
                               "omit ep", file=file, field="space.ep")
        return
    experts = model.moe.num_experts
    bad = [e for e in values if experts % e]
    if bad:
        divisors = [d for d in range(1, experts + 1) if experts % d == 0]
        raise ProblemError(f"ep {', '.join(map(str, bad))} does not divide {model.name}'s {experts} experts; allowed: "
                           f"divisors of {experts} ({', '.join(map(str, divisors[:24]))}"
                           f"{', ...' if len(divisors) > 24 else ''})", file=file, field="space.ep")


def check_space(space: BaseModel, *, file: str | None, field: str = "space") -> None:
    """Every integer knob of a (training, serving or DLRM) ``space`` names allowed values: >= 1 (ZeRO 0-3), a
    non-empty list; knob combinations that cannot mean anything are refused by name."""
    for name, given in space:
        if isinstance(given, bool) or not isinstance(given, int | list) or name == "column_splits":
            continue
        values = [given] if isinstance(given, int) else given
        if not values:
            raise ProblemError(EMPTY_KNOB, file=file, field=f"{field}.{name}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            continue  # a list of names (recompute, shardings): the schema checked them
        lowest, highest = (0, 3) if name == "zero" else (1, None)
        if any(v < lowest or (highest is not None and v > highest) for v in values):
            allowed = "ZeRO stages 0, 1, 2, 3" if name == "zero" else f"integers >= {lowest}"
            raise ProblemError(f"got {values}; allowed: {allowed}", file=file, field=f"{field}.{name}")
    if not isinstance(space, Space):
        return
    if space.mixed_stages and not space.uneven_stages:
        raise ProblemError("mixed_stages needs uneven_stages: true (stages of other GPU types are searched by the "
                           "uneven pipeline search); allowed: add uneven_stages: true, or drop mixed_stages",
                           file=file, field=f"{field}.mixed_stages")
    pp = [space.pp] if isinstance(space.pp, int) else space.pp
    vpp = [space.vpp] if isinstance(space.vpp, int) else space.vpp
    if pp and vpp and max(pp) == 1 and min(vpp) > 1:
        raise ProblemError(f"vpp={space.vpp} needs a pipeline, but pp is {space.pp} (interleaving splits each "
                           "pipeline stage into vpp chunks); allowed: vpp 1 at pp 1, or pp > 1",
                           file=file, field=f"{field}.vpp")


def resolve_model(spec: str | HFConfig | TransformerModel, *, file: str | None) -> TransformerModel:
    if isinstance(spec, TransformerModel):
        return spec
    if isinstance(spec, HFConfig):
        base = Path(file).parent if file and file != "<inline>" else Path(".")
        return model_from_hf_config(base / spec.hf_config, file=file)
    model: TransformerModel = catalog.lookup("model", spec, file=file, field="model")
    return model


def resolve_system(e: HardwareEntry, *, file: str | None, field: str) -> System:
    if e.derive is not None:
        return derive_hardware(e.derive, file=file, field=f"{field}.derive")[0]
    if isinstance(e.system, System):
        return e.system
    if e.system is not None:
        system: System = catalog.lookup("system", e.system, file=file, field=f"{field}.system")
        return system
    assert e.gpu is not None
    return catalog.standard_system(e.gpu, file=file, field=f"{field}.gpu")


_HF_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
}


def model_from_hf_config(path: Path, *, file: str | None) -> TransformerModel:
    """Hugging Face ``config.json`` (LLaMA/Mistral/GPT-2/GPT-NeoX style keys) -> TransformerModel."""
    field = "model.hf_config"
    text = read_text(path, what="hf_config file (relative to the problem file)", file=str(file), field=field)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ProblemError(f"malformed JSON {path}, {where}: {exc.msg}", file=file, field=field) from None
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer of more than 4,300 digits
        raise ProblemError(f"malformed JSON {path}: {type(exc).__name__}: {exc}", file=file, field=field) from None
    if not isinstance(cfg, dict):
        raise ProblemError(f"{path} is not a JSON object; allowed: a Hugging Face config.json", file=file,
                           field="model.hf_config")
    values: dict[str, Any] = {}
    for key, names in _HF_KEYS.items():
        for n in names:
            if cfg.get(n) is not None:
                values[key] = cfg[n]
                break
    for key in ("layers", "hidden", "heads", "vocab"):
        if key not in values:
            raise ProblemError(
                f"{path} lacks {' / '.join(_HF_KEYS[key])}", file=file, field="model.hf_config"
            )
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu")))
    gated = act in ("silu", "swish") or "llama" in str(cfg.get("model_type", "")) or "mistral" in str(
        cfg.get("model_type", "")
    )
    values.setdefault("ffn", 4 * values["hidden"])
    values["ffn_kind"] = "swiglu" if gated else "gelu"
    values["norm"] = "rmsnorm" if "rms_norm_eps" in cfg else "layernorm"
    values["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", not gated))
    values["bias"] = not gated
    values["name"] = str(cfg.get("_name_or_path") or cfg.get("model_type") or path.stem)
    values |= _hf_moe(cfg, values["ffn"], path=path, file=file)
    values["source"] = f"Hugging Face config {path}"
    return validate(TransformerModel, values, file=file, prefix="model.hf_config")


# Mixture-of-experts keys of Hugging Face configs (transformers, src/transformers/models/: mixtral/configuration_mixtral.py
# @ad467bd: num_local_experts, num_experts_per_tok; deepseek_v3/configuration_deepseek_v3.py @0fc683d: n_routed_experts,
# n_shared_experts, moe_intermediate_size, and MLA's kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
# v_head_dim; qwen2_moe/configuration_qwen2_moe.py
# @765e4fb: num_experts, moe_intermediate_size, shared_expert_intermediate_size). gpt-oss and Llama 4 use Mixtral's.
_HF_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_HF_TOP_K = ("num_experts_per_tok", "moe_top_k", "experts_per_token")


def _hf_moe(cfg: dict[str, Any], ffn: Any, *, path: Path, file: str | None) -> dict[str, Any]:
    """The MoE fields of a Hugging Face config ({} for a dense model): experts, top-k, expert width (ffn = the
    expert width, as in the catalog's MoE entries), shared experts, and DeepSeek's MLA widths."""
    experts_key = next((k for k in _HF_EXPERTS if cfg.get(k) is not None), None)
    if experts_key is None or cfg[experts_key] in (0, 1):  # no experts, or a single expert: a dense MLP
        return {}
    top_key = next((k for k in _HF_TOP_K if cfg.get(k) is not None), None)
    if top_key is None:
        raise ProblemError(f"{path} has {experts_key} = {shorten(repr(cfg[experts_key]))} but no {' / '.join(_HF_TOP_K)}; "
                           "allowed: a mixture-of-experts config with both, or neither (a dense model)",
                           file=file, field="model.hf_config")
    width = cfg.get("moe_intermediate_size") or ffn
    shared = cfg.get("n_shared_experts") or 0
    shared_width = cfg.get("shared_expert_intermediate_size")
    if not shared and isinstance(shared_width, int) and isinstance(width, int) and width > 0 and shared_width > 0:
        shared = max(1, round(shared_width / width))  # Qwen-MoE: one shared MLP as wide as this many experts
    out: dict[str, Any] = {"ffn": width, "moe": {"num_experts": cfg[experts_key], "top_k": cfg[top_key],
                                                "expert_ffn": width, "shared_experts": shared}}
    if cfg.get("kv_lora_rank") is not None:  # DeepSeek MLA: its widths, as config.json names them
        out["mla"] = {k: cfg.get(k) for k in MLA.model_fields}
    return out
