"""Inference validation: the serving model against the measured 2023 serving runs of data/validation
(TensorRT-LLM v0.6.1, FasterTransformer), written to results/validation/inference.md by
``madmax-opt validate-inference``.

The model and the solver are imported inside the functions that need them.
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console

if TYPE_CHECKING:
    from madmax_opt.analysis.serving_records import ServingRecord
    from madmax_opt.model.problem import Problem
    from madmax_opt.model.serving_calibration import ServingCatalog

VALIDATION_FILE = "inference_measured.yaml"
BAR_THROUGHPUT = 0.15  # median |error| on output tokens/s (issue 4)
BAR_LATENCY = 0.20  # median |error| on TTFT / prefill / per-token latency (issue 4)
THROUGHPUT_METRICS = ("out_tokens_per_s_per_gpu", "out_tokens_per_s_total")
# Both measured stacks (TensorRT-LLM v0.6.1, FasterTransformer) are NVIDIA C++ runtimes: framework tensorrt-llm
# (whole-request KV reservation, max batch 2048); priced by ``catalog_2023`` unless a calibration is given.
MEASURED_FRAMEWORK = "tensorrt-llm"
# TensorRT-LLM v0.6.1 docs/source/performance.md: the engines are built with --enable_fp8 --fp8_kv_cache on H100
# (the KV cache is fp8 too) and run with TRTLLM_ENABLE_XQA=1 (the GQA-aware decode kernel).
FP8_KV_SOURCES = ("TRTLLM-0.6.1",)


@dataclass(frozen=True)
class ValidationRow:
    case: dict[str, Any]
    metric: str
    measured: float
    predicted: float
    record: ServingRecord

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def throughput(self) -> bool:
        return self.metric in THROUGHPUT_METRICS


def _model_dict(name: str, m: dict[str, Any]) -> dict[str, Any]:
    """A measured model: SwiGLU -> LLaMA conventions (RMSNorm, no biases, untied); GELU -> GPT (LayerNorm, biases,
    tied embeddings). Only the shapes are in the data file; these conventions are assumptions."""
    llama = m["ffn_kind"] == "swiglu"
    return {
        **m,
        "name": name,
        "family": "llm",
        "norm": "rmsnorm" if llama else "layernorm",
        "bias": not llama,
        "tied_embeddings": not llama,
        "source": f"data/validation/{VALIDATION_FILE}",
    }


def case_problem(case: dict[str, Any], models: dict[str, Any], gqa_decode_kernel: bool = True) -> Problem:
    """One measured case as an inference problem on the GPU's standard node (``standard_system`` in data/gpus.yaml)."""
    from madmax_opt.io.problem import problem_from_dict

    kv = "fp8" if case["precision"] == "fp8" and case["src"] in FP8_KV_SOURCES else None
    task: dict[str, Any] = {
        "kind": "inference",
        "prompt_len": case["in"],
        "output_len": case.get("out", 1),
        "precision": case["precision"],
        "kv_precision": kv,
    }
    return problem_from_dict(
        {
            "model": _model_dict(case["model"], models[case["model"]]),
            "hardware": {"gpu": case["gpu"], "gpus": case["tp"]},
            "task": task,
            "stack": {"gqa_decode_kernel": gqa_decode_kernel, "framework": MEASURED_FRAMEWORK},
        },
        source=f"{VALIDATION_FILE}#{case['id']}",
    )


def _predicted(metric: str, rec: ServingRecord) -> float:
    if metric == "out_tokens_per_s_per_gpu":
        return rec.output_tokens_per_s_per_gpu
    if metric == "out_tokens_per_s_total":
        return rec.output_tokens_per_s
    if metric == "first_token_latency_s":
        return rec.ttft_s
    if metric == "prefill_s":
        return rec.prefill_s
    if metric == "decode_s_per_token":
        return rec.decode_step_s
    raise ValueError(f"unknown measured metric {metric!r}")


# The measured stacks (TensorRT-LLM v0.6.1, Dec 2023; FasterTransformer) decode with masked multi-head attention
# that streams each KV head once per query head: TRT-LLM's GQA-aware XQA kernel was experimental then, enabled only
# "where our tests displayed performance benefits" (v0.6.1 performance.md), generally available for Llama-2 70B from
# v0.8-0.9 (2024). The measured long-output decode steps confirm it: 480 x 128/2048 tokens on 4 H100 (fp8) take
# 81 ms per step, slower than even the per-query-head KV roofline (about 59 ms) and 7x the GQA-aware one (12 ms).
MEASURED_STACK_GQA_DECODE_KERNEL = False


def catalog_2023() -> ServingCatalog:
    """The per-GPU calibration of data/gpus.yaml (the training fit, no serving overheads) as a serving catalog: what
    this 2023 set was validated with before the modern serving fit (issue 11), kept as its reference."""
    from madmax_opt.io import catalog
    from madmax_opt.io.serving_catalog import serving_catalog
    from madmax_opt.model.serving_calibration import FitRecord, ServingCalibrationEntry, ServingParams

    entries = []
    for name, gpu in catalog.gpus().items():
        c = gpu.calibration
        params = ServingParams(gemm_eff=c.gemm_eff, attn_eff=c.attn_eff, hbm_eff=c.hbm_eff,
                               layer_overhead_s=c.layer_overhead_s, prefill_overhead_s=0.0,
                               grouped_gemm_ratio=c.grouped_gemm_ratio, comm_eff=1.0)
        fit = FitRecord(runs=0, sources=[], method="data/gpus.yaml calibration (training fit)")
        entries.append(ServingCalibrationEntry(gpu=name, framework=MEASURED_FRAMEWORK, params=params, fit=fit))
    # a fixed reference, not the tool's pricing: no hardware order (model/serving_calibration.ordered) on top of it
    return serving_catalog().model_copy(update={"entries": entries, "gpu_specs": {}})


def validation_rows(
    shared: Path | None = None,
    gqa_decode_kernel: bool = MEASURED_STACK_GQA_DECODE_KERNEL,
    calibration: ServingCatalog | None = None,
) -> list[ValidationRow]:
    """Every (case, measured metric) of the shared file, predicted by the same evaluator as the CLI, with the
    2023 reference calibration (``catalog_2023``) unless ``calibration`` is given."""
    from madmax_opt.search.serving import ServingPlan, evaluate_serving
    from madmax_opt.studies.validation import shared_dir

    path = (shared or shared_dir()) / "validation" / VALIDATION_FILE
    data = yaml.safe_load(path.read_text())
    cal = calibration or catalog_2023()
    rows = []
    for case in data["cases"]:
        problem = case_problem(case, data["models"], gqa_decode_kernel)
        plan = ServingPlan(dp=1, tp=case["tp"], pp=1, batch=case["batch"], precision=case["precision"])
        rec = evaluate_serving(problem, [plan], cal)[0]
        for metric, value in case["measured"].items():
            rows.append(ValidationRow(case, metric, float(value), _predicted(metric, rec), rec))
    return rows


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors) if errors else float("nan")


def _verdict(value: float, bar: float) -> str:
    return f"{value:.1%} ({'meets' if value <= bar else 'misses'} the {bar:.0%} bar)"


def _per_gpu_errors(rows: list[ValidationRow]) -> list[float]:
    """Relative errors, the A100 'total' throughputs compared per GPU (see note 1 of the report)."""
    return [
        r.predicted / r.case["tp"] / r.measured - 1.0 if r.metric == "out_tokens_per_s_total" else r.error
        for r in rows
    ]


def summary_errors(rows: list[ValidationRow]) -> tuple[list[float], list[float]]:
    """(throughput errors, latency errors) that the bars are about."""
    errors = _per_gpu_errors(rows)
    thr = [e for r, e in zip(rows, errors, strict=True) if r.throughput]
    lat = [e for r, e in zip(rows, errors, strict=True) if not r.throughput]
    return thr, lat


def render_validation(rows: list[ValidationRow], legacy: list[ValidationRow]) -> str:
    as_per_gpu = _per_gpu_errors(rows)
    thr, lat = summary_errors(rows)
    thr_literal = [r.error for r in rows if r.throughput]
    legacy_thr, legacy_lat = summary_errors(legacy)
    lines = [
        "# Inference validation: predicted vs measured",
        "",
        f"Generated by `madmax-opt validate-inference` ({_dt.date.today().isoformat()}, "
        f"{platform.python_implementation()} {platform.python_version()}). Do not edit by hand.",
        "",
        f"Data: every case of `data/validation/{VALIDATION_FILE}` (TensorRT-LLM v0.6.1 performance tables, "
        "FasterTransformer GPT-13B), each evaluated as a plan (dp 1, the given tp, pp 1, batch, precision) of an "
        "inference problem on the GPU's standard node by the same evaluator as `madmax-opt evaluate`. "
        "Calibration: the per-GPU values of `data/gpus.yaml` (the 2023 reference, `catalog_2023`; the modern "
        "serving fit is compared at the end), nothing fitted to these cases. H100 fp8 cases use an "
        "fp8 KV cache (the benchmark's `--fp8_kv_cache`). Throughput = output tokens/s: the model's continuous-"
        "batching steady state, B o / (o T_decode + B P), equals the static-batch benchmark's B o / (t_prefill(B) "
        "+ o T_decode) when the batch prefills at full efficiency. TTFT at batch 1 = the prefill latency.",
        "",
        "| case | model | GPU | prec | tp | batch | in/out | metric | measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, e in zip(rows, as_per_gpu, strict=True):
        c = r.case
        shown_pred = r.predicted / c["tp"] if r.metric == "out_tokens_per_s_total" else r.predicted
        note = " (per GPU, see note 1)" if r.metric == "out_tokens_per_s_total" else ""
        lines.append(
            f"| {c['id']} | {c['model']} | {c['gpu']} | {c['precision']} | {c['tp']} | {c['batch']} | "
            f"{c['in']}/{c.get('out', '-')} | {r.metric}{note} | {r.measured:.4g} | {shown_pred:.4g} | {e:+.1%} |"
        )
    lines += [
        "",
        "## Summary",
        "",
        f"- Throughput (output tokens/s, {len(thr)} cases): median |error| {_verdict(_median_abs(thr), BAR_THROUGHPUT)}; "
        f"errors {', '.join(f'{e:+.0%}' for e in thr)}.",
        f"- Latency (TTFT, prefill, time per output token; {len(lat)} values): median |error| "
        f"{_verdict(_median_abs(lat), BAR_LATENCY)}; errors {', '.join(f'{e:+.0%}' for e in lat)}.",
        f"- Read literally (note 1), the three A100 throughput numbers would be whole-replica totals and the "
        f"throughput median |error| would be {_median_abs(thr_literal):.1%}.",
        "",
        "## Sensitivity: a GQA-aware decode kernel (today's default stack)",
        "",
        "The table above models the measured 2023 stacks with `stack.gqa_decode_kernel: false` (each query head "
        "streams its KV head: FasterTransformer-style masked MHA; TensorRT-LLM's XQA kernel was experimental in "
        "v0.6.1 and enabled only where it helped). Evidence from the data itself: the 128/2048-token H100 run "
        "decodes a 480-sequence batch in 81 ms per step, slower than the per-query-head KV roofline (about 59 ms) "
        "and 7x the GQA-aware one. With the default `true` (FlashInfer, XQA, vLLM today) the same cases give:",
        "",
        f"- Throughput median |error| {_verdict(_median_abs(legacy_thr), BAR_THROUGHPUT)}; errors "
        f"{', '.join(f'{e:+.0%}' for e in legacy_thr)}.",
        f"- Latency median |error| {_verdict(_median_abs(legacy_lat), BAR_LATENCY)}.",
        "",
        "## Notes",
        "",
        "1. The data file labels the three A100 throughputs `out_tokens_per_s_total`, but the source table "
        '(TensorRT-LLM v0.6.1 `docs/source/performance.md`, "A100 GPUs (FP16)") has the column header '
        '"Throughput (out tok/s/GPU)", like the H100 table. The summary compares them per GPU (predicted total / '
        "tp); the literal reading is given for completeness. The data file should be corrected upstream.",
        "2. Where the model is off, read from the per-term breakdown of `madmax-opt evaluate`: (a) the long-"
        "output throughput cases (2048 generated tokens) measure decode steps much slower than the HBM roofline "
        "of weights + KV cache that the model reaches at `hbm_eff`: the 2023 decode-attention kernels (no split-K "
        "over long contexts, one CTA per sequence and KV head, or per query head; see the sensitivity section); "
        "(b) the H100 batch-1 TTFT at 128 tokens (TensorRT-LLM v0.5 numbers) carries a fixed per-request cost "
        "that only `layer_overhead_s` would model; (c) `layer_overhead_s` and `attn_eff` come from the training "
        "fit (Megatron, Python, 2022 unfused attention), which a C++ inference runtime with fused kernels does "
        "not share: the calibration table below shows the values used.",
        "3. Nothing here is fitted to these cases: the GPU calibration is the training fit, and the inference "
        "model's own constants (8192-token prefill passes, the roofline max, 16-bit attention and LM head) are "
        "fixed and documented in `inference.py`.",
    ]
    lines += ["", "## Calibration used (data/gpus.yaml)", "", *_calibration_table(rows)]
    return "\n".join(lines) + "\n"


def _calibration_table(rows: list[ValidationRow]) -> list[str]:
    out = [
        "| GPU | gemm_eff | attn_eff | hbm_eff | layer_overhead_s |",
        "|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r.case["gpu"] for r in rows):
        c, _, _ = catalog_2023().resolve(name, MEASURED_FRAMEWORK)
        out.append(
            f"| {name} | {c.gemm_eff:.3g} | {c.attn_eff:.3g} | {c.hbm_eff:.3g} | {c.layer_overhead_s:.3g} |"
        )
    return out


def write_validation_report(out_dir: Path) -> Path:
    from madmax_opt.io.serving_catalog import serving_catalog

    rows = validation_rows()
    legacy = validation_rows(gqa_decode_kernel=not MEASURED_STACK_GQA_DECODE_KERNEL)
    modern = validation_rows(calibration=serving_catalog())
    thr, lat = summary_errors(modern)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "inference.md"
    path.write_text(
        render_validation(rows, legacy)
        + "\n## With the modern serving calibration (data/serving_calibration.yaml, tensorrt-llm)\n\n"
        + "The same cases priced by the (GPU, tensorrt-llm) fit on the 2024-25 runs of "
        + "`data/validation/modern/inference.yaml` (TensorRT-LLM 0.9-1.0; A100 has no runs there: pooled fit). "
        + f"Throughput median |error| {_median_abs(thr):.1%} (errors {', '.join(f'{e:+.0%}' for e in thr)}); "
        + f"latency median |error| {_median_abs(lat):.1%}. The 2023 runtime (TensorRT-LLM 0.6.1) is not the one "
        + "fitted: the modern fit's per-layer overhead and collective efficiency come from newer versions.\n"
    )
    return path


console = Console()


def validate_inference_cmd(
    *,
    out: Path,
) -> None:
    """Inference model vs the measured serving runs in data/validation; writes results/validation/inference.md."""
    console.print(f"wrote {write_validation_report(out)}")
