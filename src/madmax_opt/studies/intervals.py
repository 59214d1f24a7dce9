"""Training prediction intervals: residuals of each calibration level on the modern runs, the 80 % interval each
level gives a record (data/training_intervals.yaml) and its leave-one-source-out coverage (results/validation).

Residual r = ln(measured / predicted) of a fitted case, grouped by framework family and the level that priced it:
``calibrated`` and ``family`` are the case's leave-one-source-out prediction at the level its LOSO reached
(validation_modern.summarize_modern); ``prior`` is the case predicted with its GPU's prior (never fitted to
these runs). A group with runs from fewer than two sources, or fewer than core.intervals.MIN_RUNS (its coverage
could not be measured on its own) takes the same level's residuals pooled over the families: an interval comes from
residuals of the level it prices (a family-level prediction errs more than a calibrated one), never from another
level's. Every run weighs the same (core.intervals.from_residuals): the calibrated and family residuals are
already errors on unseen sources. The cluster-weighted quantile serving uses (core.intervals.from_clusters) was
measured here too and covered less, with sources as clusters (leave one source out: megatron calibrated 75.0 ->
71.9 %, pytorch-fsdp family 77.4 -> 58.1 %, prior pooled over families 76.5 -> 69.1 %) and with (source, GPU)
cells, serving's clusters (megatron calibrated 71.9 %, megatron prior 75.7 -> 67.6 %, pytorch-fsdp family 58.1 %,
pytorch-fsdp prior 83.9 -> 74.2 %, prior pooled over families 57.4 %).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from madmax_opt.core.intervals import (
    COVERAGE,
    MIN_RUNS,
    Interval,
    from_residuals,
    loso_coverage,
    within_target,
)
from madmax_opt.studies import fit as fit_mod
from madmax_opt.studies.validation_modern import LEVELS, ModernSummary, family_of

INTERVALS_FILE = ("data", "training_intervals.yaml")
POOLED = "pooled"


@dataclass(frozen=True)
class Group:
    """The residuals of one (family, level), their interval and its leave-one-source-out coverage."""

    family: str
    level: str
    residuals: list[float]
    sources: list[str]

    @property
    def own(self) -> bool:
        """Enough runs from enough sources for an interval of its own."""
        return len(self.residuals) >= MIN_RUNS and len(set(self.sources)) >= 2

    @property
    def interval(self) -> Interval | None:
        return from_residuals(self.residuals)

    @property
    def coverage(self) -> tuple[float, int]:
        return loso_coverage(self.residuals, self.sources)


def residual_groups(s: ModernSummary) -> dict[tuple[str, str], Group]:
    """(family, level) -> residuals, plus (POOLED, level) over the families."""
    meas = s.measured_s
    out: dict[tuple[str, str], Group] = {}

    def add(family: str, level: str, r: float, source: str) -> None:
        for key in ((family, level), (POOLED, level)):
            g = out.setdefault(key, Group(key[0], level, [], []))
            g.residuals.append(r)
            g.sources.append(source)

    for i, c in enumerate(s.cases):
        if not c.fitted:
            continue
        fam = family_of(c.run)
        add(fam, s.loso_level[i], float(np.log(meas[i] / s.loso_s[i])), c.run.source)
        prior_s = fit_mod.predict_scaled([c.run], [{}], fit_mod.priors([c.run]))[0, 0]
        add(fam, "prior", float(np.log(meas[i] / prior_s)), c.run.source)
    return dict(sorted(out.items()))


def chosen(groups: dict[tuple[str, str], Group], family: str, level: str) -> Group | None:
    """The group whose residuals price (family, level): its own, else the level pooled over families."""
    g = groups.get((family, level))
    return g if g is not None and g.own else groups.get((POOLED, level))


def intervals_yaml(groups: dict[tuple[str, str], Group]) -> str:
    """The text of data/training_intervals.yaml: per family and level, the factors on a predicted step time."""
    families = [*sorted({f for f, _ in groups} - {POOLED}), POOLED]
    body: dict[str, dict[str, dict[str, object]]] = {}
    for fam in families:
        for level in LEVELS:
            g = chosen(groups, fam, level) if fam != POOLED else groups.get((POOLED, level))
            iv = g.interval if g is not None else None
            if g is None or iv is None:
                continue
            cov, n = g.coverage
            basis = "own" if g.family == fam else "pooled over families"
            body.setdefault(fam, {})[level] = {
                "lo": round(iv.lo, 4), "hi": round(iv.hi, 4), "runs": iv.runs, "sources": sorted(set(g.sources)),
                "basis": basis,
                "loso_coverage": None if np.isnan(cov) else round(cov, 4), "loso_runs": n,
            }
    return ("# 80 % intervals of predicted training step times: [lo x predicted, hi x predicted], per framework\n"
            "# family and calibration level (io.calibration attaches them to every record). Written by\n"
            "# madmax_opt.studies.intervals from the leave-one-source-out residuals of\n"
            "# data/validation/modern/training.yaml (`madmax-opt validate --write-catalog`); do not edit by hand.\n"
            f"coverage: {COVERAGE}\n" + yaml.safe_dump(body, sort_keys=False, width=110))


def write_intervals(s: ModernSummary) -> Path:
    path = Path(str(resources.files("madmax_opt").joinpath(*INTERVALS_FILE)))
    path.write_text(intervals_yaml(residual_groups(s)))
    return path


def coverage_lines(s: ModernSummary) -> list[str]:
    """The report section: per family and level, the interval and its leave-one-source-out coverage."""
    groups = residual_groups(s)
    lines = [
        "## Prediction intervals (80 %) and their coverage",
        "",
        "Each record carries an 80 % interval on its step time from the residuals ln(measured / predicted) of the "
        "level that priced it (core/intervals.py, studies/intervals.py). Coverage: each source's runs against the "
        "interval built from the other sources' residuals (target 75-85 %).",
        "",
        "| family | level | runs | sources | interval (x predicted) | LOSO coverage | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for (fam, level), g in groups.items():
        iv = g.interval
        cov, n = g.coverage
        span = "-" if iv is None else f"{iv.lo:.3f} - {iv.hi:.3f}"
        verdict = "-" if np.isnan(cov) else ("pass" if within_target(cov) else "**outside 75-85 %**")
        note = "" if g.own or fam == POOLED else " (priced with the pooled row)"
        covered = "- (one source)" if np.isnan(cov) else f"{100 * cov:.1f} % of {n}"
        lines.append(f"| {fam} | {level}{note} | {len(g.residuals)} | {len(set(g.sources))} | {span} "
                     f"| {covered} | {verdict} |")
    return lines


def coverage_summary(s: ModernSummary) -> list[str]:
    """One line per (family, level) that prices records: its 80 % interval's leave-one-source-out coverage."""
    groups = residual_groups(s)
    out = []
    for (fam, level), g in groups.items():
        cov, n = g.coverage
        if fam == POOLED or np.isnan(cov):
            continue
        out.append(f"80 % interval coverage, {fam} / {level}: {100 * cov:.1f} % of {n} left-out runs "
                   f"(target 75-85 %)")
    return out
