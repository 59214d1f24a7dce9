"""results/validation/inferencex.md: the InferenceX points predicted in sample, leave-one-source-out and
leave-one-GPU-out, per (GPU, framework), per metric and per serving feature (MTP, disaggregation, attention DP,
small batches), with the calibration record of every pair, the worst held-out points and the coverage of the
serving prediction intervals."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from madmax_opt.model.serving_calibration import ServingParams
from madmax_opt.studies.inferencex import DATA_FILE, METRICS, Point, PreparedPoint, prepared_points
from madmax_opt.studies.serving_fit import UNCALIBRATED_ABOVE, Evaluation, evaluate_all
from madmax_opt.studies.serving_intervals import coverage_lines

TARGET_MEDIAN, TARGET_MAX, TARGET_EXPRESSIBLE = 0.15, 0.40, 0.90  # issue 23 "done when" (held-out points)
SMALL_BATCH = 8  # concurrency at or below which a point counts as small-batch decode
NAMES = {"tput_per_gpu": "output tok/s per GPU", "tpot": "median TPOT"}


def _cell(errors: list[float]) -> str:
    if not errors:
        return "- | -"
    a = [abs(e) for e in errors]
    return f"{statistics.median(a):.1%} | {max(a):.1%}"


def _table(ev: Evaluation, points: dict[str, Point], label: str, key: Callable[[Point], str]) -> list[str]:
    lines = [
        f"| {label} | points | in-sample median | max | 5-fold median | max | LOSO median | max | LOGO median | max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[str, list[str]] = {}
    for cid in ev.in_sample:
        pid = cid.split(":")[0]
        if pid in points:
            groups.setdefault(key(points[pid]), []).append(cid)
    for name, ids in sorted(groups.items()):
        n = len({i.split(":")[0] for i in ids})
        lines.append(
            f"| {name} | {n} | {_cell([ev.in_sample[i] for i in ids])} | {_cell([ev.kfold[i] for i in ids])} | "
            f"{_cell([ev.loso[i] for i in ids])} | {_cell([ev.logo[i] for i in ids])} |"
        )
    return lines


def inferencex_lines(ev: Evaluation | None = None) -> list[str]:
    ev = ev or evaluate_all()
    ok, refused = prepared_points()
    points = {p.point.id: p.point for p in ok}
    total = len(ok) + len(refused)
    ix = [c.case.id for c in ev.cases if c.case.id.split(":")[0] in points]

    def ids(metric: str) -> list[str]:
        return [i for i in ix if i.endswith(":" + metric)]

    def verdict(errors: list[float]) -> str:
        a = [abs(e) for e in errors]
        good = statistics.median(a) <= TARGET_MEDIAN and max(a) <= TARGET_MAX
        return "meets" if good else "misses"

    lines = [
        "# InferenceX serving points: predicted vs measured",
        "",
        f"Data: `data/validation/modern/{DATA_FILE}` (SemiAnalysis InferenceX, {total} points; PROVENANCE.md). Each "
        "point is posed as serving engines by `studies/inferencex.py` (mean request 0.9 L of the [0.8 L, L] "
        "lengths; attention DP as one-GPU replicas sharing one expert pool, batch per DP rank; disaggregated "
        "rows as a prefill and a decode engine; MTP with the framework's draft count) and priced by the model of "
        "`madmax-opt evaluate`. Calibration: one fit per (GPU, framework) on these points and the runs of "
        "`inference.yaml` together (`studies/serving_fit.py`, written by `madmax-opt fit-serving`). In-sample: "
        "the full fit. 5-fold: the points split in five folds by id, each fold predicted by a refit on the other "
        "four (held-out points of the same pairs, as the issue's kept-aside points). LOSO: every point of a source (dashboard API snapshot, re-hosted CI artifacts) removed, "
        "every level refitted, the removed points predicted with what the rest resolves to. LOGO: the same with "
        "every point of a GPU removed (the GPU is then priced by its family's pooled fit and the framework's).",
        "",
        f"**Expressible: {len(ok)} of {total} ({len(ok) / total:.1%}; target {TARGET_EXPRESSIBLE:.0%}).** Refused:",
        "",
    ]
    reasons: dict[str, list[str]] = {}
    for p, why in refused:
        reasons.setdefault(why.split(": ", 1)[-1], []).append(p.id)
    lines += [f"- {why}: {len(v)} ({', '.join(v)})" for why, v in sorted(reasons.items())]
    lines += ["", "| metric | in-sample median | max | 5-fold median | max | LOSO median | max | LOGO median | max |",
              "|---|---|---|---|---|---|---|---|---|"]
    for m in METRICS:
        i = ids(m)
        lines.append(f"| {NAMES[m]} | {_cell([ev.in_sample[k] for k in i])} | {_cell([ev.kfold[k] for k in i])} | "
                     f"{_cell([ev.loso[k] for k in i])} | {_cell([ev.logo[k] for k in i])} |")
    held = {"5-fold (held-out points)": ev.kfold, "LOSO": ev.loso, "LOGO": ev.logo}
    lines += [
        "",
        f"Held-out target (median <= {TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%} over both metrics): "
        + "; ".join(f"{name} {verdict([e[k] for k in ix])} ({_cell([e[k] for k in ix]).replace(' | ', ' median, max ')})"
                    for name, e in held.items()) + ".",
        "",
        "## Per (GPU, framework)",
        "",
    ]
    records = {pair: status_label(ev, pair) for pair in {p.pair for p in points.values()}}
    lines += _table(ev, points, "GPU / framework", lambda p: f"{p.gpu} / {p.framework} ({records[p.pair]})")
    lines += [
        "",
        f"Rule (`serving_fit.decide`, `with_unseen_sources`): a pair whose median |error| over its runs "
        f"(inference.yaml and InferenceX), in sample or held out (5-fold, its own fit refitted without the fold), "
        f"exceeds {UNCALIBRATED_ABOVE:.0%} over all its runs or over the runs of any one of its sources or data "
        "sets, or whose runs predicted leave one source out (by fits that never saw their source: another model or "
        "benchmark) exceed it over all its runs or over one source or data set, is recorded `uncalibrated` in `data/serving_calibration.yaml` (`fit.status`, "
        "`fit.uncalibrated_on`, with `kfold_by_group`), and evaluate/solve records say so and why. An uncalibrated "
        "pair is priced by its fallback (the level of a pair without runs: its GPU's or family's and its "
        "framework's pooled fits composed) when the fallback's 5-fold median over the same runs is lower "
        "(`fit.priced_by: fallback`); its rows above are then the fallback's. A pair uncalibrated only on unseen "
        "sources keeps the calibrated interval (its held-out points are within the rule); the others carry the "
        "family interval.",
        "",
        *decision_lines(ev),
        "",
        "## Per source, GPU, framework and serving feature",
        "",
        *_table(ev, points, "source", lambda p: p.source),
        "",
        *_table(ev, points, "GPU", lambda p: p.gpu),
        "",
        *_table(ev, points, "framework", lambda p: p.framework),
        "",
        *_table(ev, points, "feature", lambda p: "disaggregated" if p.disagg else "MTP" if p.mtp
                else "attention DP" if p.dp_attention else f"concurrency <= {SMALL_BATCH}"
                if p.concurrency <= SMALL_BATCH else "other"),
        "",
        *worst_lines(ev, points, ix),
        "",
        *coverage_lines(ev),
        "",
        "## Every point",
        "",
        "| point | metric | measured | predicted | in-sample | 5-fold | LOSO | LOGO |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cid in ix:
        c = next(x.case for x in ev.cases if x.case.id == cid)
        scale, unit = (1e3, "ms") if cid.endswith("tpot") else (1.0, "tok/s/GPU")
        pred = c.measured * (1.0 + ev.in_sample[cid])
        pid, metric = cid.split(":")
        lines.append(f"| {pid} {points[pid].key} | {metric} ({unit}) | {c.measured * scale:,.4g} | "
                     f"{pred * scale:,.4g} | {ev.in_sample[cid]:+.1%} | {ev.kfold[cid]:+.1%} | {ev.loso[cid]:+.1%} | "
                     f"{ev.logo[cid]:+.1%} |")
    return lines


WORST = 10


def status_label(ev: Evaluation, pair: tuple[str, str]) -> str:
    """The pair's status as the catalog records it (``serving_fit.decide``), and its pricing level if not its own."""
    d = ev.decisions.get(pair)
    if d is None:
        return "uncalibrated"
    return d.status + (f", priced by {d.fallback_level}" if d.priced_by == "fallback" else "")


def decision_lines(ev: Evaluation) -> list[str]:
    """The uncalibrated pairs: the medians that made them so and what prices them."""
    lines = ["| uncalibrated pair | on | cases | own fit in-sample | own fit 5-fold | worst 5-fold group | "
             "leave one source out | worst group | fallback 5-fold | priced by |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (gpu, fw), d in sorted(ev.decisions.items()):
        if d.status != "uncalibrated":
            continue
        runs = sum(1 for c in ev.cases if c.case.pair == (gpu, fw))
        group, worst = max(d.by_group.items(), key=lambda kv: kv[1])
        loso_group, loso_worst = max(d.loso_by_group.items(), key=lambda kv: kv[1])
        priced = f"fallback ({d.fallback_level})" if d.priced_by == "fallback" else "its own fit"
        lines.append(f"| {gpu} / {fw} | {', '.join(d.on)} | {runs} | {d.in_sample:.1%} | {d.kfold:.1%} | {group}: "
                     f"{worst:.1%} | {d.loso:.1%} | {loso_group}: {loso_worst:.1%} | {d.fallback_kfold:.1%} "
                     f"({d.fallback_level}) | {priced} |")
    return lines


def dominant_term(pp: PreparedPoint, params: ServingParams) -> str:
    """The largest term of the point's decode-engine TPOT under ``params`` and its share (e.g. 'expert_gemm 41%');
    a disaggregated point's decode engine runs no prefills (its pure decode round, as ``_disaggregated`` prices)."""
    step = pp.decode.terms([params]).step
    if pp.prefill is not None:
        step = {k: v for k, v in step.items() if k not in ("prefill", "kv_transfer")}
    total = sum(float(v[0]) for v in step.values()) or 1.0
    name = max(step, key=lambda k: float(step[k][0]))
    return f"{name} {float(step[name][0]) / total:.0%}"


def worst_lines(ev: Evaluation, points: dict[str, Point], ix: list[str]) -> list[str]:
    """The WORST held-out (5-fold) errors with the point's plan, concurrency, serving features and the term that
    dominates its decode step under the in-sample fit."""
    prepared = {p.point.id: p for p in prepared_points()[0]}
    lines = [
        f"## The {WORST} worst held-out points (5-fold)",
        "",
        "| # | point | metric | 5-fold | LOSO | decode plan (per engine) | concurrency | MTP | disagg | attention DP "
        "| largest TPOT term (in-sample fit) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rank, cid in enumerate(sorted(ix, key=lambda i: -abs(ev.kfold[i]))[:WORST], start=1):
        pid, metric = cid.split(":")
        p, pp = points[pid], prepared[pid]
        plan = pp.decode.plans
        engine = (f"dp {int(plan.dp[0])} tp {int(plan.tp[0])} ep {int(plan.ep[0])} batch {int(plan.batch[0])}"
                  + (f" x{p.decode.workers}" if p.decode is not None and p.decode.workers > 1 else ""))
        yes = {True: "yes", False: "-"}
        lines.append(f"| {rank} | {pid} {p.key} | {metric} | {ev.kfold[cid]:+.1%} | {ev.loso[cid]:+.1%} | {engine} | "
                     f"{p.concurrency} | {yes[p.mtp]} | {yes[p.disagg]} | {yes[p.dp_attention]} | "
                     f"{dominant_term(pp, ev.fit.resolve(*p.pair))} |")
    return lines


def write_inferencex_report(out: Path, ev: Evaluation | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "inferencex.md"
    path.write_text("\n".join(inferencex_lines(ev)) + "\n")
    return path
