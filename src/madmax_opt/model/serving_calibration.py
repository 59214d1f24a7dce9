"""Serving calibration: efficiency parameters per (GPU, serving framework) and each framework's scheduler defaults.

The serving model's kernel-level parameters (GEMM efficiency, attention efficiency, achieved HBM bandwidth, fixed
per-layer time) differ by inference runtime far more than by training stack: TensorRT-LLM, vLLM (CUDA or ROCm) and
SGLang ship different GEMM, attention and all-reduce kernels, CUDA graphs and schedulers. They are fitted per
(GPU, framework) on measured serving runs only (``studies.modern_serving``), stored in
``data/serving_calibration.yaml`` with how they were fitted, and resolved here (``resolve_params``):

    (gpu, framework) fitted on that pair's runs; else, flagged ``uncalibrated``, a composition: the hardware-bound
    efficiencies (GEMM, attention, HBM: the GPU and its kernel libraries) from the GPU's fit pooled over frameworks,
    the runtime-bound ones (overheads, collectives, grouped GEMMs) from the framework's fit pooled over GPUs, and
    whatever neither has from the universal prior of the fit

Hardware order (issue 24; ``ordered``): when GPU A dominates GPU B on every datasheet figure a serving plan is
priced with and both run the same software platform (``dominates``, the one definition training's io/calibration.py
uses, with the fp4 peak added: SERVING_PEAKS; an MI300X is never ordered against an H200: the frameworks' ROCm builds
run other attention, GEMM and MoE kernels than their CUDA builds, docs/serving.md), A's resolved rates under a framework are no worse than B's: GEMM rate (gemm_eff x the GEMM peak of
every precision both run), attention rate (attn_eff x the 16-bit peak), HBM rate (hbm_eff x bandwidth),
grouped-GEMM ratio, collective efficiency and speculative acceptance at least B's, per-layer and per-prefill
overheads at most B's. The pair resting on fewer runs moves (``trust``: the user's overlay > a catalog pair fit > a
pair fit whose own error is above 30 % > pooled / family / composed > prior); on a tie the dominating one is raised. Records name every pair a
calibration was raised or lowered to (``ordered``).

Records name the level that priced them (``calibration`` block of every serving record).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from madmax_opt.core.errors import ProblemError
from madmax_opt.core.numeric import Arr
from madmax_opt.model.hardware import CalibrationRecord, HardwareOption
from madmax_opt.model.hardware_spec import hardware_order
from madmax_opt.model.serving_workload import PRECISIONS, gemm_precision
from madmax_opt.model.spec import GPU, ServingFrameworkName, Stack

SERVING_FRAMEWORKS: tuple[str, ...] = get_args(ServingFrameworkName)
DEFAULT_SERVING_FRAMEWORK = "vllm"
ANY = "*"  # gpu "*": a framework's fit pooled over GPUs; framework "*": a GPU's fit pooled over frameworks
ANY_GPU = ANY
HARDWARE_FIELDS: tuple[str, ...] = ("gemm_eff", "attn_eff", "hbm_eff")  # set by the GPU and its kernel libraries


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServingParams(_Strict):
    """The fitted quantities (SI): fractions of datasheet peaks and a fixed time per transformer layer pass."""

    gemm_eff: float = Field(gt=0.0, le=1.0, description="fraction of the GEMM precision's peak at large shapes")
    attn_eff: float = Field(gt=0.0, le=1.0, description="fraction of the 16-bit peak reached by attention kernels")
    hbm_eff: float = Field(gt=0.0, le=1.0, description="fraction of HBM bandwidth reached when streaming weights/KV")
    layer_overhead_s: float = Field(
        ge=0.0, description="fixed time per transformer layer per pass: launches, TP all-reduce latency, scheduling"
    )
    prefill_overhead_s: float = Field(
        ge=0.0, description="fixed time per prefill pass: request scheduling, sampling, host-device synchronisation"
    )
    grouped_gemm_ratio: float = Field(
        gt=0.0, le=1.0, description="MoE grouped-GEMM efficiency relative to gemm_eff (routed experts)"
    )
    comm_eff: float = Field(
        gt=0.0, le=2.0, description="the runtime's collective bandwidth relative to the catalog's NCCL bus bandwidth"
    )
    spec_acceptance: float = Field(
        0.6, gt=0.0, le=1.0, description="speculative decoding (MTP / EAGLE): probability a draft token is accepted "
        "given the previous one was (fitted on runs with drafts; the prior's value elsewhere)"
    )


class FitRecord(_Strict):
    """How a parameter set was fitted: which runs, which method, and its error on them and on unseen sources."""

    runs: int = Field(ge=0)
    sources: list[str]
    method: str
    in_sample_median_err: float | None = None
    loso_median_err: float | None = Field(None, description="leave-one-source-out median |error| of these runs")
    logo_median_err: float | None = Field(None, description="leave-one-GPU-out median |error| of these runs")
    kfold_median_err: float | None = Field(
        None, description="median |error| of these runs as held-out points (5 folds, each refitted without it)"
    )
    status: Literal["calibrated", "uncalibrated"] = Field(
        "calibrated", description="uncalibrated: the in-sample, held-out-point (5-fold) or leave-one-source-out "
        "median |error| exceeds 30 %, over all its runs or (5-fold, leave one source out) over the runs of one of its "
        "sources or data sets (kfold_by_group, loso_by_group); uncalibrated_on says which"
    )
    uncalibrated_on: list[str] = Field(
        default_factory=list, description="what exceeds 30 % (status uncalibrated): 'in-sample', 'held-out points' "
        "(5-fold, all runs or one source or data set), 'unseen sources' (leave-one-source-out: runs of a source the "
        "fit never saw, e.g. another model or benchmark)"
    )
    kfold_by_group: dict[str, float] = Field(
        default_factory=dict, description="held-out-point (5-fold) median |error| of the pair's runs per source and "
        "per data set (inference.yaml, inferencex.yaml)"
    )
    loso_by_group: dict[str, float] = Field(
        default_factory=dict, description="leave-one-source-out median |error| of the pair's runs per source and per "
        "data set (a source's runs are always predicted by fits that never saw it)"
    )
    fallback_kfold_median_err: float | None = Field(
        None, description="held-out-point (5-fold) median |error| of the same runs priced by the fallback (the "
        "composition of the GPU's or its family's and the framework's pooled fits, as for a pair without runs)"
    )
    priced_by: Literal["pair", "fallback"] = Field(
        "pair", description="fallback: an uncalibrated pair whose fallback is better held out is priced by the "
        "fallback, not by these parameters (which stay in the record)"
    )
    residuals: list[float] = Field(
        default_factory=list, description="ln(predicted / measured) of each run in sample (error bars)"
    )
    own_fit_uncalibrated: bool = Field(
        False, description="the pair's own fit, before the hardware order, errs above 30 % as ``status`` measures "
        "it: it ranks below the well-fitted pairs in the hardware order (``trust``)"
    )


UNSEEN_SOURCES = "unseen sources"  # FitRecord.uncalibrated_on: leave-one-source-out median |error| above 30 %


class IntervalFactors(_Strict):
    """An 80 % interval as factors on a prediction (core/intervals.Interval) with its coverage on left-out runs."""

    lo: float = Field(gt=0.0, le=1.0)
    hi: float = Field(ge=1.0)
    runs: int = Field(ge=0, description="held-out residuals the interval was built from")
    held_out_by: str = Field(description="how the residuals were held out: fold (5-fold refits of the pairs), gpu "
                             "(each GPU left out: pooled fits), source (the prior: never fitted)")
    coverage: float | None = Field(
        None, description="leave one source out (issue 24): share of each source's runs inside the interval built "
        "from the other sources' residuals"
    )
    group_coverage: float | None = Field(
        None, description="the same with the residuals' own groups (fold, gpu) in place of sources"
    )
    coverage_runs: int = 0


INTERVAL_LEVELS: tuple[str, ...] = ("calibrated", "family", "prior")
INTERVAL_METRICS: tuple[str, ...] = ("throughput", "tpot")


def interval_level(level: str) -> str:
    """The interval level of a resolved calibration level (``resolve_params``): the pair's own fit, the pooled
    fits that stand in for a pair without runs (family:NAME, composed, gpu- / framework-pooled), or the prior."""
    return level if level in ("calibrated", "prior") else "family"


def record_interval(label: dict[str, Any], tpot_s: float, tokens_per_s: float,
                    tokens_per_s_per_gpu: float) -> dict[str, Any] | None:
    """A serving record's interval block from its calibration label's factors (``calibration_columns``): the
    measured value lies in [lo x predicted, hi x predicted] with the stated coverage; None without factors."""
    iv = label.get("interval")
    if not iv:
        return None
    out: dict[str, Any] = {"coverage": iv["coverage"], "level": iv["level"]}
    if "tpot" in iv:
        out["tpot_s"] = [tpot_s * iv["tpot"][0], tpot_s * iv["tpot"][1]]
    if "throughput" in iv:
        lo, hi = iv["throughput"]
        out["output_tokens_per_s"] = [tokens_per_s * lo, tokens_per_s * hi]
        out["output_tokens_per_s_per_gpu"] = [tokens_per_s_per_gpu * lo, tokens_per_s_per_gpu * hi]
    return out


class ServingCalibrationEntry(_Strict):
    gpu: str = Field(description=f"GPU catalog key, or {ANY_GPU!r} for the framework's pooled fit")
    framework: str
    params: ServingParams
    fit: FitRecord


class ServingFramework(_Strict):
    """Scheduler behaviour of a serving runtime (defaults as shipped; not fitted)."""

    kv_reservation: Literal["full", "on_demand"] = Field(
        description="full: a request reserves KV blocks for prompt + all output tokens when admitted; "
        "on_demand: blocks are allocated as the sequence grows (preempting when the cache is full)"
    )
    max_num_seqs: PositiveInt | None = Field(None, description="default cap on the running batch; null = KV-bound")
    source: str


class ServingCatalog(_Strict):
    """The contents of ``data/serving_calibration.yaml``."""

    prior: ServingParams = Field(description="universal prior of the fit (used where a framework has no runs)")
    prior_source: str
    frameworks: dict[str, ServingFramework]
    gpu_families: dict[str, list[str]] = Field(
        default_factory=dict, description="GPU family -> GPUs: a GPU without runs takes its family's pooled "
        "hardware efficiencies (same kernel libraries and architecture generation)"
    )
    gpu_families_source: str = ""
    entries: list[ServingCalibrationEntry] = []
    interval_coverage: float = Field(0.8, gt=0.0, lt=1.0, description="coverage of the intervals below")
    intervals: dict[str, dict[str, IntervalFactors]] = Field(
        default_factory=dict, description="interval level (calibrated, family, prior) -> metric (throughput, tpot) "
        "-> factors from the held-out residuals of that level (studies/serving_intervals.py)"
    )

    gpu_specs: dict[str, GPU] = Field(
        default_factory=dict, exclude=True, description="the GPU catalog the hardware order ranges over (set by "
        "io/serving_catalog.py, not stored in the file); empty: no ordering"
    )
    user_pairs: list[tuple[str, str]] = Field(
        default_factory=list, exclude=True, description="(gpu, framework) pairs fitted by the user (an overlay): "
        "never moved by the hardware order"
    )

    def interval_factors(self, level: str) -> dict[str, Any] | None:
        """The factors a record priced at ``level`` carries (``record_interval``); None without intervals."""
        key = interval_level(level)
        got = self.intervals.get(key)
        if not got:
            return None
        return {"coverage": self.interval_coverage, "level": key,
                **{m: [f.lo, f.hi] for m, f in got.items()}}

    def gpu_family_of(self) -> dict[str, str]:
        return {g: name for name, gpus in self.gpu_families.items() for g in gpus}

    def resolve(self, gpu: str, framework: str) -> tuple[ServingParams, str, FitRecord | None]:
        """(parameters, level, fit) that price a GPU under a framework, hardware order applied (``resolve_ordered``)."""
        params, level, fit, _ = self.resolve_ordered(gpu, framework)
        return params, level, fit

    def resolve_own(self, gpu: str, framework: str) -> tuple[ServingParams, str, FitRecord | None]:
        """(parameters, level, fit) for a GPU and framework before the hardware order (``resolve_params``); the fit
        record is the pair's, else the framework's pooled one. A pair whose record says ``priced_by: fallback`` is
        priced as a pair without runs (its fallback level) and keeps its own (uncalibrated) record."""
        by_key = {(e.gpu, e.framework): e for e in self.entries}
        pricing = {k: e.params for k, e in by_key.items() if e.fit.priced_by == "pair"}
        params, level = resolve_params(gpu, framework, pricing, self.prior, self.gpu_family_of().get(gpu))
        entry = by_key.get((gpu, framework)) or by_key.get((ANY, framework))
        return params, level, entry.fit if entry is not None else None

    def resolve_ordered(self, gpu: str, framework: str, spec: GPU | None = None
                        ) -> tuple[ServingParams, str, FitRecord | None, list[str]]:
        """``resolve_own`` then the hardware order against every catalog GPU (``ordered``; ``spec``: the GPU's
        figures when it is not the catalog's, e.g. a derived what-if GPU); the last item names the moves."""
        params, level, fit = self.resolve_own(gpu, framework)
        spec = spec or self.gpu_specs.get(gpu)
        if spec is None or not self.gpu_specs:
            return params, level, fit, []
        users = set(self.user_pairs)

        def own(name: str) -> tuple[ServingParams, int]:
            p, lv, f = (params, level, fit) if name == gpu else self.resolve_own(name, framework)
            return p, trust(lv, (name, framework) in users, f is not None and f.own_fit_uncalibrated)

        got, moves = ordered(spec, framework, own, self.gpu_specs)
        return got, level, fit, moves


def compose(hardware: ServingParams, runtime: ServingParams) -> ServingParams:
    """The hardware-bound fields of ``hardware`` with the runtime-bound fields of ``runtime``."""
    fields = ServingParams.model_fields
    return ServingParams(**{k: getattr(hardware if k in HARDWARE_FIELDS else runtime, k) for k in fields})


def resolve_params(
    gpu: str,
    framework: str,
    fitted: dict[tuple[str, str], ServingParams],
    prior: ServingParams,
    family: str | None = None,
) -> tuple[ServingParams, str]:
    """(parameters, level): the pair's fit (``calibrated``), else the GPU's pooled hardware efficiencies (a GPU
    without runs: its family's, level ``family:NAME``) with the framework's pooled runtime parameters
    (``composed``, ``gpu-pooled`` or ``framework-pooled`` when only one of them has runs), else the prior."""
    if (gpu, framework) in fitted:
        return fitted[(gpu, framework)], "calibrated"
    by_gpu, by_fw = fitted.get((gpu, ANY)), fitted.get((ANY, framework))
    if by_gpu is None and family is not None and (f"family:{family}", ANY) in fitted:
        return compose(fitted[(f"family:{family}", ANY)], by_fw or prior), f"family:{family}"
    level = {(True, True): "composed", (True, False): "gpu-pooled", (False, True): "framework-pooled"}.get(
        (by_gpu is not None, by_fw is not None), "prior"
    )
    return compose(by_gpu or by_fw or prior, by_fw or prior), level


SERVING_PEAKS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp4")  # the peaks dominance compares for serving
RAISED_BETTER: tuple[str, ...] = ("grouped_gemm_ratio", "comm_eff", "spec_acceptance")  # ratios: higher is faster
LOWER_BETTER: tuple[str, ...] = ("layer_overhead_s", "prefill_overhead_s")
FIELD_CAP: dict[str, float] = {"comm_eff": 2.0}  # every other efficiency and ratio is at most 1


def trust(level: str, user: bool = False, flagged: bool = False) -> int:
    """How much a resolved calibration rests on runs (io/calibration.trust, with one more step): 4 the user's own
    fit (an overlay), 3 a catalog fit of the pair, 2 a pair fit whose record says ``own_fit_uncalibrated`` (``flagged``:
    its own fit, before the order, errs above 30 % on its runs or on one source or data set), 1 pooled fits (family:NAME, composed, gpu- /
    framework-pooled), 0 the prior."""
    if level == "calibrated":
        return 4 if user else 2 if flagged else 3
    return 0 if level == "prior" else 1


def _ratios(spec: GPU, other: GPU) -> dict[str, list[float]]:
    """other's figure / spec's figure behind each rate: the GEMM peak of every serving precision both run, the
    16-bit peak (attention), the HBM bandwidth; 1 for the ratios and the overheads."""
    gemm = []
    for p in PRECISIONS:
        mine, theirs = gemm_precision(p, spec.peak_flops), gemm_precision(p, other.peak_flops)
        if mine is not None and theirs is not None:
            gemm.append(float(other.peak_flops[theirs] / spec.peak_flops[mine]))  # type: ignore[index]
    r16 = float(other.peak_flops.get("bf16", 1.0) / spec.peak_flops.get("bf16", 1.0))
    return {"gemm_eff": gemm or [1.0], "attn_eff": [r16], "hbm_eff": [float(other.hbm_bw / spec.hbm_bw)]}


def ordered(spec: GPU, framework: str, own: Callable[[str], tuple[ServingParams, int]],
            gpus: Mapping[str, GPU]) -> tuple[ServingParams, list[str]]:
    """The serving parameters pricing ``spec`` under ``framework`` in the hardware order over ``gpus``
    (hardware_spec.hardware_order with ``bounded`` and SERVING_PEAKS; ``own``: a GPU name's own parameters and
    trust, ``spec.name`` included); also the moves ("raised to GPU/FRAMEWORK: fields")."""
    return hardware_order(spec, own, gpus, bounded, SERVING_PEAKS, lambda name: f"{name}/{framework}")


def bounded(p: ServingParams, spec: GPU, q: ServingParams, other: GPU, raise_: bool) -> tuple[ServingParams, list[str]]:
    """``p`` (pricing ``spec``) raised to (``raise_``: spec dominates other) or lowered to the rates of ``q``
    (pricing ``other``), field by field; also the fields that moved."""
    ratios = _ratios(spec, other)
    out: dict[str, float] = {}
    for name in ServingParams.model_fields:
        cur, theirs = getattr(p, name), getattr(q, name)
        if name in LOWER_BETTER:
            new = min(cur, theirs) if raise_ else max(cur, theirs)
        else:
            r = ratios.get(name, [1.0])
            bound = theirs * (max(r) if raise_ else min(r))  # every precision's rate at least / at most the other's
            new = max(cur, min(FIELD_CAP.get(name, 1.0), bound)) if raise_ else min(cur, bound)
        if new != cur:
            out[name] = new
    return (p.model_copy(update=out) if out else p), sorted(out)


@dataclass(frozen=True)
class CalibrationColumns:
    """Per-hardware-option columns (index with a plan's ``hw``) of the resolved serving calibration."""

    gemm_eff: Arr
    attn_eff: Arr
    hbm_eff: Arr
    layer_overhead_s: Arr
    prefill_overhead_s: Arr
    grouped_gemm_ratio: Arr
    comm_eff: Arr
    spec_acceptance: Arr
    kv_full_reservation: NDArray[np.bool_]
    default_max_num_seqs: Arr  # inf = no cap

    @staticmethod
    def of(params: list[ServingParams], framework: ServingFramework) -> CalibrationColumns:
        def col(name: str) -> Arr:
            return np.array([getattr(p, name) for p in params], dtype=np.float64)

        n = len(params)
        cap = float(framework.max_num_seqs) if framework.max_num_seqs is not None else np.inf
        return CalibrationColumns(
            gemm_eff=col("gemm_eff"),
            attn_eff=col("attn_eff"),
            hbm_eff=col("hbm_eff"),
            layer_overhead_s=col("layer_overhead_s"),
            prefill_overhead_s=col("prefill_overhead_s"),
            grouped_gemm_ratio=col("grouped_gemm_ratio"),
            comm_eff=col("comm_eff"),
            spec_acceptance=col("spec_acceptance"),
            kv_full_reservation=np.full(n, framework.kv_reservation == "full"),
            default_max_num_seqs=np.full(n, cap),
        )


def serving_framework(stack: Stack, *, file: str | None) -> str:
    """The serving framework of ``stack.framework``: vLLM unless set; a training stack is a one-line error."""
    if "framework" not in stack.model_fields_set:
        return DEFAULT_SERVING_FRAMEWORK
    if stack.framework not in SERVING_FRAMEWORKS:
        raise ProblemError(
            f"{stack.framework!r} is a training framework; allowed for inference: {', '.join(SERVING_FRAMEWORKS)}",
            file=file,
            field="stack.framework",
        )
    return stack.framework


def calibration_columns(
    options: Sequence[HardwareOption], framework: str, catalog: ServingCatalog
) -> tuple[CalibrationColumns, list[dict[str, Any]]]:
    """Per-option calibration columns and, per option, the trust record of what priced it (``CalibrationRecord``
    plus ``level``: calibrated on this GPU, the framework's pooled fit from other GPUs, or the prior)."""
    resolved = [catalog.resolve_ordered(o.gpu.name, framework, o.gpu) for o in options]
    labels: list[dict[str, Any]] = []
    for o, (_, level, fit, moves) in zip(options, resolved, strict=True):
        rec = CalibrationRecord(gpu=o.gpu.name, framework=framework, status="uncalibrated", ordered=moves)
        if fit is not None:
            rec = CalibrationRecord(
                gpu=o.gpu.name,
                framework=framework,
                # a pair fitted on its runs whose error stays above 30 % is still flagged (issue 23)
                status="calibrated" if level == "calibrated" and fit.status == "calibrated" else "uncalibrated",
                runs=fit.runs,
                sources=list(fit.sources),
                in_sample_median_err=fit.in_sample_median_err,
                loso_median_err=fit.loso_median_err,
                uncalibrated_on=list(fit.uncalibrated_on) if level == "calibrated" else [],
                ordered=moves,
            )
        # a pair whose own fit errs above 30 % on its runs takes the interval of the level whose held-out residuals
        # apply to it: its held-out error exceeds what the calibrated level's residuals cover, so the pooled (family)
        # width; one flagged only on unseen sources keeps the calibrated width for the runs it was fitted on
        held_out_bad = rec.status != "calibrated" and (fit is None or fit.uncalibrated_on != [UNSEEN_SOURCES])
        factors = catalog.interval_factors("family" if level == "calibrated" and held_out_bad else level)
        labels.append({**rec.model_dump(), "level": level, **({"interval": factors} if factors else {})})
    return CalibrationColumns.of([p for p, _, _, _ in resolved], catalog.frameworks[framework]), labels


@dataclass(frozen=True)
class ServingData:
    """What an inference problem takes from the package's catalogs, resolved by io when the problem is loaded."""

    catalog: ServingCatalog  # data/serving_calibration.yaml
    catalog_gpus: Mapping[str, GPU]  # every catalog GPU: errors name those that run a precision
