"""``madmax-opt calibrate`` on serving runs: fit the serving parameters of each (GPU, serving framework) to a
user's measured benchmark runs and write them as the ``serving`` entries of an overlay.

Runs file (``serving_runs:``, alone or next to the training ``runs:``)::

    serving_runs:
      - name: llama8b-tp1                     # optional
        model: llama3-8b                      # catalog name or an inline model mapping
        hardware: {gpu: h100-sxm, gpus: 8}    # or {system: dgx-h100, gpus: 8}: the GPUs of the deployment
        task: {prompt_len: 1024, output_len: 1024, precision: bf16}
        framework: vllm                       # vllm | sglang | tensorrt-llm | atom (default vllm)
        plan: {dp: 8, tp: 1}                  # a serving plan (ep, precision, max_num_seqs); batch is set below
        concurrency: 256                      # clients of the closed loop (--max-concurrency) over the deployment
        measured: {output_tokens_per_s: 21000, ttft_ms: 180, tpot_ms: 11.5}   # any of the three, or
        # measured: {bench: bench.json}       # a vllm bench serve / sglang.bench_serving result (io.run_logs),
        #                                     # relative to this file: output_throughput, median TTFT and TPOT,
        #                                     # and concurrency from max_concurrency when not given

Each run is priced as ``evaluate`` prices its plan, with the closed loop of InferenceX (``inferencex``): each of
the dp replicas holds concurrency / dp requests, output tokens/s = C o / (TTFT + (o - 1) TPOT). Fitted metrics:
output tokens/s per GPU, TTFT and TPOT (median), as measured.

Rule (the prior when runs are few): the MAP fit of ``serving_fit.fit`` on throughput and TPOT (``FITTED``; TTFT is
reported, not fitted) around the calibration that prices the pair now (its catalog fit, else the composition ``resolve_params`` gives it), with fit-serving's prior widths
(``serving_fit.SIGMA``: ln-sigma 1 on efficiencies, 100 us on the layer overhead, 2 ms on the prefill overhead).
Each metric adds one squared log error against the prior's eight terms, so with one or two runs the prior holds
every direction the runs do not determine and the fit moves only what they measure; with many runs the runs
dominate. Leave-one-run-out: each run's metrics predicted by the fit of the other runs (same rule).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.calibration import ServingOverlayEntry, ServingOverlayFit
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.run_logs import read_bench_json
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.io.validate import validate
from madmax_opt.model.inference import INVALID_REASONS
from madmax_opt.model.serving_calibration import ServingParams
from madmax_opt.model.spec import Strict
from madmax_opt.search.serving_space import ServingModel, ServingPlan
from madmax_opt.studies import serving_fit
from madmax_opt.studies.inferencex import PreparedEngine, closed_loop_rate

METRICS: tuple[str, ...] = ("tput_per_gpu", "ttft", "tpot")
# The metrics the fit moves the parameters on (as fit-serving on InferenceX): output tokens/s per GPU and TPOT. TTFT
# is priced and reported (before / after / left out) but not fitted: on the InferenceX runs of (b200, sglang,
# deepseek-r1) the model's closed-loop TTFT is off by a median 88 % under the prior (54 % on h200/vllm gpt-oss), the
# queueing a client sees before its first token is not in the model; fitting it raised the held-out error of
# throughput and TPOT there from 8 % to 35 % (tests/test_calibrate_serving.py, README).
FITTED: tuple[str, ...] = ("tput_per_gpu", "tpot")
MAX_RUNS = 1_000  # a run costs ~10 ms per fit iteration; 1,000 runs and their leave-one-out fits stay in minutes
MAX_CONCURRENCY = 1_000_000
# The benchmark's mean prompt and output lengths must match the run's task within 10 %: vLLM's random dataset
# re-tokenises the prompt (a few tokens off); a larger gap means the JSON is another run's.
LENGTH_TOLERANCE = 0.10
RULE = ("MAP fit (studies.serving_fit.fit) on the runs' output tokens/s per GPU and median TPOT (TTFT reported, not "
        "fitted), around the "
        "pair's calibration before the fit, with fit-serving's prior widths (serving_fit.SIGMA): with few runs the "
        "prior holds what they do not measure")


class ServingMeasured(Strict):
    output_tokens_per_s: float | None = Field(None, gt=0, description="generated tokens/s of the whole deployment")
    ttft_ms: float | None = Field(None, gt=0, description="median time to first token")
    tpot_ms: float | None = Field(None, gt=0, description="median time per output token")
    bench: str | None = Field(None, description="benchmark-serving result JSON, relative to the runs file")


class ServingRunSpec(Strict):
    """One run of ``serving_runs``."""

    name: str | None = None
    model: str | dict[str, Any]
    hardware: dict[str, Any]
    task: dict[str, Any]
    framework: str = "vllm"
    plan: ServingPlan
    concurrency: int | None = Field(None, gt=0, le=MAX_CONCURRENCY)
    measured: ServingMeasured


class ServingRunsFile(Strict):
    serving_runs: list[ServingRunSpec] = Field(min_length=1)


@dataclass
class ServingRun:
    """A measured run priced under candidate parameters: (k, 3) = output tokens/s per GPU, TTFT, TPOT."""

    name: str
    source: str
    gpu: str
    framework: str
    gpus: int
    concurrency: int
    engine: PreparedEngine
    measured: dict[str, float]  # metric -> SI value (tokens/s per GPU, s, s)
    _last: tuple[tuple[ServingParams, ...], np.ndarray] | None = field(default=None, repr=False)

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        key = tuple(params)
        if self._last is None or self._last[0] != key:
            t = self.engine.terms(list(params))
            rate = closed_loop_rate(float(self.concurrency), self.engine.model.workload.mean_output, t.ttft_s,
                                    t.tpot_s)
            self._last = (key, np.stack([rate / self.gpus, t.ttft_s, t.tpot_s], axis=1))
        return self._last[1]


@dataclass(frozen=True)
class MetricInfo:
    """One measured metric of a run, as the serving fit reads a case (``serving_cases.CaseInfo``)."""

    id: str
    source: str
    gpu: str
    framework: str
    measured: float

    @property
    def pair(self) -> tuple[str, str]:
        return self.gpu, self.framework


@dataclass
class RunMetric:
    """The fit's case: one metric of a run."""

    case: MetricInfo
    run: ServingRun
    kind: str

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        return self.run.predict_many(params)[:, METRICS.index(self.kind)]

    def error(self, params: ServingParams) -> float:
        return float(self.predict_many([params])[0]) / self.case.measured - 1.0


def metrics_of(run: ServingRun) -> list[RunMetric]:
    return [RunMetric(MetricInfo(f"{run.name}:{k}", run.source, run.gpu, run.framework, v), run, k)
            for k, v in run.measured.items()]


def _measured(spec: ServingRunSpec, gpus: int, task: Any, file: str, field: str) -> tuple[dict[str, float], int]:
    """Metric -> SI value, and the concurrency (the run's, else the benchmark's max_concurrency)."""
    m, conc = spec.measured, spec.concurrency
    values = {"output_tokens_per_s": m.output_tokens_per_s, "ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms}
    if m.bench is not None:
        if any(v is not None for v in values.values()):
            raise ProblemError("both bench and measured values; allowed: one of them (which is right cannot be "
                               "told)", file=file, field=f"{field}.measured")
        b = read_bench_json(Path(file).parent / m.bench, file=file, field=f"{field}.measured.bench")
        for name, got, want in (("input", b.mean_input_len, task.prompt_len),
                                ("output", b.mean_output_len, task.output_len)):
            if want is not None and abs(got / want - 1.0) > LENGTH_TOLERANCE:
                raise ProblemError(f"the benchmark's mean {name} length is {got:.0f} tokens, the task's "
                                   f"{want}; allowed: within {100 * LENGTH_TOLERANCE:g} % (the result of this run)",
                                   file=file, field=f"{field}.measured.bench")
        values = {"output_tokens_per_s": b.output_throughput, "ttft_ms": b.median_ttft_ms,
                  "tpot_ms": b.median_tpot_ms}
        if conc is None:
            conc = b.max_concurrency
        elif b.max_concurrency is not None and b.max_concurrency != conc:
            raise ProblemError(f"concurrency {conc}, the benchmark's max_concurrency {b.max_concurrency}; allowed: "
                               "the same", file=file, field=f"{field}.concurrency")
    if conc is None:
        raise ProblemError("missing; allowed: the clients of the closed loop (--max-concurrency), an integer > 0",
                           file=file, field=f"{field}.concurrency")
    out: dict[str, float] = {}
    if values["output_tokens_per_s"] is not None:
        out["tput_per_gpu"] = values["output_tokens_per_s"] / gpus
    if values["ttft_ms"] is not None:
        out["ttft"] = values["ttft_ms"] / 1e3
    if values["tpot_ms"] is not None:
        out["tpot"] = values["tpot_ms"] / 1e3
    if not out:
        raise ProblemError("no measurement; allowed: output_tokens_per_s, ttft_ms, tpot_ms or bench", file=file,
                           field=f"{field}.measured")
    return out, conc


def serving_runs(data: dict[str, Any], file: str) -> list[ServingRun]:
    """The ``serving_runs`` of a runs file, each checked as ``evaluate`` checks a serving problem and plan."""
    rf: ServingRunsFile = validate(ServingRunsFile, {"serving_runs": data.get("serving_runs")}, file=file)
    if len(rf.serving_runs) > MAX_RUNS:
        raise ProblemError(f"{len(rf.serving_runs):,} runs; allowed: at most {MAX_RUNS:,}", file=file,
                           field="serving_runs")
    cat = serving_catalog()
    out: list[ServingRun] = []
    for i, r in enumerate(rf.serving_runs):
        where = f"serving_runs[{i}]"
        if r.framework not in cat.frameworks:
            raise ProblemError(f"{r.framework!r}; allowed: {', '.join(cat.frameworks)}", file=file,
                               field=f"{where}.framework")
        task = {"kind": "inference", **{k: v for k, v in r.task.items() if k != "kind"}}
        problem = problem_from_dict({"model": r.model, "hardware": r.hardware, "task": task,
                                     "stack": {"framework": r.framework}}, source=f"{file}:{where}")
        if len(problem.hardware) != 1:
            raise ProblemError("a run needs one cluster size; allowed: gpus as one integer", file=file,
                               field=f"{where}.hardware.gpus")
        gpus = problem.hardware[0].gpus
        if r.plan.prefill_replicas:
            raise ProblemError("a disaggregated plan; allowed: prefill_replicas 0 (calibrate fits aggregated "
                               "serving runs)", file=file, field=f"{where}.plan.prefill_replicas")
        if r.plan.gpus != gpus:
            raise ProblemError(f"dp*tp = {r.plan.dp}*{r.plan.tp} = {r.plan.gpus} GPUs; allowed: the run's {gpus}",
                               file=file, field=f"{where}.plan")
        measured, conc = _measured(r, gpus, problem.serving_task, file, where)
        plan = r.plan.model_copy(update={"batch": max(1, math.ceil(conc / r.plan.dp))})
        model = ServingModel(problem)
        engine = PreparedEngine(model, model.arrays([plan]), cat.frameworks[model.framework])
        code = int(engine.terms([cat.prior]).invalid[0])
        if code:
            raise ProblemError(f"invalid plan: {INVALID_REASONS[code]}", file=file, field=f"{where}.plan")
        gpu = problem.hardware[0].gpu.name
        out.append(ServingRun(r.name or f"run {i + 1}", f"{file}#{r.name or i + 1}", gpu, model.framework, gpus,
                              conc, engine, measured))
    return out


@dataclass(frozen=True)
class ServingPairResult:
    """The fit of one (GPU, serving framework): per metric the error before (the pair's calibration), after the
    fit, and left out (the fit of the other runs)."""

    key: tuple[str, str]
    runs: list[ServingRun]
    prior: ServingParams
    prior_level: str
    params: ServingParams
    before_err: dict[str, float]  # metric id -> predicted / measured - 1
    after_err: dict[str, float]
    loo_err: dict[str, float]  # empty for a single run

    def entry(self) -> ServingOverlayEntry:
        ids = list(self.after_err)
        ins = median_err(self.after_err)
        loo = median_err(self.loo_err) if self.loo_err else None
        on = serving_fit.above((("in-sample", ins), ("held-out points", loo or 0.0)))  # each run left out
        record = ServingOverlayFit(
            runs=len(self.runs), sources=sorted({r.source for r in self.runs}), method=RULE,
            in_sample_median_err=round(ins, 4),
            status="uncalibrated" if on else "calibrated", uncalibrated_on=list(on),
            residuals=[round(math.log1p(self.after_err[i]), 4) for i in ids],
            prior=f"{self.key[0]}/{self.key[1]} {self.prior_level} (data/serving_calibration.yaml)",
            metrics=ids, loo_median_err=None if loo is None else round(loo, 4),
            loso_median_err=None if loo is None else round(loo, 4),  # each run is its own source
            loo_errors=[round(self.loo_err[i], 4) for i in ids if i in self.loo_err],
        )
        rounded = ServingParams(**{k: float(f"{v:.4g}") for k, v in self.params.model_dump().items()})
        return ServingOverlayEntry(gpu=self.key[0], framework=self.key[1], params=rounded, fit=record)


def median_err(errors: dict[str, float], kinds: Sequence[str] = FITTED) -> float:
    """Median |error| over the metrics of ``kinds`` (default: the fitted ones); NaN when there are none."""
    vals = [abs(v) for k, v in errors.items() if k.rsplit(":", 1)[-1] in kinds]
    return statistics.median(vals) if vals else float("nan")


def _errors(cases: Sequence[RunMetric], params: ServingParams) -> dict[str, float]:
    return {c.case.id: c.error(params) for c in cases}


def fit_pair(runs: Sequence[ServingRun], prior: ServingParams | None = None,
             sigma: np.ndarray = serving_fit.SIGMA) -> ServingPairResult:
    """Fit one pair's runs around ``prior`` (default: the calibration that prices the pair now) by RULE (prior
    widths ``sigma``), with the leave-one-run-out errors."""
    gpu, framework = runs[0].gpu, runs[0].framework
    level = "given"
    if prior is None:
        prior, level, _ = serving_catalog().resolve(gpu, framework)
    cases = [c for r in runs for c in metrics_of(r)]
    fitted = [c for c in cases if c.kind in FITTED]
    params = serving_fit.fit(fitted, prior, sigma)
    loo: dict[str, float] = {}
    if len(runs) > 1:
        for r in runs:
            rest = [c for c in fitted if c.run is not r]
            held = serving_fit.fit(rest, prior, sigma, start=params)
            loo.update(_errors([c for c in cases if c.run is r], held))
    return ServingPairResult((gpu, framework), list(runs), prior, level, params, _errors(cases, prior),
                             _errors(cases, params), loo)


def calibrate_serving(data: dict[str, Any], file: str) -> list[ServingPairResult]:
    """Every (GPU, serving framework) of the runs file fitted on its runs."""
    groups: dict[tuple[str, str], list[ServingRun]] = {}
    for r in serving_runs(data, file):
        groups.setdefault((r.gpu, r.framework), []).append(r)
    return [fit_pair(rs) for rs in groups.values()]


# ---------------------------------------------------------------------------- real data: InferenceX as user runs


def inferencex_runs(gpu: str, framework: str, model: str) -> list[dict[str, Any]]:
    """The aggregated, non-MTP InferenceX points of (gpu, framework, model) written as ``serving_runs`` entries
    (as a user would write their own benchmark runs): the point's engine (``inferencex.to_point``: mean lengths
    0.9 L, its plan), its concurrency and its measured output tokens/s (per GPU x GPUs), median TTFT and TPOT."""
    from madmax_opt.studies.inferencex import prepared_points, raw_rows

    ttft = {r["id"]: r["metrics"].get("median_ttft_s") for r in raw_rows()}
    out = []
    for pp in prepared_points()[0]:
        p = pp.point
        if p.pair != (gpu, framework) or p.model != model or p.prefill is not None or p.mtp or p.decode is None:
            continue
        e = p.decode
        plan = e.plan.model_dump(mode="json", exclude_defaults=True, exclude={"batch"})
        measured: dict[str, float] = {"output_tokens_per_s": p.measured["tput_per_gpu"] * p.num_gpus,
                                      "tpot_ms": p.measured["tpot"] * 1e3}
        if ttft.get(p.id):
            measured["ttft_ms"] = float(ttft[p.id]) * 1e3
        out.append({"name": p.id, "model": model, "hardware": e.data["hardware"], "task": e.data["task"],
                    "framework": framework, "plan": plan, "concurrency": p.concurrency, "measured": measured})
    return out


@dataclass(frozen=True)
class SliceCheck:
    """Held-out errors of a serving calibration fitted on part of a pair's runs: |predicted / measured - 1| of
    the other runs' metrics (``held``), of the start (``before``), and the full fit's leave-one-run-out."""

    runs: int
    fitted_on: int
    before: dict[str, float]  # metric id of the held-out runs -> error under the prior
    held: dict[str, float]  # the same metrics under the fit of the other half
    loo: dict[str, float]  # every metric, leave-one-run-out of the fit on all runs

    @staticmethod
    def median(errors: dict[str, float], kind: str | None = None) -> float:
        vals = [abs(v) for k, v in errors.items() if kind is None or k.endswith(f":{kind}")]
        return statistics.median(vals) if vals else float("nan")


def slice_check(gpu: str, framework: str, model: str, prior: ServingParams, file: str = "inferencex-slice",
                sigma: np.ndarray = serving_fit.SIGMA, loo: bool = True) -> SliceCheck:
    """Fit the pair on its even-numbered InferenceX runs around ``prior``, predict the odd-numbered ones; and (with
    ``loo``) the leave-one-run-out errors of the fit on all of them."""
    runs = serving_runs({"serving_runs": inferencex_runs(gpu, framework, model)}, file)
    part = [r for i, r in enumerate(runs) if i % 2 == 0]
    rest = [c for i, r in enumerate(runs) if i % 2 == 1 for c in metrics_of(r)]
    fitted = fit_pair(part, prior, sigma)
    whole = fit_pair(runs, prior, sigma).loo_err if loo else {}
    return SliceCheck(len(runs), len(part), _errors(rest, prior), _errors(rest, fitted.params), whole)
