"""Lower bounds on the uneven-stage search's bases, for all bases at once (exact pruning before CP-SAT).

A base of the uneven search (``stages.py``) fixes (hardware, dp, tp, pp, cp, vpp, mbs, zero, sp, ep); CP-SAT picks
one row (layers n_s, recompute r_s) per stage s and minimises

    p v T = p v m tmax + (p - 1) sum_s t_s + p v (dpmax + optmax)      (integer microseconds per row).

Bases that differ only in vpp (a *shape* is a base without its vpp) share every stage cost but two: the p2p time
per micro-batch (2 v x the p2p of one chunk boundary, ``training.layer_costs``) and the activations a stage holds
(``pipeline.stage_in_flight``). So the stage costs are evaluated once per shape at vpp = 1, for every (first /
middle / last stage, layers, recompute), and each base's rows are derived from them: t_v = t_1 + (v - 1) x the vpp = 1
p2p time, memory = memory without stored activations + n x in-flight(s, v) x activations per layer.

Per base, every term of the objective is bounded over every split of the L layers (so their sum bounds it):

- tmax >= the least tau such that rows <= tau (fitting in memory, at least ``spec.min_stage_layers`` layers) can
  hold the model: sum_s (most layers stage s can hold) >= L >= sum_s (fewest layers it may hold); no such tau:
  no split fits, the base is infeasible;
- dpmax and optmax likewise over their own rows (memory and the fewest-layers rule relaxed);
- sum_s t_s >= the linear stage total of ``stages._lower_bounds_us`` (no recompute, no exposed ZeRO-3 traffic).

Mixed stages (each stage on any listed system, within each GPU type's supply): a row's costs depend on its own
hardware only, so the rows of every hardware option are derived alike and each (stage, layers) entry above takes
its least over them (dp, optimizer); tmax keeps each GPU type's stage limit (``least_max_mixed``). Both only relax
the exact rows, so the bound stays valid.

``layer_parts`` (the cheapest per-layer and extra times of a base on one hardware option) and
``composition_bound_us`` (a bound per fixed number of stages on each hardware option) feed the linear bounds of
``stages.py``.

Derived values differ from the exact ones (``stage_rows.candidates``) by float rounding only: times are taken 1 us
below their rounded value and the memory test is relaxed by 1e-9, so each bound is a relaxation of the exact rows
(``tests/test_stage_bounds.py`` checks this on sampled bases). A base whose bound is not below p v x the incumbent
has no strictly better split: CP-SAT would prove it infeasible, so skipping it changes no result.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.core.units import US
from madmax_opt.model.collectives import Tiers
from madmax_opt.model.pipeline import stage_in_flight
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.plan_settings import degree_settings
from madmax_opt.model.step_time import step_form
from madmax_opt.model.training import LayerCosts, layer_costs, stage_costs

MEMORY_SLACK = 1e-9  # relative: derived memory vs the exact sum of its terms
KINDS = 3  # stage kinds: first (embedding), middle, last (head)
CHUNK = 1 << 22  # derived rows (bases x stages x layers x modes) per batch
DIRECT_LEADING = 1 << 17  # _leading: entries up to which every entry is compared (measured: 3x faster at 2.5e4
# entries, 1.3x slower at 7e5, than the bisection)


def take_lc(lc: LayerCosts, idx: IntArr) -> LayerCosts:
    """``lc`` for the plans ``idx`` (per-plan arrays indexed, taking the shape of ``idx``; scalars kept)."""
    n = len(lc.plans)

    def pick(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
            return value[idx]
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        return value

    fields = {f.name: pick(getattr(lc, f.name)) for f in dataclasses.fields(lc)}
    fields["plans"] = lc.plans.take(idx)
    fields["tiers"] = Tiers(*(getattr(lc.tiers, f.name)[:, idx] for f in dataclasses.fields(Tiers)))
    return LayerCosts(**fields)


@dataclasses.dataclass(frozen=True)
class ShapeRows:
    """Stage costs of every shape at vpp = 1, indexed [shape, kind, layers, mode] (layers 0..L; 0 and more than
    L - p + 1 layers are not rows: time inf)."""

    t_s: Arr  # time per micro-batch
    mem0: Arr  # memory per GPU without stored activations
    dp_s: Arr  # exposed DP sync per step
    opt_s: Arr  # optimizer step
    act: Arr  # [shape, mode] activation bytes one layer keeps per micro-batch in flight
    p2p_s: Arr  # [shape] p2p time per micro-batch at vpp = 1
    capacity: Arr  # [shape] usable bytes per GPU


def shape_rows(model: Model, shapes: PlanArrays, modes: list[int]) -> ShapeRows:
    """``ShapeRows`` of ``shapes`` (all with the same pp; their vpp is ignored)."""
    pr = model.problem
    layers, k, r = model.workload.layers, len(shapes), len(modes)
    p = int(shapes.pp[0])
    base = PlanArrays(**{**shapes.__dict__, "vpp": np.ones(k, dtype=np.int64)})
    sm = np.repeat(np.arange(k), r)  # one layer_costs row per (shape, mode)
    per_mode = PlanArrays(**{**base.take(sm).__dict__, "recompute": np.tile(np.array(modes, dtype=np.int64), k)})
    lc = layer_costs(model.workload, pr.training_task, pr.stack, model.table, per_mode)
    most = layers - p + 1
    # axes [shape, kind, layers, mode]: the layer costs vary along shape and mode only, the stage's layer count and
    # kind along their own axes, and stage_costs (elementwise) broadcasts them: each entry is the same float as
    # over fully expanded rows, without repeating the per-(shape, mode) terms (collectives) on every entry
    rows = take_lc(lc, (np.arange(k)[:, None] * r + np.arange(r)[None, :])[:, None, None, :])
    kind = np.arange(KINDS)[None, :, None, None]
    n = np.arange(1, most + 1, dtype=np.float64)[None, None, :, None]
    sc = stage_costs(rows, pr.stack, model.table.hbm_bw[rows.plans.hw], n, (kind == 0) * 1.0,
                     (kind == KINDS - 1) * 1.0, np.zeros((1, 1, 1, 1)))

    def grid(values: Arr) -> Arr:
        out = np.full((k, KINDS, layers + 1, r), np.inf)
        out[:, :, 1 : most + 1, :] = np.broadcast_to(values, (k, KINDS, most, r))
        return out

    cap = model.table.hbm_bytes[shapes.hw] * (1.0 - pr.stack.memory_reserve_fraction)
    return ShapeRows(grid(sc.per_micro_batch_s), grid(sc.memory.total), grid(sc.dp_exposed_s),
                     grid(sc.optimizer_s), lc.act_stored_bytes.reshape(k, r), lc.pp_comm_s[::r], cap)


def least_max(g: Arr, layers: int, weight: Arr | None = None) -> Arr:
    """Per item (axis 0): the least tau such that every stage (axis 1, ``weight`` stages alike) has a row (axis 2:
    layers 0..L, inf where none) <= tau and those rows can make up ``layers``: sum_s max n_s >= layers >= sum_s
    min n_s; inf when no tau can. ``g`` holds integers (rounded microseconds).

    Each condition holds from a threshold on, read off the sorted rows (no search over tau): with most_s(tau) + 1 the
    count of entries <= tau of the suffix minima of stage s (nondecreasing), sum_s w_s most_s >= layers holds once
    the entries <= tau weigh layers + sum_s w_s; with fewest_s(tau) the count of prefix minima > tau, sum_s w_s
    fewest_s <= layers once the entries <= tau weigh (L + 1) sum_s w_s - layers; a row within tau on every stage of
    nonzero weight from the largest of the stages' least rows. The least tau is the largest threshold (each an
    entry of ``g``), inf where one is."""
    w = np.ones(g.shape[1]) if weight is None else np.asarray(weight, dtype=np.float64)
    suffix = np.minimum.accumulate(g[..., ::-1], axis=2)[..., ::-1]  # nondecreasing: most layers within tau
    prefix = np.minimum.accumulate(g, axis=2)  # nonincreasing: fewest layers within tau
    entry_w = np.repeat(w, g.shape[2])  # the weight of each entry of a flattened item (its stage's)

    def threshold(a: Arr, need: float) -> Arr:
        """Per item: the least entry v of ``a`` such that the entries <= v weigh at least ``need`` (inf: none)."""
        flat = a.reshape(len(a), -1)
        order = np.argsort(flat, axis=1, kind="stable")
        values = np.take_along_axis(flat, order, axis=1)
        reached = np.cumsum(entry_w[order], axis=1) >= need
        return np.where(reached[:, -1], values[np.arange(len(a)), np.argmax(reached, axis=1)], np.inf)

    total = float(w.sum())
    least_row = np.where(w[None, :] != 0, g.min(axis=2), -np.inf).max(axis=1)  # every weighted stage has a row
    return np.maximum.reduce([threshold(suffix, layers + total), threshold(prefix, g.shape[2] * total - layers),
                              least_row])


def _leading(a: Arr, tau: Arr, *, within: bool) -> IntArr:
    """Per row of ``a`` (last axis; ``tau`` per item, axis 0): how many leading entries are <= tau (``within``; the
    rows nondecreasing) or > tau (the rows nonincreasing), i.e. ``(a <= tau).sum(-1)`` or ``(a > tau).sum(-1)``,
    counted directly where ``a`` is small, else found by bisection over the positions (log2 of the row length
    gathers instead of one compare per entry)."""
    if a.size <= DIRECT_LEADING:  # small: one comparison of every entry costs less than the bisection's steps
        tau_of = tau.reshape(-1, *([1] * (a.ndim - 1)))
        return np.count_nonzero(a <= tau_of if within else a > tau_of, axis=-1)
    rows = a.reshape(-1, a.shape[-1])
    limit = np.broadcast_to(tau.reshape(-1, *([1] * (a.ndim - 2))), a.shape[:-1]).ravel()
    lo, hi = np.zeros(len(rows), dtype=np.int64), np.full(len(rows), a.shape[-1], dtype=np.int64)
    at = np.arange(len(rows))
    while np.any(lo < hi):
        mid = np.minimum((lo + hi) // 2, a.shape[-1] - 1)
        value = rows[at, mid]
        lead = (value <= limit) if within else (value > limit)  # the leading block holds mid
        lo, hi = np.where((lo < hi) & lead, mid + 1, lo), np.where((lo < hi) & ~lead, mid, hi)
    return lo.reshape(a.shape[:-1])


def _bisect(flat: Arr, fits: Callable[[Arr], Arr]) -> Arr:
    """Per item: the least finite value tau of ``flat`` (axis 1) where ``fits`` holds; inf where it holds at none.
    ``fits`` must be nondecreasing in tau and change only at values of ``flat`` (it counts rows <= tau), so this is
    also the least integer tau in the range of the finite values (the bisection runs over the sorted values:
    log2 of their count, not of their range)."""
    items = np.arange(len(flat))
    values = np.sort(flat, axis=1)  # finite first (inf last; no nan)
    count = np.isfinite(values).sum(axis=1)
    lo, hi = np.zeros(len(flat), dtype=np.int64), np.maximum(count - 1, 0)
    top = np.where(count > 0, values[items, hi], 0.0)  # none finite: tau 0, as over an empty range
    ok = fits(top)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        good = fits(np.where(count > 0, values[items, mid], 0.0))
        hi, lo = np.where(good, mid, hi), np.where(good, lo, mid + 1)
    return np.where(ok, np.where(count > 0, values[items, hi], 0.0), np.inf)


def least_max_mixed(g: Arr, layers: int, supply: list[tuple[list[int], IntArr]]) -> Arr:
    """``least_max`` for stages on any of several hardware options (axis 1 of ``g``: [item, option, stage, layers])
    with stage limits: ``supply`` holds (options of one GPU type, stages it may hold per item). Monotone upper bounds
    on the layers the stages can hold within tau (so the least tau found is a lower bound): sum_s max_h most_sh, and
    per limited type G with at most a stages, sum_s max_{h not in G} most_sh plus the a largest gains of moving a
    stage onto G (every split puts at most a stages on G: a maximum over such sets, nondecreasing in tau)."""
    suffix = np.minimum.accumulate(g[..., ::-1], axis=3)[..., ::-1]
    prefix = np.minimum.accumulate(g, axis=3)
    items, options, stages = g.shape[:3]
    rows = np.arange(items)
    placed = np.ones(items, dtype=bool)  # every option limited: the limits must hold every stage
    if {h for group, _ in supply for h in group} >= set(range(options)):
        placed = np.sum([allowed for _, allowed in supply], axis=0) >= stages

    def fits(tau: Arr) -> Arr:
        most = _leading(suffix, tau, within=True) - 1  # [item, option, stage]; -1: none within tau
        fewest = _leading(prefix, tau, within=False).min(axis=1)
        best = most.max(axis=1)
        ok = placed & np.all(best >= 0, axis=1) & (fewest.sum(axis=1) <= layers)
        cap = best.sum(axis=1)
        for group, allowed in supply:
            rest = [h for h in range(options) if h not in group]
            other = most[:, rest].max(axis=1) if rest else np.full_like(best, -1)
            gain = -np.sort(other - best, axis=1)  # largest first, >= 0
            top = np.concatenate([np.zeros((items, 1)), np.cumsum(gain, axis=1)], axis=1)
            cap = np.minimum(cap, other.sum(axis=1) + top[rows, np.clip(allowed, 0, stages)])
            ok &= (other < 0).sum(axis=1) <= allowed  # stages with no row off G within tau must be on G
        return ok & (cap >= layers)

    return _bisect(g.reshape(items, -1), fits)


def _least_mode(values: Arr) -> Arr:
    """``values.min(axis=-1)`` over the few recompute modes, as an elementwise minimum of one slice per mode."""
    return functools.reduce(np.minimum, (values[..., j] for j in range(values.shape[-1])))


def _rounded_low(seconds: Arr) -> Arr:
    """Integer microseconds at most the exact rows' (rounded once, ``stage_rows.candidates``)."""
    return np.rint(seconds * US) - 1.0


def strong_bounds(
    model: Model,
    bases: PlanArrays,
    total_us: Arr,
    modes: list[int],
    hw_choices: list[int] | None = None,
    supply: list[tuple[list[int], IntArr]] | None = None,
) -> Arr:
    """Lower bound on p v T (``stages._solve_base``'s objective) per base, inf where no split fits. ``total_us``: the
    linear stage total per base (``stages._lower_bounds_us``, per component least over the stage hardware).
    ``hw_choices`` (mixed stages): the hardware options every stage may use, ``supply`` per GPU type with a supply
    its options and the stages it may hold per base (``least_max_mixed``); dp and optimizer take their least over
    the options. None: each base's own option."""
    out = np.full(len(bases), np.inf)
    systems: list[int | None] = list(hw_choices) if hw_choices else [None]
    groups = [([systems.index(h) for h in hws], allowed) for hws, allowed in supply or []]
    layers = model.workload.layers
    key = np.concatenate([bases.hw[:, None], shape_key(bases)], axis=1)
    _, first, shape_of = np.unique(key, axis=0, return_index=True, return_inverse=True)
    shape_of = shape_of.ravel()
    for p in np.unique(bases.pp[first]).tolist():
        in_p = np.flatnonzero(bases.pp[first] == p)
        per_hw = [shape_rows(model, _on(bases.take(first[in_p]), hw), modes) for hw in systems]
        local = np.full(len(first), -1)
        local[in_p] = np.arange(len(in_p))
        kinds = stage_kinds(p)
        weight = np.array([1.0, p - 2.0, 1.0])
        dp = least_max(np.min([_rounded_low(_least_mode(r.dp_s)) for r in per_hw], axis=0), layers, weight)
        opt = least_max(np.min([_rounded_low(_least_mode(r.opt_s)) for r in per_hw], axis=0), layers, weight)
        members = np.flatnonzero(bases.pp == p)
        step = max(1, CHUNK // (p * (layers + 1) * len(modes) * len(systems)))
        for start in range(0, len(members), step):
            j = members[start : start + step]
            sh = local[shape_of[j]]
            v = bases.vpp[j].astype(np.float64)
            m = model.problem.training_task.global_batch / (bases.dp[j] * bases.mbs[j])
            g = np.stack([stage_times_us(r, sh, kinds, v, m, p) for r in per_hw], axis=1)  # [base, hw, stage, n]
            tmax = least_max(g[:, 0], layers) if len(systems) == 1 else least_max_mixed(
                g, layers, [(pos, allowed[j]) for pos, allowed in groups])
            # p v T in the integer form (model/step_time.py), each term at its bound; sum_s t_s: the linear total,
            # less 1 us per stage (rows are taken 1 us low)
            out[j] = step_form(m, p, v).integer_value(
                {"stage_max": tmax, "stage_sum": total_us[j] - p, "dp_max": dp[sh], "optimizer_max": opt[sh]})
    return out


def shape_key(plans: PlanArrays) -> IntArr:
    """Per plan, its shape: the plan's array settings (model/plan_settings.py) less vpp (bases of one shape share
    their stage costs) and recompute (chosen per stage), one column each."""
    names = [n for n in degree_settings() if n not in ("vpp", "recompute")]
    return np.stack([getattr(plans, n).astype(np.int64) for n in names], axis=1)


def _on(plans: PlanArrays, hw: int | None) -> PlanArrays:
    """``plans`` on hardware option ``hw`` (None: unchanged)."""
    return plans if hw is None else PlanArrays(**{**plans.__dict__, "hw": np.full(len(plans), hw, dtype=np.int64)})


def stage_kinds(p: int) -> IntArr:
    """Kind of each of ``p`` stages: 0 first, 1 middle, 2 last."""
    return np.minimum(np.arange(p), 1) + (np.arange(p) == p - 1)


def stage_times_us(rows: ShapeRows, sh: IntArr, kinds: IntArr, v: Arr, m: Arr, p: int) -> Arr:
    """[base, stage, layers]: the least rounded time (minus 1 us) of a row of that stage that fits in memory and
    holds at least ``spec.min_stage_layers`` layers; inf where none."""
    s = np.arange(p, dtype=np.float64)
    flight = stage_in_flight(s[None, :], m[:, None], float(p), v[:, None])  # [base, stage]
    n = np.arange(rows.t_s.shape[2], dtype=np.float64)
    fewest = np.maximum(1.0, v[:, None] - (s == 0) - (s == p - 1))  # spec.min_stage_layers
    enough = n[None, None, :] >= fewest[:, :, None]  # [base, stage, layers]
    in_flight = n[None, None, :] * flight[:, :, None]
    capacity = (rows.capacity[sh] * (1.0 + MEMORY_SLACK))[:, None, None]
    t = np.full(enough.shape, np.inf)
    for j in range(rows.t_s.shape[3]):  # one recompute mode at a time: [base, stage, layers] gathers, no copy per mode
        at = (sh[:, None], kinds[None, :])
        fits = enough & (rows.mem0[:, :, :, j][at] + in_flight * rows.act[sh, j][:, None, None] <= capacity)
        np.minimum(t, np.where(fits, rows.t_s[:, :, :, j][at], np.inf), out=t)
    return _rounded_low(t + ((v - 1.0) * rows.p2p_s[sh])[:, None, None])


def layer_parts(model: Model, bases: PlanArrays, hw: int | None) -> tuple[Arr, ...]:
    """Cheapest per-layer time (no recompute), embedding, head, p2p and micro-batches of ``bases`` on ``hw``."""
    p = model.problem
    rows = bases if hw is None else PlanArrays(**{**bases.__dict__, "hw": np.full(len(bases), hw)})
    lc = layer_costs(model.workload, p.training_task, p.stack, model.table, rows)
    per_layer = (
        lc.time["compute"]
        + lc.trainable_fraction * lc.wgrad_s  # weight-gradient GEMMs of trainable layers (all or none here)
        + lc.time["tp_comm"]
        + lc.time["cp_comm"]
        + lc.time["ep_comm"]
        + lc.time["overhead"]
    )
    return per_layer, lc.emb_time_s, lc.head_time_s, lc.pp_comm_s, lc.n_micro


def composition_bound_us(model: Model, base: PlanArrays, hws: list[int], counts: dict[int, int]) -> float:
    """Lower bound on T with k_h stages on hardware h: stage s holds n_s layers at >= c_h each, so with
    tmax = tau, L = sum n_s <= tau sum_h k_h / c_h; and sum_s t_s >= L min_used c_h + the cheapest extras."""
    used = [h for h in hws if counts.get(h, 0) > 0]
    parts = [layer_parts(model, base, h) for h in used]
    c = np.array([float(x[0][0]) for x in parts])
    k = np.array([counts[h] for h in used], dtype=np.float64)
    layers = model.workload.layers
    p, v, m = float(base.pp[0]), float(base.vpp[0]), float(parts[0][4][0])
    total = layers * c.min() + min(float(x[1][0]) for x in parts) + min(float(x[2][0]) for x in parts) \
        + p * min(float(x[3][0]) for x in parts)
    tau = max(layers / float(np.sum(k / c)), total / p)
    form = step_form(m, p, v)  # T >= m tau + (p - 1)/v x total / p (model/step_time.py)
    return float((form.stage_max * tau + form.stage_mean * (total / p))[0]) * US
