"""The measured serving runs of ``data/validation/modern/inference.yaml`` as serving problems and plans, and their
predictions under a given calibration (fast: each case's model is prepared once, only the calibration changes).

Metric definitions follow the data's PROVENANCE.md (caveat 8):
- ``static`` (TensorRT-LLM 0.9, static batching): output tokens/s per GPU of a batch B run to completion =
  B o / (B P + o T_dec) / GPUs, which is the model's steady state at running batch B;
- ``max_load`` (TensorRT-LLM 0.13 / 1.0, AMD vLLM): total output tokens/s of the TP group at the runtime's running
  batch; offered = the requests of the run (all at once), the running batch is what KV memory and max_num_seqs allow;
- ``ttft`` (batch 1): the prefill latency of one prompt;
- ``e2e`` (AMD / vLLM CI latency tests, fixed batch B): the time to finish the batch = B o / (output tokens/s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.inference import InferenceTerms, ServingArrays, inference_terms
from madmax_opt.model.serving_calibration import CalibrationColumns, ServingFramework, ServingParams
from madmax_opt.search.serving_space import ServingModel, ServingPlan

DATA_FILE = "inference.yaml"
GPUS: dict[str, str] = {"H100 SXM": "h100-sxm", "H200 SXM": "h200-sxm", "MI300X": "mi300x"}
MODELS: dict[str, str] = {
    "llama2_7b": "llama2-7b",
    "llama2_70b": "llama2-70b",
    "mixtral_8x7b": "mixtral-8x7b",
    "falcon_180b": "falcon-180b",
    "gptj_6b": "gptj-6b",
    "llama3_8b": "llama3-8b",
    "llama3_70b": "llama3-70b",
    "llama31_405b": "llama3-405b",
    "qwen3_235b_a22b": "qwen3-235b-a22b",
}
UNLIMITED_REQUESTS = 1_000_000  # "max load" without a stated request count: the queue never empties


class CaseInfo(Protocol):
    """What the serving fit reads of a measured metric (``ServingCase``, ``inferencex.MetricCase``)."""

    @property
    def id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def framework(self) -> str: ...
    @property
    def measured(self) -> float: ...
    @property
    def pair(self) -> tuple[str, str]: ...


class FitCase(Protocol):
    """A measured metric the serving fit prices under candidate calibrations."""

    @property
    def case(self) -> CaseInfo: ...
    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray: ...
    def error(self, params: ServingParams) -> float: ...


@dataclass(frozen=True)
class ServingCase:
    """One measured metric of one run, posed as a serving problem and plan."""

    id: str
    source: str
    gpu: str
    framework: str
    model: str
    kind: str  # static | max_load | ttft | e2e
    measured: float  # SI: tokens/s or seconds
    osl: int
    plan: ServingPlan
    data: dict[str, Any]  # the problem as a dict

    @property
    def moe(self) -> bool:
        return self.model in ("mixtral-8x7b", "qwen3-235b-a22b")

    @property
    def pair(self) -> tuple[str, str]:
        return self.gpu, self.framework


def data_path() -> Path:
    from madmax_opt.studies.validation import shared_dir

    return shared_dir() / "validation" / "modern" / DATA_FILE


def _gpu(name: str) -> str:
    return next(v for k, v in GPUS.items() if name.startswith(k))


def _framework(name: str) -> str:
    return "tensorrt-llm" if name.startswith("TensorRT-LLM") else "vllm"


def _measured(case: dict[str, Any]) -> tuple[str, float]:
    m = case["measured"]
    if "output_tokens_per_sec_per_gpu" in m:
        return "static", float(m["output_tokens_per_sec_per_gpu"])
    if "output_tokens_per_sec_total" in m:
        return "max_load", float(m["output_tokens_per_sec_total"])
    if "throughput_tokens_per_sec" in m:  # AMD: output tokens/s [inferred in the data]
        return "max_load", float(m["throughput_tokens_per_sec"])
    if "first_token_latency_ms" in m:
        return "ttft", float(m["first_token_latency_ms"]) / 1e3
    if "end_to_end_latency_s" in m:
        return "e2e", float(m["end_to_end_latency_s"])
    return "e2e", float(m["e2e_latency_ms_mean"]) / 1e3


def to_case(c: dict[str, Any]) -> ServingCase:
    s = c["serving"]
    kind, measured = _measured(c)
    gpu, framework, model = _gpu(c["hardware"]["gpu"]), _framework(c["stack"]["framework"]), MODELS[
        c["model"]["catalog_key"]
    ]
    tp, ep = int(s["tp"]), int(s["ep"] or 1)
    if kind == "max_load":
        offered = int(s["num_requests"] or s["max_num_seqs"] or UNLIMITED_REQUESTS)
    else:
        offered = int(s["batch_size"])
    precision = c["precision"].split()[0]
    # attention DP for MoE with ep = tp (TensorRT-LLM 1.0 Qwen3 rows: "attention DP enabled"): tp replicas of 1 GPU
    dp, tp_attn = (tp, 1) if ep > 1 and "attention DP" in str(s.get("other", "")) else (1, tp)
    plan = ServingPlan(dp=dp, tp=tp_attn, ep=ep, batch=offered, max_num_seqs=s["max_num_seqs"], precision=precision)
    data = {
        "model": model,
        "hardware": {"gpu": gpu, "gpus": tp},
        "task": {"kind": "inference", "prompt_len": s["isl"], "output_len": s["osl"], "precision": precision},
        "stack": {"framework": framework},
    }
    return ServingCase(c["id"], c["source"]["ref"], gpu, framework, model, kind, measured, s["osl"], plan, data)


@cache
def load_cases() -> tuple[ServingCase, ...]:
    raw = yaml.safe_load(data_path().read_text())
    return tuple(to_case(c) for c in raw["cases"])


@dataclass
class PreparedCase:
    """A case's serving model built once; ``predict_many`` only swaps the calibration."""

    case: ServingCase
    model: ServingModel
    plans: ServingArrays
    framework: ServingFramework
    group: CaseGroup | None = None  # cases sharing model, task and framework: priced in one evaluation

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        """The measured metric predicted under each parameter set: one vectorised evaluation of the cases of its
        group (each case's hardware option repeated once per set, option k priced by ``params[k]``)."""
        slot = next((j for j, c in enumerate(self.group.cases) if c is self), None) if self.group else None
        if self.group is None or slot is None:  # a copy (dataclasses.replace) is priced alone
            return CaseGroup([self]).predict_many(params)[:, 0]
        return self.group.predict_many(params)[:, slot]

    def predict(self, params: ServingParams) -> float:
        return float(self.predict_many([params])[0])

    def error(self, params: ServingParams) -> float:
        return self.predict(params) / self.case.measured - 1.0


def _metric(case: ServingCase, t: InferenceTerms, dp: np.ndarray) -> np.ndarray:
    rate = t.output_tokens_per_s
    if case.kind == "static":
        return np.asarray(rate / t.gpus)
    if case.kind == "max_load":
        return np.asarray(rate)
    if case.kind == "ttft":
        return np.asarray(t.prefill_s)
    return np.asarray(case.osl * t.running_batch * dp / rate)  # e2e of the batch


@dataclass(eq=False)
class CaseGroup:
    """Cases whose problems differ only in hardware and plan: one evaluation prices them all (row = set x case),
    the same numbers as one by one; cached for the last parameter sets (the fit asks every case for the same)."""

    cases: list[PreparedCase]
    _last: tuple[tuple[ServingParams, ...], np.ndarray] | None = None

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        """(k, cases): each case's metric under each parameter set."""
        key = tuple(params)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        k, n = len(params), len(self.cases)
        t, plans = grouped_terms(self.cases[0].model, [(c.model, c.plans) for c in self.cases],
                                 self.cases[0].framework, params)
        out = np.empty((k, n))
        for j, c in enumerate(self.cases):
            rows = np.arange(k) * n + j
            sub = InferenceTerms(**{f.name: _take(getattr(t, f.name), rows) for f in fields(InferenceTerms)})
            out[:, j] = _metric(c.case, sub, plans.dp[rows])
        self._last = (key, out)
        return out


def grouped_terms(model: ServingModel, members: Sequence[tuple[ServingModel, ServingArrays]],
                  framework: ServingFramework, params: Sequence[ServingParams]) -> tuple[InferenceTerms, ServingArrays]:
    """One vectorised evaluation of n engines that share ``model``'s workload, task and stack (each member: its
    model, whose one hardware option it runs on, and its one plan) under k parameter sets: row s x n + j is member
    j priced by ``params[s]``. Returns the terms and the plans they priced."""
    k, n = len(params), len(members)
    table = HardwareTable(tuple(mm.table.options[0] for mm, _ in members) * k)
    cal = CalibrationColumns.of([q for q in params for _ in range(n)], framework)
    plans = ServingArrays.concat([p for _, p in members] * k)
    plans = ServingArrays(**{**plans.__dict__, "hw": np.arange(k * n, dtype=np.int64)})
    return inference_terms(model.workload, model.task, model.problem.stack, table, plans, cal), plans


def _take(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {k: v[rows] for k, v in value.items()}
    return value[rows]


@cache
def prepared_cases() -> tuple[PreparedCase, ...]:
    out = []
    for case in load_cases():
        model = ServingModel(problem_from_dict(case.data, source=f"{DATA_FILE}#{case.id}"))
        framework = serving_catalog().frameworks[case.framework]
        out.append(PreparedCase(case, model, model.arrays([case.plan]), framework))
    groups: dict[str, list[PreparedCase]] = {}
    for c in out:
        key = repr(({k: v for k, v in c.case.data.items() if k != "hardware"}, c.case.framework))
        groups.setdefault(key, []).append(c)
    for members in groups.values():
        g = CaseGroup(members)
        for c in members:
            c.group = g
    return tuple(out)
