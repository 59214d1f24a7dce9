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
        measured: {step_time_s: 9.44}  # or tokens_per_s (whole job) or tokens_per_s_per_gpu

Output: an overlay file (``io.calibration.Overlay``) that problem files name with ``calibration: FILE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import Field

from madmax_opt.analysis.evaluator import Model, metrics
from madmax_opt.core.errors import ProblemError
from madmax_opt.io.calibration import OVERLAY_KIND, Overlay, OverlayEntry
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.validate import validate
from madmax_opt.io.yaml_files import read_yaml
from madmax_opt.model.spec import FrameworkFit, Plan, Strict
from madmax_opt.studies import fit as fit_mod
from madmax_opt.studies.fit import FIT_PARAMS, Run

Key = tuple[str, str]
METHOD = ("madmax-opt calibrate (madmax_opt.studies.fit.fit): coordinate descent over fit.FIT_GRID from the GPU prior, "
          "objective mean |ln(predicted/measured)| + 0.05 x sum |ln(value/prior)| (fit.PRIOR_WEIGHT)")


class Measured(Strict):
    step_time_s: float | None = Field(None, gt=0)
    tokens_per_s: float | None = Field(None, gt=0, description="training tokens per second of the whole job")
    tokens_per_s_per_gpu: float | None = Field(None, gt=0)


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

    def entry(self) -> OverlayEntry:
        ins = float(np.median(np.abs(self.fit.error)))
        loo = self.loo_err[~np.isnan(self.loo_err)]
        record = FrameworkFit(
            runs=len(self.runs), sources=sorted({r.source for r in self.runs}), fitted=list(self.fit.params),
            in_sample_median_err=round(ins, 4),
            loso_median_err=round(float(np.median(np.abs(loo))), 4) if len(loo) else None, method=METHOD,
        )
        return OverlayEntry(gpu=self.key[0], framework=self.key[1], fit=record, **self.fit.params)


def _step_s(r: MinimalRun, gpus: int, tokens_per_step: float, file: str, field: str) -> float:
    m = r.measured
    if m.step_time_s is not None:
        return m.step_time_s
    if m.tokens_per_s is not None:
        return tokens_per_step / m.tokens_per_s
    if m.tokens_per_s_per_gpu is not None:
        return tokens_per_step / (m.tokens_per_s_per_gpu * gpus)
    raise ProblemError("no measurement; allowed: step_time_s, tokens_per_s or tokens_per_s_per_gpu", file=file,
                       field=f"{field}.measured")


def minimal_runs(data: dict[str, Any], file: str) -> list[Run]:
    """Runs of the minimal schema, each a problem of one hardware option (one-line errors naming the run)."""
    mf: MinimalFile = validate(MinimalFile, data, file=file)
    out = []
    for i, r in enumerate(mf.runs):
        field = f"runs[{i}]"
        task = {**r.task, "precision": r.precision}
        problem = problem_from_dict(
            {"model": r.model, "hardware": r.hardware, "task": task, "stack": {"framework": r.framework, **r.stack}},
            source=f"{file}:{field}",
        )
        if len(problem.hardware) != 1:
            raise ProblemError("a run needs one cluster size; allowed: gpus as one integer", file=file,
                               field=f"{field}.hardware.gpus")
        tokens = float(problem.training_task.global_batch * (problem.training_task.seq_len or 1))
        step = _step_s(r, problem.hardware[0].gpus, tokens, file, field)
        out.append(Run(r.name or f"run {i + 1}", file, problem, r.plan, step))
    return out


def modern_schema_runs(data: dict[str, Any], file: str) -> list[Run]:
    """Runs of the shared modern schema (``cases`` + ``model_catalog``)."""
    from madmax_opt.studies.validation_modern import modern_cases

    try:
        cases = modern_cases(data)
    except ProblemError:
        raise
    except (KeyError, StopIteration, TypeError, ValueError, IndexError) as exc:
        raise ProblemError(f"not a case of the modern schema ({type(exc).__name__}: {exc}); allowed: the fields "
                           "of data/validation/modern/training.yaml", file=file, field="cases") from None
    return [c.run for c in cases if c.fitted]


def read_runs(path: Path) -> list[Run]:
    data = read_yaml(path, what="runs file")
    if isinstance(data, dict) and "cases" in data and "model_catalog" in data:
        return modern_schema_runs(data, str(path))
    if not isinstance(data, dict) or "runs" not in data:
        raise ProblemError("expected a mapping with runs (minimal schema) or cases and model_catalog (modern schema)",
                           file=str(path))
    return minimal_runs(data, str(path))


def _check_params(runs: Sequence[Run], params: Sequence[str] | None, file: str) -> list[str]:
    """The candidate parameters; asking for one the runs do not determine is an error that says which and why."""
    if params is None:
        return list(FIT_PARAMS)
    unknown = [p for p in params if p not in FIT_PARAMS]
    if unknown:
        raise ProblemError(f"unknown parameter {unknown[0]!r}; allowed: {', '.join(FIT_PARAMS)}", field="--params")
    _, left = fit_mod.determined(runs, params)
    if left:
        name, why = next(iter(left.items()))
        gpu, framework = runs[0].gpu, runs[0].framework
        raise ProblemError(f"cannot fit {name} for {gpu}/{framework} from {len(runs)} run(s): {why}",
                           file=file, field="--params")
    return list(params)


def calibrate(path: Path, params: Sequence[str] | None = None) -> list[PairResult]:
    """Fit every (GPU, framework) of the runs file; per run the before, after and leave-one-out errors."""
    runs = read_runs(path)
    groups: dict[Key, list[Run]] = {}
    for r in runs:
        if r.problem.hardware[0].gpu.name not in fit_mod.catalog.gpus():
            raise ProblemError(f"GPU {r.gpu!r} is not in the catalog; allowed: a catalog GPU (its prior is the start)",
                               file=str(path), field=r.name)
        groups.setdefault((r.gpu, r.framework), []).append(r)
    out = []
    for key, rs in groups.items():
        names = _check_params(rs, params, str(path))
        measured = np.array([r.measured_s for r in rs])
        before = np.array([float(metrics(m := Model(r.problem), m.arrays([r.plan])).step_time_s[0]) for r in rs])
        f = fit_mod.fit(rs, names)
        loo = np.full(len(rs), np.nan)
        if len(rs) > 1:
            for i in range(len(rs)):
                rest = [r for j, r in enumerate(rs) if j != i]
                g = fit_mod.fit(rest, [n for n in names if n in fit_mod.determined(rest, names)[0]])
                loo[i] = fit_mod.predict([rs[i]], [g.params])[0, 0] / rs[i].measured_s - 1.0
        out.append(PairResult(key, rs, f, before / measured - 1.0, loo))
    return out


def overlay_yaml(results: Sequence[PairResult], runs_file: Path) -> str:
    """The overlay file text (validated by io.calibration.Overlay before it is written)."""
    overlay = Overlay(kind=OVERLAY_KIND, calibrations=[r.entry() for r in results])
    body = yaml.safe_dump(overlay.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)
    return f"# written by madmax-opt calibrate from {runs_file}; name it in a problem file as `calibration: FILE`\n" + body
