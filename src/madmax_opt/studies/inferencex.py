"""The InferenceX measured serving points (``data/validation/modern/inferencex.yaml``) posed as serving problems.

Each point becomes one or two serving engines priced by the model of ``madmax-opt evaluate``:

- aggregated (``disagg: false``): one engine of ``num_gpus`` GPUs. Without attention DP the replica is tp GPUs
  (dp = num_gpus / tp) with the row's ep; with attention DP (``dp_attention: true``) attention runs on tp
  replicas of one GPU each (dp = tp, tp = 1) sharing one expert pool of ep GPUs, and each DP rank holds
  concurrency / dp of the requests (the plan's ``batch`` is per replica; TensorRT-LLM's InferenceX scripts set
  ``max_batch_size = CONC / TP`` with attention DP, ``benchmarks/dsr1_fp8_h200_trt_mtp.sh`` @1fc5d73c);
- disaggregated (Dynamo, MoRI): a prefill pool and a decode pool, each priced as its own engine (its own tp, ep,
  attention DP and worker count); decode speed = the decode engine's pure decode round, throughput = the smaller
  of what the decode workers emit and what the prefill workers feed (``Disagg`` below).

Requests: InferenceX draws input and output lengths uniformly from [0.8 L, L] (PROVENANCE.md); the model runs the
mean request, 0.9 L in and 0.9 L out (the serving model's steady state depends on the means only).

Metrics compared: output tokens/s per GPU (every GPU of the run; C clients in a closed loop emit
C o / (TTFT + (o - 1) TPOT), ``closed_loop_rate``) and median TPOT (client-side (e2e - TTFT) / (tokens - 1), which
counts the interleaved prefills a decode step waits for: the model's TPOT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.inference import INVALID_REASONS, InferenceTerms, ServingArrays, inference_terms
from madmax_opt.model.serving_calibration import CalibrationColumns, ServingFramework, ServingParams
from madmax_opt.search.serving_space import ServingModel, ServingPlan
from madmax_opt.studies.serving_cases import grouped_terms

DATA_FILE = "inferencex.yaml"
LENGTH_MEAN = 0.9  # lengths uniform in [0.8 L, L] (InferenceX --random-range-ratio 0.8): mean 0.9 L
GPUS: dict[str, str] = {
    "h100": "h100-sxm", "h200": "h200-sxm", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300",
    "mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x",
}
MODELS: dict[str, str] = {"dsr1": "deepseek-r1", "gptoss": "gpt-oss-120b", "qwen3.5": "qwen3.5-397b-a17b",
                          "minimaxm2.5": "minimax-m2.5"}
# InferenceX framework keys -> serving framework of the engines (Dynamo and MoRI orchestrate disaggregated
# TensorRT-LLM / SGLang engines)
FRAMEWORKS: dict[str, str] = {
    "sglang": "sglang", "trt": "tensorrt-llm", "vllm": "vllm", "atom": "atom",
    "dynamo-trt": "tensorrt-llm", "dynamo-sglang": "sglang", "mori-sglang": "sglang",
}
# Draft tokens verified per decode step with MTP, per framework, as InferenceX launches them: SGLang EAGLE/MTP
# --speculative-num-steps 2 (benchmarks/dsr1_fp8_b200_mtp.sh @574bcd35); TensorRT-LLM num_nextn_predict_layers 3,
# 1 with attention DP (benchmarks/dsr1_fp8_h200_trt_mtp.sh @1fc5d73c); ATOM --method mtp without a count
# (benchmarks/dsr1_fp8_mi355x_atom_mtp.sh @6da3382b): DeepSeek-R1's single MTP module, 1 draft token [inferred]
MTP_DRAFT_TOKENS: dict[str, int] = {"sglang": 2, "tensorrt-llm": 3, "atom": 1, "vllm": 1}
MTP_DRAFT_TOKENS_DP_ATTENTION: dict[str, int] = {"tensorrt-llm": 1}
# KV-cache precision of the InferenceX launches where it is not the serving model's default (the weights'): SGLang on
# Hopper runs FlashInfer MLA without --kv-cache-dtype, and "auto" is the checkpoint's dtype, BF16 for DeepSeek-R1
# (benchmarks/single_node/fixed_seq_len/dsr1_fp8_h200.sh @843c6254; NVIDIA/srt-slurm recipes/h100/8k1k/*.yaml and
# recipes/h200/8k1k/*.yaml @c88ef731; SGLang server_args --kv-cache-dtype: '"auto" will use model data type'); its
# Blackwell and AMD launches set --kv-cache-dtype fp8_e4m3 (dsr1_fp8_b200.sh, dsr1_fp8_mi355x.sh @843c6254), and
# TensorRT-LLM's kv_cache_config dtype fp8 (dsr1_fp8_h200_trt.sh): the default. Keyed by (framework, GPU family).
KV_PRECISION: dict[tuple[str, str], str] = {("sglang", "hopper"): "bf16"}
METRICS: tuple[str, ...] = ("tput_per_gpu", "tpot")
# Data-quality rule, applied to every row before any fit: a stream whose p99 inter-token gap exceeds 20 x its own
# median gap stalled (a hung, preempting or restarting server: ix-0077 has 19 s silences in a 114 s request), and the
# run does not measure the plan. The ratio uses the stream's own gaps because the chunking differs by framework
# (SGLang --stream-interval 10, Dynamo's large chunks: ITL is not TPOT, PROVENANCE.md). Why 20: an ordinary p99 gap
# is an interleaved prefill or a chunk boundary, a few median gaps (median ratio over the 250 rows with ITL: 1.7);
# 20 is a round bound well above that, fixed without looking at the rows' model errors.
STALL_GAP_RATIO = 20.0
STALL_REASON = "data-quality rule, p99 inter-token gap > 20 x the median gap (a stalled stream, a broken run)"


def data_path() -> Path:
    from madmax_opt.studies.validation import shared_dir

    return shared_dir() / "validation" / "modern" / DATA_FILE


def source_key(row: dict[str, Any]) -> str:
    """The row's source (PROVENANCE.md): (A) the dashboard API snapshot, (B) re-hosted CI artifacts, (C) the
    experimental decode-SLO runs."""
    if row.get("experimental"):
        return "experimental"
    return "dashboard" if "dashboard" in str(row["source"].get("dataset", "")) else "ci-artifact"


@dataclass(frozen=True)
class Engine:
    """One serving engine of a point: its problem, its plan (per replica ``batch``) and how many run."""

    data: dict[str, Any]
    plan: ServingPlan
    workers: int


@dataclass(frozen=True)
class Point:
    """One InferenceX row posed as serving engines; ``reason`` says why it cannot be posed (None: expressible)."""

    id: str
    key: str
    source: str
    gpu: str
    framework: str
    model: str
    precision: str
    concurrency: int
    num_gpus: int
    mtp: bool
    disagg: bool
    dp_attention: bool
    measured: dict[str, float]  # tput_per_gpu (output tok/s/GPU), tpot (s)
    decode: Engine | None = None
    prefill: Engine | None = None  # disaggregated rows only
    reason: str | None = None

    @property
    def pair(self) -> tuple[str, str]:
        return self.gpu, self.framework


def _engine(row: dict[str, Any], part: dict[str, Any], model: str, gpu: str, framework: str,
            concurrency: float, draft: int) -> Engine:
    tp_row, ep, dpa = int(part["tp"]), int(part.get("ep") or 1), bool(part.get("dp_attention"))
    workers = int(part.get("num_workers") or 1)
    gpus = int(part["num_gpus"]) // workers
    if dpa:  # attention DP: one replica of one GPU per rank; the MoE spans the engine (EP, or TP-sharded experts
        dp, tp, ep = gpus, 1, gpus  # which hold the same weights per GPU: modelled as ep = the engine's GPUs)
    else:
        dp, tp = gpus // tp_row, tp_row
    isl, osl = int(row["isl"]), int(row["osl"])
    task: dict[str, Any] = {
        "kind": "inference",
        "prompt_len": max(1, round(LENGTH_MEAN * isl)),
        "output_len": max(2, round(LENGTH_MEAN * osl)),
        "precision": row["precision"],
    }
    if draft:
        task["speculative_tokens"] = draft
    kv = KV_PRECISION.get((framework, serving_catalog().gpu_family_of().get(gpu, "")))
    if kv is not None:
        task["kv_precision"] = kv
    batch = max(1, int(np.ceil(concurrency / (workers * dp))))
    data = {"model": model, "hardware": {"gpu": gpu, "gpus": gpus}, "task": task, "stack": {"framework": framework}}
    plan = ServingPlan(dp=dp, tp=tp, ep=ep, batch=batch, precision=row["precision"])
    return Engine(data, plan, workers)


def to_point(row: dict[str, Any]) -> Point:
    m = row["metrics"]
    # two rows give only total tok/s per GPU: output = total x OSL / (ISL + OSL) (input and output lengths are
    # drawn with the same range ratio, so their means keep the ratio)
    out = m.get("output_tok_s_per_gpu") or m["total_tok_s_per_gpu"] * row["osl"] / (row["isl"] + row["osl"])
    measured = {"tput_per_gpu": float(out), "tpot": float(m["median_tpot_ms"]) / 1e3}
    gpu, model = GPUS.get(row["gpu"], row["gpu"]), MODELS.get(row["model_key"], row["model_key"])
    framework = FRAMEWORKS.get(row["framework_key"], row["framework_key"])
    disagg, mtp = bool(row["disagg"]), bool(row["mtp"])
    dpa = bool(row.get("dp_attention") or (disagg and row["decode"].get("dp_attention")))
    base = Point(row["id"], row["key"], source_key(row), gpu, framework, model, str(row.get("precision")),
                 int(row["concurrency"]), int(row["num_gpus"]), mtp, disagg, dpa, measured)

    def refuse(why: str) -> Point:
        return Point(**{**base.__dict__, "reason": why})

    if m.get("p99_itl_ms") and m.get("median_itl_ms") and m["p99_itl_ms"] > STALL_GAP_RATIO * m["median_itl_ms"]:
        return refuse(STALL_REASON)
    if gpu not in catalog.gpus():
        return refuse(f"GPU {gpu} not in the catalog")
    if model not in catalog.models():
        return refuse(f"model {model} not in the catalog")
    if row.get("precision") is None:
        return refuse("precision not stated")
    if int(row.get("pp") or 1) != 1:
        return refuse("pipeline parallel rows are not posed")
    decode_part = row["decode"] if disagg else row
    draft = 0
    if mtp:
        table = MTP_DRAFT_TOKENS_DP_ATTENTION if decode_part.get("dp_attention") else {}
        draft = table.get(framework, MTP_DRAFT_TOKENS.get(framework, 1))
    conc = float(row["concurrency"])
    decode = _engine(row, decode_part, model, gpu, framework, conc, draft)
    prefill = _engine(row, row["prefill"], model, gpu, framework, conc, 0) if disagg else None
    return Point(**{**base.__dict__, "decode": decode, "prefill": prefill})


@cache
def raw_rows() -> tuple[dict[str, Any], ...]:
    """The rows of the data file as read (C YAML loader where available: 12k lines)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(yaml.load(data_path().read_text(), Loader=loader))


@cache
def load_points() -> tuple[Point, ...]:
    return tuple(to_point(r) for r in raw_rows())


@dataclass
class PreparedEngine:
    model: ServingModel
    plans: ServingArrays
    framework: ServingFramework

    def terms(self, params: Sequence[ServingParams], batches: Sequence[int] | None = None) -> InferenceTerms:
        """The engine priced under each parameter set (option k by ``params[k]``), one vectorised evaluation; with
        ``batches``, every set at every batch (row k * len(batches) + j)."""
        m, k = self.model, len(params)
        n = 1 if batches is None else len(batches)
        table = HardwareTable(tuple(m.table.options) * k)
        cal = CalibrationColumns.of(list(params), self.framework)
        plans = self.plans.take([0] * (k * n))
        cols = {**plans.__dict__, "hw": np.repeat(np.arange(k, dtype=np.int64), n)}
        if batches is not None:
            cols["batch"] = np.tile(np.asarray(batches, dtype=np.int64), k)
        return inference_terms(m.workload, m.task, m.problem.stack, table, ServingArrays(**cols), cal)


def prepare_engine(e: Engine, point_id: str) -> PreparedEngine:
    model = ServingModel(problem_from_dict(e.data, source=f"{DATA_FILE}#{point_id}"))
    return PreparedEngine(model, model.arrays([e.plan]), serving_catalog().frameworks[model.framework])


@dataclass
class PreparedPoint:
    """A point's engines built once; ``predict_many`` only swaps the calibration. Returns (k, 2): output tok/s per
    GPU and TPOT (s) per parameter set."""

    point: Point
    decode: PreparedEngine
    prefill: PreparedEngine | None
    group: EngineGroup | None = None  # aggregated points sharing model, task and framework: priced together
    _last: tuple[tuple[ServingParams, ...], np.ndarray] | None = field(default=None, repr=False)

    def invalid(self) -> str | None:
        p = ServingParams(**serving_catalog().prior.model_dump())
        for e in (self.decode, self.prefill):
            if e is None:
                continue
            code = int(e.terms([p]).invalid[0])
            if code:
                return INVALID_REASONS[code]
        return None

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        key = tuple(params)
        slot = next((j for j, q in enumerate(self.group.points) if q is self), None) if self.group else None
        if self.group is not None and slot is not None:
            return self.group.predict_many(params)[:, slot]
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        d = self.decode.terms(params)
        workers = self.point.decode.workers if self.point.decode else 1
        if self.prefill is None:
            out_len = self.decode.model.workload.mean_output
            rate, tpot = closed_loop_rate(float(self.point.concurrency), out_len, d.ttft_s, d.tpot_s), d.tpot_s
        else:
            rate, tpot = self._disaggregated(params, workers)
        out = np.stack([rate / self.point.num_gpus, tpot], axis=1)
        self._last = (key, out)
        return out


    def _disaggregated(self, params: Sequence[ServingParams], workers: int) -> tuple[np.ndarray, np.ndarray]:
        """Throughput and TPOT of a prefill pool feeding a decode pool. The prefill engines feed requests at
        dp / (occupancy of one prompt) each; the decode engines run pure decode rounds and emit
        R(b) = workers dp b / t_round(b) at b sequences per replica. Throughput X = min(R(b_max), feed), b_max =
        the clients per replica; the decode batch that carries X is b* with R(b*) = X (Little's law: a
        prefill-bound pool leaves the decode replicas part-full while requests queue for prefill), TPOT =
        t_round(b*)."""
        assert self.prefill is not None and self.point.prefill is not None
        p = self.prefill.terms(params)
        mean_out = self.prefill.model.workload.mean_output
        per_request = p.step["prefill"] * mean_out / p.running_batch  # replica occupancy of one prompt
        feed = self.point.prefill.workers * self.prefill.plans.dp[0] * mean_out / per_request
        b_max = int(self.decode.plans.batch[0])
        grid = sorted({*np.unique(np.geomspace(1, b_max, 7).round().astype(int)).tolist(), b_max})
        g = self.decode.terms(params, grid)
        k, n = len(params), len(grid)
        t_round = g.decode_step_s.reshape(k, n)
        emitted = workers * self.decode.plans.dp[0] * g.running_batch.reshape(k, n) / t_round
        rate = np.minimum(emitted[:, -1], feed)
        tpot = np.array([np.interp(rate[i], emitted[i], t_round[i]) for i in range(k)])
        return rate, tpot


def closed_loop_rate(clients: np.ndarray | float, output_len: float, ttft_s: np.ndarray, tpot_s: np.ndarray) -> np.ndarray:
    """Output tokens/s of C clients in a closed loop (InferenceX: --max-concurrency C, a client sends its next
    request when the last one ends): each cycle is TTFT + (o - 1) TPOT for o tokens, so X = C o / (TTFT + (o - 1)
    TPOT); the model's TTFT holds the prefill, the rest of its mixed iteration and any wait for a slot."""
    return np.asarray(clients * output_len / (ttft_s + (output_len - 1.0) * tpot_s))


@dataclass(eq=False)
class EngineGroup:
    """Aggregated points whose engines share the model, task and framework (they differ in GPU, plan and batch):
    one vectorised evaluation prices all of them under all parameter sets (row = set x point). Same numbers as
    pricing each point alone; the fit calls it with the same sets for every point, so it is computed once."""

    points: list[PreparedPoint]
    _last: tuple[tuple[ServingParams, ...], np.ndarray] | None = field(default=None, repr=False)

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        """(k, points, 2): output tok/s per GPU and TPOT."""
        key = tuple(params)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        first = self.points[0].decode
        m, k, n = first.model, len(params), len(self.points)
        t, _ = grouped_terms(m, [(p.decode.model, p.decode.plans) for p in self.points], first.framework, params)
        clients = np.tile([float(p.point.concurrency) for p in self.points], k)
        gpus = np.tile([p.point.num_gpus for p in self.points], k)
        rate = closed_loop_rate(clients, m.workload.mean_output, t.ttft_s, t.tpot_s)
        out = np.stack([rate / gpus, t.tpot_s], axis=1).reshape(k, n, 2)
        self._last = (key, out)
        return out


def group_points(points: Sequence[PreparedPoint]) -> None:
    """Attach every aggregated point to the group of points sharing its model, task and framework."""
    groups: dict[str, list[PreparedPoint]] = {}
    for p in points:
        if p.prefill is None and p.point.decode is not None:
            d = p.point.decode.data
            key = repr((d["model"], sorted(d["task"].items()), d["stack"], p.decode.model.framework))
            groups.setdefault(key, []).append(p)
    for members in groups.values():
        g = EngineGroup(members)
        for p in members:
            p.group = g


def prepare(point: Point) -> PreparedPoint | str:
    """The prepared point, or why it cannot be priced (one line)."""
    if point.reason is not None or point.decode is None:
        return point.reason or "not posed"
    try:
        dec = prepare_engine(point.decode, point.id)
        pre = prepare_engine(point.prefill, point.id) if point.prefill is not None else None
    except ProblemError as exc:
        return str(exc)
    prepared = PreparedPoint(point, dec, pre)
    why = prepared.invalid()
    return why if why is not None else prepared


@cache
def prepared_points() -> tuple[tuple[PreparedPoint, ...], tuple[tuple[Point, str], ...]]:
    """(the expressible points prepared, the others with the reason)."""
    ok: list[PreparedPoint] = []
    refused: list[tuple[Point, str]] = []
    for p in load_points():
        r = prepare(p)
        if isinstance(r, str):
            refused.append((p, r))
        else:
            ok.append(r)
    group_points(ok)
    return tuple(ok), tuple(refused)


@dataclass(frozen=True)
class MetricCase:
    """One measured metric of a point, as the serving fit reads a case (``serving_cases.CaseInfo``)."""

    id: str
    source: str
    gpu: str
    framework: str
    model: str
    kind: str  # tput_per_gpu | tpot
    measured: float

    @property
    def pair(self) -> tuple[str, str]:
        return self.gpu, self.framework

    @property
    def moe(self) -> bool:
        return True


@dataclass
class PreparedMetric:
    """A metric of a prepared point (the fit's case): its column of the point's predictions."""

    case: MetricCase
    point: PreparedPoint

    def predict_many(self, params: Sequence[ServingParams]) -> np.ndarray:
        return self.point.predict_many(params)[:, METRICS.index(self.case.kind)]

    def predict(self, params: ServingParams) -> float:
        return float(self.predict_many([params])[0])

    def error(self, params: ServingParams) -> float:
        return self.predict(params) / self.case.measured - 1.0


@cache
def prepared_metrics() -> tuple[PreparedMetric, ...]:
    """Both metrics of every expressible point (throughput per GPU, median TPOT), in data order."""
    out = []
    for pp in prepared_points()[0]:
        p = pp.point
        for kind in METRICS:
            case = MetricCase(f"{p.id}:{kind}", p.source, p.gpu, p.framework, p.model, kind, p.measured[kind])
            out.append(PreparedMetric(case, pp))
    return tuple(out)
