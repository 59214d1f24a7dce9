"""``madmax-opt calibrate``: fit the (GPU, framework) calibration to a user's measured runs and write an overlay.

Input: the shared modern schema (``cases:`` + ``model_catalog:``, as data/validation/modern/training.yaml) or the
minimal schema::

    runs:
      - name: llama8b-fp8            # optional
        model: llama3-8b             # catalog name or an inline model mapping
        hardware: {gpu: h100-sxm, gpus: 8}      # or {system: dgx-h100, gpus: 8}
        task: {seq_len: 8192, global_batch: 128}
        precision: fp8               # bf16 | fp8 | mxfp8 (default bf16)
        framework: megatron-core     # megatron-core | torchtitan | pytorch-fsdp (default megatron-core)
        stack: {tp_comm_overlap: true}          # optional, any stack field
        plan: {dp: 8, mbs: 1, zero: 1}
        measured: {step_time_s: 9.44}  # or tokens_per_s (whole job) or tokens_per_s_per_gpu, or
        # measured: {log: train.log}   # a Megatron-LM / NeMo or torchtitan log (io.run_logs), path relative to
        #                              # this file; the median step after `skip` warm-up iterations (default 1)

Every run is checked as ``solve`` checks a problem and a plan: the problem through the problem validator, the plan
through the evaluator's validity rules (an invalid plan is refused; a plan the memory model says does not fit is
kept, with a note, since it ran). Two measurements of one run must agree within MEASURE_TOLERANCE.

Serving runs (``serving_runs:``, measured throughput / TTFT / TPOT or a benchmark-serving JSON) are fitted by
``studies.serving_calibrate`` into the overlay's ``serving`` entries.

Output: an overlay file (``io.calibration.Overlay``) that problem files name with ``calibration: FILE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np
import yaml
from pydantic import Field

from madmax_opt.analysis.evaluator import Model, evaluate, metrics
from madmax_opt.core.errors import ProblemError
from madmax_opt.core.numeric import Arr
from madmax_opt.io.calibration import OVERLAY_KIND, Overlay, OverlayEntry
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.run_logs import LogFormat, read_training_log
from madmax_opt.io.run_logs import step_time_s as log_step_time_s
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Framework, FrameworkCalibration, FrameworkFit, Plan, Strict
from madmax_opt.model.training import INVALID_REASONS
from madmax_opt.studies import fit as fit_mod
from madmax_opt.studies.fit import FIT_PARAMS, Run
from madmax_opt.studies.serving_calibrate import ServingPairResult, calibrate_serving

Key = tuple[str, str]
TRAINING_FRAMEWORKS: tuple[str, ...] = get_args(Framework)  # the frameworks a training calibration exists for
# Two measurements of one run (step_time_s, tokens_per_s, tokens_per_s_per_gpu) must agree within 2 %: a value
# quoted to 2 significant digits is within 2.5 % of itself, to 3 digits within 0.5 %; more is a contradiction.
MEASURE_TOLERANCE = 0.02
LAYERS_RULE = 3  # INVALID_REASONS: pp*vpp must divide the number of layers
MAX_RUNS = 1_000  # calibrate costs ~1 s a run on one core (linear): 1,000 runs is a quarter of an hour
# Nodes of the runs file with every YAML alias expanded (the shipped modern file: 5,288 for 80 runs); a file of
# nested aliases ("billion laughs") would otherwise expand in the validators until memory runs out.
MAX_EXPANDED_NODES = 1_000_000
METHOD = ("madmax-opt calibrate (madmax_opt.studies.fit.fit): coordinate descent over fit.FIT_GRID from the pair's catalog "
          "calibration, objective mean |ln(predicted/measured)| + 0.05 x sum |ln(value/start)| (fit.PRIOR_WEIGHT)")
OVERRIDE_FIELDS: tuple[str, ...] = tuple(n for n in FrameworkCalibration.model_fields if n != "fit")


class Measured(Strict):
    step_time_s: float | None = Field(None, gt=0)
    tokens_per_s: float | None = Field(None, gt=0, description="training tokens per second of the whole job")
    tokens_per_s_per_gpu: float | None = Field(None, gt=0)
    log: str | None = Field(None, description="Megatron-LM / NeMo or torchtitan log, relative to the runs file")
    log_format: LogFormat = "auto"
    skip: int = Field(1, ge=0, le=1_000_000, description="warm-up iterations of the log left out")


class MinimalRun(Strict):
    """One run of the minimal schema."""

    name: str | None = None
    model: str | dict[str, Any]
    hardware: dict[str, Any]
    task: dict[str, Any]
    precision: str = "bf16"
    framework: str = "megatron-core"
    stack: dict[str, Any] = Field(default_factory=dict)
    plan: Plan
    measured: Measured


class MinimalFile(Strict):
    runs: list[MinimalRun] = Field(min_length=1)


@dataclass(frozen=True)
class PairResult:
    """The fit of one (GPU, framework): per run the error before (catalog), after (fit), leave-one-run-out."""

    key: Key
    runs: list[Run]
    fit: fit_mod.Fit
    before_err: np.ndarray
    loo_err: np.ndarray  # NaN where the run cannot be left out (a single run)
    notes: tuple[str, ...] = ()  # one line each: runs the memory model says do not fit

    def entry(self) -> OverlayEntry:
        ins = float(np.median(np.abs(self.fit.error)))
        loo = self.loo_err[~np.isnan(self.loo_err)]
        record = FrameworkFit(
            runs=len(self.runs), sources=sorted({r.source for r in self.runs}), fitted=list(self.fit.params),
            in_sample_median_err=round(ins, 4),
            loso_median_err=round(float(np.median(np.abs(loo))), 4) if len(loo) else None, method=METHOD,
        )
        return OverlayEntry(gpu=self.key[0], framework=self.key[1], fit=record, **self.values())

    def values(self) -> dict[str, float]:
        """The overlay's values (replacing the GPU prior's): the fitted ones, and every other field where the base
        the fit started from (the pair's catalog calibration) differs from the prior, so that the overlay prices as
        the fit did."""
        (gpu,) = self.fit.bases
        final, base = self.fit.bases[gpu].scaled(self.fit.factors), fit_mod.prior(gpu)
        out = {}
        for name in OVERRIDE_FIELDS:
            v, b = getattr(final, name), getattr(base, name)
            if v is not None and (name in self.fit.factors or v != b):
                out[name] = round(float(v), 6)
        return out


def _step_s(r: MinimalRun, problem: Problem, file: str, field: str) -> float:
    """The run's step time from each measurement it gives; two that disagree by more than MEASURE_TOLERANCE are
    refused (which one is right cannot be told)."""
    m, task, gpus = r.measured, problem.training_task, problem.hardware[0].gpus
    tokens = float(task.global_batch * (task.seq_len or 1))
    given: list[tuple[str, float]] = []
    if m.step_time_s is not None:
        given.append(("step_time_s", m.step_time_s))
    if m.tokens_per_s is not None:
        given.append(("tokens_per_s", tokens / m.tokens_per_s))
    if m.tokens_per_s_per_gpu is not None:
        given.append(("tokens_per_s_per_gpu", tokens / (m.tokens_per_s_per_gpu * gpus)))
    if m.log is not None:
        path = Path(file).parent / m.log
        steps = read_training_log(path, m.log_format, file=file, field=f"{field}.measured.log")
        given.append(("log", log_step_time_s(steps, skip=m.skip, tokens_per_step=tokens, gpus=gpus,
                                             global_batch=task.global_batch, file=f"{file}: {field}.measured.log")))
    if not given:
        raise ProblemError("no measurement; allowed: step_time_s, tokens_per_s, tokens_per_s_per_gpu or log",
                           file=file, field=f"{field}.measured")
    (n0, t0), *rest = given
    for n1, t1 in rest:
        if abs(t1 / t0 - 1.0) > MEASURE_TOLERANCE:
            raise ProblemError(f"{n0} gives a step of {t0:.4g} s, {n1} {t1:.4g} s ({100 * (t1 / t0 - 1):+.1f} %); "
                               f"allowed: measurements that agree within {100 * MEASURE_TOLERANCE:g} %",
                               file=file, field=f"{field}.measured")
    return t0


def _check_framework(framework: str, file: str, field: str) -> None:
    if framework not in TRAINING_FRAMEWORKS:
        raise ProblemError(f"{framework!r} is not a training framework calibrate fits (serving runs are fitted by "
                           f"fit-serving); allowed: {', '.join(TRAINING_FRAMEWORKS)}", file=file, field=field)


def check_run(run: Run, file: str, field: str) -> str | None:
    """The evaluator's validity rules on the run's plan, as ``solve`` and ``evaluate`` apply them: an invalid plan
    is a ProblemError naming the run. Two rules give a note instead, since the run did run: memory (the memory
    model says it does not fit) and pp*vpp not dividing the layers (frameworks split layers unevenly, e.g.
    Megatron's --decoder-first-pipeline-num-layers; the fit prices the mean stage, as for the shipped modern runs)."""
    plan, problem = run.plan, run.problem
    if plan.uneven or plan.stage_systems is not None:
        raise ProblemError("an uneven or mixed pipeline (stage_layers); allowed: a uniform plan (the fit prices "
                           "uniform plans)", file=file, field=f"{field}.plan.stage_layers")
    gpus = problem.hardware[0].gpus
    if plan.gpus != gpus:
        raise ProblemError(f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.gpus} GPUs; allowed: "
                           f"the run's {gpus} GPUs", file=file, field=f"{field}.plan")
    rec = evaluate(problem, [plan])[0]
    reason = rec.get("infeasible_reason")
    if rec.get("feasible", True) or not reason:
        return None
    if str(reason).startswith("memory per GPU"):
        return f"{run.name}: the memory model says {reason}; the run is fitted as measured"
    if reason == INVALID_REASONS[LAYERS_RULE]:
        return f"{run.name}: {reason} (pp {plan.pp} x vpp {plan.vpp}); priced with even stages"
    raise ProblemError(f"invalid plan: {reason}", file=file, field=f"{field}.plan")


Notes = list[tuple[Run, str]]  # a run and a one-line note on it


def minimal_runs(data: dict[str, Any], file: str) -> tuple[list[Run], Notes]:
    """Runs of the minimal schema, each a problem of one hardware option (one-line errors naming the run), and
    the notes on them."""
    mf: MinimalFile = validate(MinimalFile, data, file=file)
    if len(mf.runs) > MAX_RUNS:
        raise ProblemError(f"{len(mf.runs):,} runs; allowed: at most {MAX_RUNS:,}", file=file, field="runs")
    out: list[Run] = []
    notes: Notes = []
    for i, r in enumerate(mf.runs):
        field = f"runs[{i}]"
        _check_framework(r.framework, file, f"{field}.framework")
        task = {**r.task, "precision": r.precision}
        problem = problem_from_dict(
            {"model": r.model, "hardware": r.hardware, "task": task, "stack": {"framework": r.framework, **r.stack}},
            source=f"{file}:{field}",
        )
        if len(problem.hardware) != 1:
            raise ProblemError("a run needs one cluster size; allowed: gpus as one integer", file=file,
                               field=f"{field}.hardware.gpus")
        if problem.training_task is None:
            raise ProblemError("not a training task; allowed: a training run (seq_len, global_batch)", file=file,
                               field=f"{field}.task")
        run = Run(r.name or f"run {i + 1}", file, problem, r.plan, 0.0)
        note = check_run(run, file, field)
        run = Run(run.name, file, problem, r.plan, _step_s(r, problem, file, field))
        notes += [(run, note)] if note else []
        out.append(run)
    return out, notes


def modern_schema_runs(data: dict[str, Any], file: str) -> tuple[list[Run], Notes]:
    """Runs of the shared modern schema (``cases`` + ``model_catalog``), checked like the minimal schema's."""
    from madmax_opt.studies.validation_modern import modern_cases

    try:
        cases = modern_cases(data)
    except ProblemError:
        raise
    except (KeyError, StopIteration, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ProblemError(f"not a case of the modern schema ({type(exc).__name__}: {exc}); allowed: the fields "
                           "of data/validation/modern/training.yaml", file=file, field="cases") from None
    if len(cases) > MAX_RUNS:
        raise ProblemError(f"{len(cases):,} cases; allowed: at most {MAX_RUNS:,}", file=file, field="cases")
    runs = [c.run for c in cases if c.fitted]
    notes: Notes = []
    for r in runs:
        _check_framework(r.framework, file, f"cases[{r.name}].framework")
        note = check_run(r, file, f"cases[{r.name}]")
        notes += [(r, note)] if note else []
    return runs, notes


def expanded_nodes(data: Any, limit: int) -> int:
    """Nodes of ``data`` counting every YAML alias as often as it is used, stopping past ``limit``."""
    count, stack = 0, [data]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def read_runs(path: Path) -> tuple[list[Run], Notes]:
    """The runs of a runs file (either schema) and the notes on them; a file without a run is an error."""
    data = read_yaml(path, what="runs file")
    if expanded_nodes(data, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
        raise ProblemError(f"more than {MAX_EXPANDED_NODES:,} values once its YAML aliases are expanded; allowed: "
                           f"at most {MAX_EXPANDED_NODES:,}", file=str(path))
    if isinstance(data, dict) and "cases" in data and "model_catalog" in data:
        runs, notes = modern_schema_runs(data, str(path))
        if not runs:
            raise ProblemError("no case to fit (none of a training framework calibrate fits); allowed: at least "
                               f"one case of {', '.join(TRAINING_FRAMEWORKS)}", file=str(path), field="cases")
        return runs, notes
    if isinstance(data, dict) and "mean_tpot_ms" in data and "completed" in data:
        raise ProblemError("a benchmark-serving result (vllm bench serve / sglang.bench_serving) alone: it does not "
                           "say the model, plan and hardware it ran; allowed: a runs file whose serving_runs entry "
                           "names it (measured: {bench: FILE})", file=str(path))
    if isinstance(data, dict) and "serving_runs" in data:  # serving runs: studies.serving_calibrate
        rest = {k: v for k, v in data.items() if k != "serving_runs"}
        return minimal_runs(rest, str(path)) if rest else ([], [])
    if not isinstance(data, dict) or "runs" not in data:
        raise ProblemError("expected a mapping with runs (minimal schema), serving_runs, or cases and model_catalog "
                           "(modern schema)", file=str(path))
    return minimal_runs(data, str(path))


def calibrate_serving_file(path: Path) -> list[ServingPairResult]:
    """The serving fits of a runs file's ``serving_runs`` (none without them)."""
    data = read_yaml(path, what="runs file")
    if isinstance(data, dict) and "serving_runs" in data:
        return calibrate_serving(data, str(path))
    return []


def _check_params(runs: Sequence[Run], params: Sequence[str] | None, file: str, bases: fit_mod.Bases) -> list[str]:
    """The candidate parameters; asking for one the runs do not determine is an error that says which and why."""
    if params is None:
        return list(FIT_PARAMS)
    unknown = [p for p in params if p not in FIT_PARAMS]
    if unknown:
        raise ProblemError(f"unknown parameter {unknown[0]!r}; allowed: {', '.join(FIT_PARAMS)}", field="--params")
    _, left = fit_mod.determined(runs, params, bases)
    if left:
        name, why = next(iter(left.items()))
        gpu, framework = runs[0].gpu, runs[0].framework
        raise ProblemError(f"cannot fit {name} for {gpu}/{framework} from {len(runs)} run(s): {why}",
                           file=file, field="--params")
    return list(params)


class MemoPredict:
    """fit.predict_scaled with every (run, base, factor set) step time kept: the leave-one-out fits of a pair walk
    mostly the grid lines the full fit walked, so each run is priced once per factor set instead of once per fit
    (the model evaluations of n leave-one-out fits of n runs were the quadratic part of calibrate). Values are
    kept per (base, factor set) as one array over the runs, so a fit of n runs reads them in O(sets) numpy takes."""

    def __init__(self) -> None:
        self.position: dict[int, int] = {}  # id(run) -> column (runs are alive while the memo is)
        self.table: dict[tuple[str, tuple[tuple[str, float], ...]], np.ndarray] = {}

    def _column(self, key: tuple[str, tuple[tuple[str, float], ...]]) -> np.ndarray:
        col = self.table.get(key)
        if col is None or len(col) < len(self.position):
            grown = np.full(max(len(self.position), 8) * 2, np.nan)
            if col is not None:
                grown[: len(col)] = col
            col = self.table[key] = grown
        return col

    def __call__(self, runs: Sequence[Run], sets: Sequence[Mapping[str, float]], bases: fit_mod.Bases) -> Arr:
        for r in runs:
            self.position.setdefault(id(r), len(self.position))
        idx = np.array([self.position[id(r)] for r in runs], dtype=np.int64)
        base_keys = {g: bases[g].model_dump_json() for g in {r.gpu for r in runs}}
        keys = [[(base_keys[g], tuple(sorted(f.items()))) for f in sets] for g in base_keys]
        gpu_row = {g: i for i, g in enumerate(base_keys)}
        out = np.empty((len(runs), len(sets)))
        for g, row in gpu_row.items():
            mine = np.array([r.gpu == g for r in runs])
            its_runs = [r for r, m in zip(runs, mine, strict=True) if m]
            cols = [self._column(k) for k in keys[row]]
            got = np.stack([c[idx[mine]] for c in cols], axis=1)  # (runs of this GPU, sets)
            missing = np.isnan(got)
            for i in np.flatnonzero(missing.any(axis=1)):  # price each run once for all the sets it lacks
                run = its_runs[i]
                todo = np.flatnonzero(missing[i]).tolist()  # ascending, each once
                values = fit_mod.predict_scaled([run], [sets[j] for j in todo], bases)[0]
                for j, v in zip(todo, values.tolist(), strict=True):
                    cols[j][self.position[id(run)]] = v
                    got[i, j] = v
            out[mine] = got
        return out


def calibrate(path: Path, params: Sequence[str] | None = None) -> list[PairResult]:
    """Fit every (GPU, framework) of the runs file, starting from the calibration that prices the pair now (its
    catalog fit, else its family's, else the prior: what ``before`` uses), so that a few runs refine it; per run the
    before, after and leave-one-out errors."""
    runs, notes = read_runs(path)
    groups: dict[Key, list[Run]] = {}
    for r in runs:
        if r.problem.hardware[0].gpu.name not in fit_mod.catalog.gpus():
            raise ProblemError(f"GPU {r.gpu!r} is not in the catalog; allowed: a catalog GPU (its prior is the start)",
                               file=str(path), field=r.name)
        groups.setdefault((r.gpu, r.framework), []).append(r)
    out = []
    for key, rs in groups.items():
        bases = {key[0]: rs[0].problem.hardware[0].gpu.calibration}  # as the problem loader prices the pair
        names = _check_params(rs, params, str(path), bases)
        measured = np.array([r.measured_s for r in rs])
        before = np.array([float(metrics(m := Model(r.problem), m.arrays([r.plan])).step_time_s[0]) for r in rs])
        memo = MemoPredict()
        f = fit_mod.fit(rs, names, bases=bases, predict=memo)
        loo = np.full(len(rs), np.nan)
        if len(rs) > 1:
            for i in range(len(rs)):
                rest = [r for j, r in enumerate(rs) if j != i]
                g = fit_mod.fit(rest, fit_mod.determined(rest, names, bases, predict=memo)[0], bases=bases,
                                predict=memo)
                loo[i] = memo([rs[i]], [g.factors], bases)[0, 0] / rs[i].measured_s - 1.0
        mine = tuple(note for run, note in notes if any(run is r for r in rs))
        out.append(PairResult(key, rs, f, before / measured - 1.0, loo, mine))
    return out


def overlay_yaml(results: Sequence[PairResult], runs_file: Path, serving: Sequence[ServingPairResult] = ()) -> str:
    """The overlay file text (validated by io.calibration.Overlay before it is written): the training fits under
    ``calibrations``, the serving fits under ``serving``."""
    overlay = Overlay(kind=OVERLAY_KIND, calibrations=[r.entry() for r in results],
                      serving=[r.entry() for r in serving])
    empty = {k for k in ("calibrations", "serving") if not getattr(overlay, k)}  # a section without an entry
    body = yaml.safe_dump(overlay.model_dump(mode="json", exclude_none=True, exclude=empty), sort_keys=False,
                          width=110)
    return f"# written by madmax-opt calibrate from {runs_file}; name it in a problem file as `calibration: FILE`\n" + body
