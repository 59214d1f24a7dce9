"""Modern training runs (H100 / B200 / GB200; Megatron-Core, torchtitan, PyTorch FSDP) as problems, plans and
measured step times, read from ``data/validation/modern/training.yaml`` (a verbatim copy of the shared set; sources,
metric definitions and caveats in its PROVENANCE.md).

Each case of the file becomes a :class:`madmax_opt.studies.fit.Run`. What is read how (and why) is said where it
happens; everything the file marks ``not_stated`` is filled with the framework's documented default, except
activation recompute: a run whose source does not state it is read with the least mode, in the order
none < selective < full (model.spec.RECOMPUTE_MODES: Megatron-Core's granularities, torchtitan's and NeMo AutoModel's
activation-checkpointing modes, MaxText's remat policies mapped onto them), whose predicted memory fits the GPU: the
run ran, so it fitted. Where that is not ``none`` the case says so in its note and is kept out of every fit: the
frameworks have modes between the model's (Megatron-Core ``recompute_modules`` and ``recompute_num_layers``,
torchtitan's every-n-layers SAC, MaxText's policies), so the inferred mode bounds the recompute time from above and
the step time of what ran is not known. A run that no mode makes fit keeps ``none`` (and is refused).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.numeric import Arr
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import (
    FRAMEWORK_FAMILY,
    RECOMPUTE_MODES,
    FamilyCalibration,
    FrameworkCalibration,
    FrameworkFit,
    Plan,
)
from madmax_opt.studies import fit as fit_mod
from madmax_opt.studies.fit import Run

MODERN_DIR = ("data", "validation", "modern")
TRAINING_FILE = "training.yaml"

# stack.framework (the efficiency and overlap profile) of each source's software (PROVENANCE.md): NeMo AutoModel runs
# PyTorch FSDP2 like torchtitan, so it takes the FSDP2 profile (torchtitan); pytorch-fsdp is FSDP1 as in llm-foundry.
# MaxText (JAX/XLA) is no modelled framework: predicted with the pytorch-fsdp profile, kept out of every fit.
FRAMEWORK_OF: dict[str, str] = {
    "NeMo AutoModel": "torchtitan", "NeMo": "megatron-core", "Megatron-Bridge": "megatron-core",
    "torchtitan": "torchtitan", "MosaicML": "pytorch-fsdp", "MaxText": "maxtext",
}
UNMODELLED_FRAMEWORKS: tuple[str, ...] = ("maxtext",)
# catalog system of each measured GPU (PROVENANCE caveat 5: the torchtitan H100s are their own device class)
SYSTEM_OF: dict[str, str] = {
    "H100 SXM 80GB": "dgx-h100", "H100 80GB": "dgx-h100", "H100 SXM 96GB": "grand-teton-h100-hbm2e",
    "B200": "dgx-b200", "GB200": "gb200-nvl72",
}
NEMO_LLAMA2_VOCAB = 32000  # NeMo LLM_VOCAB_SIZE_MAP["llama2"], used by its llama2 FLOPs formula
NEMO2_FP8_SOURCE = "dgxc_2503"  # NeMo 2.0 performance recipes (container nemo:24.12): FP8 with FP8 primary weights


@dataclass(frozen=True)
class ModernCase:
    """A measured run plus how it was read: ``fitted`` False for rows outside every fit (``unfitted_why``)."""

    run: Run
    framework_text: str
    note: str = ""
    recompute_inferred: bool = False  # the source does not state recompute: the least mode that fits (module doc)
    unfitted_why: str = ""  # why a case is outside every fit ("" for fitted cases)

    @property
    def fitted(self) -> bool:
        return not self.unfitted_why

    @property
    def framework_label(self) -> str:
        """The framework column of the report: the modelled framework (``run.framework``), or the unmodelled one's
        name (MaxText, priced with another's profile)."""
        return next(v for k, v in FRAMEWORK_OF.items() if self.framework_text.startswith(k))


def training_data() -> dict[str, Any]:
    """The parsed training.yaml shipped in the package."""
    text = resources.files("madmax_opt").joinpath(*MODERN_DIR, TRAINING_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def number(v: Any, alt: bool = False) -> float:
    """'31508 (FP8-MX: 29789)' -> 31508 (``alt``: 29789); '59.99%' -> 59.99; 2.96E+14 -> 2.96e14."""
    nums = re.findall(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", str(v))
    return float(nums[-1] if alt else nums[0])


def model_dict(key: str, catalog: dict[str, Any], layers: int | None = None) -> dict[str, Any]:
    """An inline model from the file's model_catalog. Squared-ReLU MLPs are two-matrix (non-gated) like GELU;
    MLA (DeepSeek-V3) is priced as multi-head attention with kv_heads = heads, and its 3 leading dense layers as
    MoE layers (approximations, stated in the report)."""
    m = catalog[key]
    ffn = str(m["ffn"])
    expert = re.findall(r"expert (\d+)", ffn)
    gated = m["act"] == "swiglu"
    out: dict[str, Any] = {
        "name": key, "layers": layers or m["layers"], "hidden": m["hidden"], "heads": m["heads"],
        "vocab": m["vocab"], "ffn_kind": "swiglu" if gated else "gelu", "norm": "rmsnorm" if gated else "layernorm",
        "tied_embeddings": key.startswith("mpt"), "ffn": int(expert[0]) if expert else int(number(ffn)),
        "source": f"data/validation/modern/training.yaml model_catalog.{key}",
    }
    if isinstance(m["kv_heads"], int):
        out["kv_heads"] = m["kv_heads"]
    moe = m.get("moe")
    if moe:
        out["moe"] = {"num_experts": moe.get("experts") or moe["routed_experts"], "top_k": moe["topk"],
                      "expert_ffn": out["ffn"], "shared_experts": moe.get("shared_experts", 0)}
    return out


def _recompute(v: Any) -> str:
    s = str(v or "none").lower()
    return "full" if "full" in s else ("selective" if "selective" in s else "none")


def least_recompute_that_fits(problem: Problem, plan: Plan) -> str | None:
    """The first mode of RECOMPUTE_MODES (none < selective < full) with which ``plan``'s predicted memory per GPU
    (the worst stage) fits the usable memory; None where no mode fits."""
    model = Model(problem)
    plans = [plan.model_copy(update={"recompute": mode}) for mode in RECOMPUTE_MODES]
    terms = model.terms(model.arrays(plans))
    fits = np.asarray(terms.memory.total) <= np.asarray(terms.capacity_bytes)
    return next((mode for mode, ok in zip(RECOMPUTE_MODES, fits, strict=True) if ok), None)


def _precision(c: dict[str, Any], alt: bool) -> str:
    p = str(c["precision"]).lower()
    if alt or "mxfp8" in p:
        return "mxfp8"
    return "fp8" if "fp8" in p else "bf16"


def measured_step_s(c: dict[str, Any], model: dict[str, Any], alt: bool = False) -> float:
    """Seconds per step: stated, or gbs x seq / (tokens/s/GPU x GPUs) (training tokens over all GPUs, caveat 4),
    or from NeMo TFLOPS/GPU with NeMo's llama2 formula gbs s L h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(L h))
    (NeMo utils/flops_formulas.py; caveat 3)."""
    m, p = c["measured"], c["parallelism"]
    gpus = c["hardware"]["num_gpus"]
    s = c["model"]["seq_len"]
    if "step_time_s" in m and not alt:
        return float(m["step_time_s"])
    if "tokens_per_sec_per_gpu" in m:
        return float(p["gbs"] * s / (number(m["tokens_per_sec_per_gpu"], alt) * gpus))
    L, h, a, f = model["layers"], model["hidden"], model["heads"], model["ffn"]
    g = model.get("kv_heads", a)
    flops = p["gbs"] * s * L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * NEMO_LLAMA2_VOCAB / (L * h))
    return float(flops / (number(m["model_tflops_per_gpu"]) * 1e12 * gpus))


def _case(c: dict[str, Any], catalog: dict[str, Any], alt: bool) -> ModernCase:
    fw_text = str(c["stack"]["framework"])
    framework = next(v for k, v in FRAMEWORK_OF.items() if fw_text.startswith(k))
    system = next(v for k, v in SYSTEM_OF.items() if str(c["hardware"]["gpu"]).startswith(k))
    p = c["parallelism"]
    other = str(p.get("other") or "")
    tp, pp, cp = p["tp"] or 1, p["pp"] or 1, p["cp"] or 1
    gpus = c["hardware"]["num_gpus"]
    dp = gpus // (tp * pp * cp)
    notes: list[str] = []
    # caveat 6: the 405B proxy runs 7 of the 126 layers
    layers = 7 if "proxy7L" in c["id"] else None
    model = model_dict(c["model"]["catalog_key"], catalog, layers)
    gbs = p["gbs"]
    if p["mbs"]:
        mbs = p["mbs"]
    elif pp > 1:  # torchtitan: the local batch split into pp micro-batches (its Dec 2024 default) [inferred]
        mbs = max(1, gbs // (dp * pp))
        notes.append(f"mbs {mbs} inferred (local batch / pp)")
    else:
        mbs = max(1, gbs // (dp * (p["ga"] or 1))) if p["ga"] else 1
    ep = p["ep"] or 1
    if "moe" in model and ep == 1 and "DeepEP" in other:  # DeepEP is expert-parallel dispatch [inferred]
        ep = min(model["moe"]["num_experts"], dp * cp)
        notes.append(f"ep {ep} inferred from DeepEP")
    if "moe" not in model:
        ep = 1
    vpp = p["vpp"] or 1
    if "Interleaved" in other and vpp == 1:  # looped schedule, stages per rank not stated: the minimum 2 [inferred]
        vpp = 2
        notes.append("vpp 2 inferred (interleaved 1F1B)")
    fsdp = bool(p.get("fsdp"))
    precision = _precision(c, alt)
    problem = problem_from_dict(
        {
            "model": model,
            "hardware": {"system": system, "gpus": gpus},
            "task": {"seq_len": c["model"]["seq_len"], "global_batch": gbs, "precision": precision},
            # NeMo / Megatron-Bridge performance recipes overlap TP communication with GEMMs (userbuffers)
            "stack": {"framework": "pytorch-fsdp" if framework in UNMODELLED_FRAMEWORKS else framework,
                      "tp_comm_overlap": framework == "megatron-core" and tp > 1,
                      # NeMo 2.0's FP8 recipe (bf16_with_fp8_mixed, NeMo recipes/precision/mixed_precision.py
                      # @1dd5fa11: fp8_params = True) keeps FP8 primary weights; DGX Cloud v25.03 ran NeMo 24.12
                      "fp8_params": framework == "megatron-core" and c["source"]["ref"] == NEMO2_FP8_SOURCE
                      and precision == "fp8"},
        },
        source=f"training.yaml:{c['id']}",
    )
    # Megatron-Core: distributed optimizer (ZeRO-1) and SP with TP, the NeMo / Megatron-Bridge recipe defaults
    zero = 3 if fsdp else (1 if framework == "megatron-core" else 0)
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, ep=ep, zero=zero,
                recompute=_recompute(p["recompute"]), sp=tp > 1)
    inferred = p["recompute"] is None  # not stated in the source (provenance not_stated: recompute / remat policy)
    if inferred:
        mode = least_recompute_that_fits(problem, plan)
        if mode is None:
            notes.append("recompute not stated: no mode fits, read as none")
        elif mode != "none":
            plan = plan.model_copy(update={"recompute": mode})
            notes.append(f"recompute {mode} inferred (least that fits)")
    name = c["id"] + ("-mx" if alt else "")
    if alt:
        notes.append("the parenthesised FP8-MX value of the same row")
    run = Run(name, c["source"]["ref"], problem, plan, measured_step_s(c, model, alt))
    why = f"{fw_text} is no modelled framework" if framework in UNMODELLED_FRAMEWORKS else ""
    if inferred and plan.recompute != "none":
        why = "; ".join(w for w in (why, "its recompute is inferred (the time of the mode that ran is not known)") if w)
    return ModernCase(run, fw_text, "; ".join(notes), inferred, why)


def modern_cases(data: dict[str, Any] | None = None) -> list[ModernCase]:
    """Every training case of the file (rows quoting an FP8-MX value as well give a second, mxfp8 case)."""
    data = training_data() if data is None else data
    out = []
    for c in data["cases"]:
        out.append(_case(c, data["model_catalog"], False))
        if "FP8-MX" in str(c["measured"].get("tokens_per_sec_per_gpu", "")):
            out.append(_case(c, data["model_catalog"], True))
    return out


# ------------------------------------------------------------------------------------- fits and LOSO


Key = tuple[str, str]  # (GPU, framework)


def key_of(run: Run) -> Key:
    return (run.gpu, run.framework)


def fit_by_key(runs: Sequence[Run]) -> dict[Key, fit_mod.Fit]:
    """One fit per (GPU, framework) over ``runs``, from the GPU prior."""
    groups: dict[Key, list[Run]] = {}
    for r in runs:
        groups.setdefault(key_of(r), []).append(r)
    return {k: fit_mod.fit(v) for k, v in groups.items()}


def family_of(run: Run) -> str:
    return FRAMEWORK_FAMILY[run.framework]


def fit_by_family(runs: Sequence[Run]) -> dict[str, fit_mod.Fit]:
    """One fit per framework family pooled over its GPUs and frameworks: factors on each GPU's prior."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if fit_mod.prior(r.gpu).prior_kind == "datasheet":
            groups.setdefault(family_of(r), []).append(r)
    return {k: fit_mod.fit(v) for k, v in sorted(groups.items())}


LEVELS = ("calibrated", "family", "prior")  # what prices a case: its pair's fit, its family's pooled fit, the prior


def predict_with(runs: Sequence[Run], fits: dict[Key, fit_mod.Fit],
                 families: dict[str, fit_mod.Fit]) -> tuple[Arr, list[str]]:
    """Each run predicted as io.calibration prices a problem: its pair's fit, else its family's pooled fit (on a
    datasheet prior), else the prior; and the level that priced it."""
    out, levels = np.zeros(len(runs)), []
    for i, r in enumerate(runs):
        factors, level = {}, "prior"
        if key_of(r) in fits:
            factors, level = fits[key_of(r)].factors, "calibrated"
        elif family_of(r) in families and fit_mod.prior(r.gpu).prior_kind == "datasheet":
            factors, level = families[family_of(r)].factors, "family"
        out[i] = fit_mod.predict_scaled([r], [factors], fit_mod.priors([r]))[0, 0]
        levels.append(level)
    return out, levels


@dataclass(frozen=True)
class ModernSummary:
    cases: list[ModernCase]
    fits: dict[Key, fit_mod.Fit]  # the catalog fit: all fitted cases
    families: dict[str, fit_mod.Fit]  # the catalog's family fits: all fitted cases of each family
    in_sample_s: Arr  # every case with its pair's fit
    loso_s: Arr  # every case with its pair refitted without the case's source (NaN for unfitted cases)
    loso_level: list[str]  # per case, what priced its LOSO prediction (LEVELS; "" for unfitted cases)

    @property
    def measured_s(self) -> Arr:
        return np.array([c.run.measured_s for c in self.cases])

    @property
    def in_sample_err(self) -> Arr:
        return self.in_sample_s / self.measured_s - 1.0

    @property
    def loso_err(self) -> Arr:
        return self.loso_s / self.measured_s - 1.0

    @property
    def fitted(self) -> NDArray[np.bool_]:
        return np.array([c.fitted for c in self.cases])

    def at_level(self, level: str) -> NDArray[np.bool_]:
        """Per case: its LOSO prediction was priced at ``level``."""
        return np.array([lv == level for lv in self.loso_level])

    def loso_median(self, key: Key) -> float:
        idx = [i for i, c in enumerate(self.cases) if c.fitted and key_of(c.run) == key]
        return float(np.median(np.abs(self.loso_err[idx])))

    def family_in_sample(self, family: str) -> Arr:
        """|in-sample error| of the family fit on its runs (each run with its GPU prior moved by the factors)."""
        return np.abs(self.families[family].error)

    def family_loso(self, family: str) -> Arr:
        """|LOSO error| of the cases of ``family`` that its pooled fit priced (their pair left without runs)."""
        idx = [i for i, c in enumerate(self.cases)
               if self.loso_level[i] == "family" and family_of(c.run) == family]
        return np.abs(self.loso_err[idx])


def summarize_modern(cases: list[ModernCase] | None = None) -> ModernSummary:
    """The catalog fits on every fitted case, in-sample predictions, and leave-one-source-out predictions: each
    source left out in turn, the pair and family fits refitted on the other sources, then the source predicted."""
    cases = cases if cases is not None else modern_cases()
    fitted = [c.run for c in cases if c.fitted]
    fits, families = fit_by_key(fitted), fit_by_family(fitted)
    in_sample, _ = predict_with([c.run for c in cases], fits, families)
    loso = np.full(len(cases), np.nan)
    levels = [""] * len(cases)
    for source in sorted({r.source for r in fitted}):
        held = [i for i, c in enumerate(cases) if c.fitted and c.run.source == source]
        rest = [r for r in fitted if r.source != source]
        keys = {key_of(cases[i].run) for i in held}
        refit = fit_by_key([r for r in rest if key_of(r) in keys])
        # families are refitted only for the held pairs left without runs: the others never reach that level
        orphans = {family_of(cases[i].run) for i in held if key_of(cases[i].run) not in refit}
        refam = fit_by_family([r for r in rest if family_of(r) in orphans])
        loso[held], lv = predict_with([cases[i].run for i in held], refit, refam)
        for i, level in zip(held, lv, strict=True):
            levels[i] = level
    return ModernSummary(cases, fits, families, in_sample, loso, levels)


# --------------------------------------------------------------------------------------------- catalog


FIT_METHOD = (
    "madmax_opt.studies.fit.fit on data/validation/modern/training.yaml (`madmax-opt validate`): coordinate descent "
    "over fit.FIT_GRID from the GPU prior, objective mean |ln(predicted/measured)| + 0.05 x sum |ln(value/prior)| (fit.PRIOR_WEIGHT); "
    "only the parameters the runs determine (fit.determined) are fitted"
)


def framework_calibrations(s: ModernSummary) -> dict[Key, FrameworkCalibration]:
    """The catalog entries (gpus.yaml ``frameworks``) this summary's fits stand for."""
    out: dict[Key, FrameworkCalibration] = {}
    for key, f in sorted(s.fits.items()):
        idx = [i for i, c in enumerate(s.cases) if c.fitted and key_of(c.run) == key]
        record = FrameworkFit(
            runs=len(idx), sources=sorted({s.cases[i].run.source for i in idx}), fitted=list(f.params),
            in_sample_median_err=round(float(np.median(np.abs(s.in_sample_err[idx]))), 4),
            loso_median_err=round(s.loso_median(key), 4), method=FIT_METHOD,
        )
        out[key] = FrameworkCalibration(**f.params, fit=record)
    return out


FAMILY_METHOD = (
    "madmax_opt.studies.fit.fit on the family's runs of data/validation/modern/training.yaml (`madmax-opt validate`), "
    "pooled over GPUs and frameworks: one factor per parameter on each GPU's datasheet prior, objective and grids as "
    "the pair fits; loso_median_err = median |error| of the cases this fit priced when their source was left out "
    "(their pair then had no runs)"
)
FAMILIES_FILE = ("data", "training_families.yaml")


def family_calibrations(s: ModernSummary) -> dict[str, FamilyCalibration]:
    """The catalog entries (data/training_families.yaml) this summary's family fits stand for."""
    out: dict[str, FamilyCalibration] = {}
    for family, f in s.families.items():
        runs = [c.run for c in s.cases if c.fitted and family_of(c.run) == family
                and fit_mod.prior(c.run.gpu).prior_kind == "datasheet"]
        loso = s.family_loso(family)
        record = FrameworkFit(
            runs=len(runs), sources=sorted({r.source for r in runs}), fitted=list(f.factors),
            in_sample_median_err=round(float(np.median(s.family_in_sample(family))), 4),
            loso_median_err=round(float(np.median(loso)), 4) if len(loso) else None, method=FAMILY_METHOD,
        )
        frameworks = sorted({r.framework for r in runs})
        factors = {k: round(v, 6) for k, v in f.factors.items()}
        out[family] = FamilyCalibration(name=family, frameworks=frameworks, factors=factors,
                                        fit=record)
    return out


def families_yaml(s: ModernSummary) -> str:
    """The text of data/training_families.yaml."""
    body = {name: fc.model_dump(mode="json", exclude={"name"}, exclude_none=True)
            for name, fc in family_calibrations(s).items()}
    return ("# Training calibration pooled per framework family (io.calibration.family_fit prices a (GPU, framework)\n"
            "# without a fit of its own with it: factors on the GPU's datasheet prior). Written by\n"
            "# madmax_opt.studies.validation_modern.families_yaml from data/validation/modern/training.yaml; do not\n"
            "# edit by hand (results/validation/modern.md shows the fit).\n"
            + yaml.safe_dump(body, sort_keys=False, width=110))


def catalog_yaml(s: ModernSummary) -> dict[str, str]:
    """Per GPU, the ``frameworks:`` block to paste into data/gpus.yaml (indented for a GPU entry)."""
    blocks: dict[str, list[str]] = {}
    for (gpu, framework), fc in framework_calibrations(s).items():
        lines = blocks.setdefault(gpu, ["  frameworks:"])
        lines.append(f"    {framework}:")
        for name, value in fc.overrides().items():
            lines.append(f"      {name}: {value:g}")
        f = fc.fit
        lines += [
            "      fit:",
            f"        runs: {f.runs}",
            f"        sources: [{', '.join(f.sources)}]",
            f"        fitted: [{', '.join(f.fitted)}]",
            f"        in_sample_median_err: {f.in_sample_median_err}",
            f"        loso_median_err: {f.loso_median_err}",
            "        method: >-",
            *textwrap.wrap(f.method, 110, initial_indent="          ", subsequent_indent="          "),
        ]
    return {gpu: "\n".join(lines) for gpu, lines in blocks.items()}


def update_catalog_text(text: str, blocks: dict[str, str]) -> str:
    """gpus.yaml text with each GPU's ``frameworks:`` block replaced (or inserted before its ``source:`` key)."""
    lines = text.split("\n")
    out: list[str] = []
    gpu: str | None = None
    skipping = False
    for line in lines:
        if line and not line.startswith((" ", "#")) and line.endswith(":"):
            gpu, skipping = line[:-1], False
        if skipping and line.startswith("  ") and not line.startswith("   "):
            skipping = False  # the next key of the GPU entry ends the old block
        if line.startswith("  frameworks:") and gpu in blocks:
            skipping = True
            continue
        if line.startswith("  source:") and gpu in blocks:
            out.extend(blocks[gpu].split("\n"))
        if not skipping:
            out.append(line)
    return "\n".join(out)


def write_catalog(s: ModernSummary) -> list[Path]:
    """Write the fits into the package's catalog: gpus.yaml ``frameworks:`` blocks and training_families.yaml."""
    data = Path(str(resources.files("madmax_opt").joinpath("data")))
    gpus_path, families_path = data / "gpus.yaml", data.joinpath(*FAMILIES_FILE[1:])
    gpus_path.write_text(update_catalog_text(gpus_path.read_text(), catalog_yaml(s)))
    families_path.write_text(families_yaml(s))
    return [gpus_path, families_path]
