"""A lower bound on the step time of every plan of one DLRM hardware option, without placing a table: the
recommender search (search/dlrm_search.solve_dlrm) builds no CP-SAT placement model for an option whose bound is
above the best plan found on another option (the option cannot hold the optimum).

The step (model/dlrm_dense.step_terms) is, in the embedding components lf, lb (busiest GPU's lookups), cin, cout
(id and pooled all-to-alls: per collective its busiest lane + latency) and dp (data-parallel tables' all-reduce),
exactly a sum of two maxima of linear forms plus terms without embeddings (since max(x, y) - max(0, y - x) = x):

  forward  = max(lf + tf + bf,  lf + tf + ce + cout,  ce + cout + F)        ce = cin, or with pipelined input
  backward = max(tb + lb + bb,  tb + lb + cout,  cout + S + dp)  (training)    dist max(0, cin - tf - tb)
  step     = forward + backward + tp + moe + optimizer                       (F: FSDP gathers, S: gradient sync)

So step >= (any forward form) + (any backward form) + rest, each a non-negative weighting w of the components plus
a constant of the dense plan. For the set U of shardings a placement uses, each component is at least the average
over the N GPUs of one of its lanes plus the latency of its collectives of a kind in U, and every table adds to
those sums what one table of its option adds (search/placement_bound.term_totals), so

  w . components >= sum_{c of a kind in U} w_c lat_c + (1 / N) sum_tables min_{options o of U for its group} cost_w(o)

(the averaging bound of search/placement_bound.py in seconds, per weighting). The bound of the option is the
minimum over U and over the structurally valid dense plans of the largest (forward, backward) pair; memory is
ignored (a lower bound still)."""

from __future__ import annotations

import numpy as np

from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.model.dlrm import Layout
from madmax_opt.model.dlrm_dense import DenseTerms
from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_KIND,
    COLLECTIVE_LANES,
    INPUT_COLLECTIVES,
    OUTPUT_COLLECTIVES,
    TERM_INDEX,
    EmbeddingOptions,
)
from madmax_opt.model.dlrm_spec import DLRMStack, DLRMTask
from madmax_opt.search.placement_bound import cheapest_sums, table_shards, term_totals

COMPONENTS = ("lf", "lb", "cin", "cout", "dp")
_COMPONENT_OF = {**{c: "cin" for c in INPUT_COLLECTIVES}, **{c: "cout" for c in OUTPUT_COLLECTIVES},
                 "dp_allreduce": "dp"}
ROUNDING_MARGIN = 1e-9  # relative: the bound's sums round differently from the step's (float)


def step_forms(dense: DenseTerms, stack: DLRMStack, task: DLRMTask) -> tuple[Arr, Arr]:
    """(weights (forms, 5) over COMPONENTS, constants (forms, dense plans)): step >= w . components + const for
    every form (the module docstring's forward x backward pairs, with ``rest`` in every constant)."""
    bf, bb, tf, tb = dense.bottom_fwd_s, dense.bottom_bwd_s, dense.top_fwd_s, dense.top_bwd_s
    zero = 0.0 * bf
    # ce (the exposed id all-to-all) >= cin, or with pipelined input dist >= 0 and >= cin - tf - tb
    ces: list[tuple[tuple[int, ...], Arr]] = [((0, 0, 1, 0, 0), zero)]
    if stack.pipeline_input_dist:
        ces = [((0, 0, 0, 0, 0), zero), ((0, 0, 1, 0, 0), -(tf + tb))]
    fwd: list[tuple[tuple[int, ...], Arr]] = [((1, 0, 0, 0, 0), tf + bf)]
    for (w, k) in ces:
        fwd.append((_add(w, (1, 0, 0, 1, 0)), k + tf))  # lf + tf + ce + cout
        fwd.append((_add(w, (0, 0, 0, 1, 0)), k + dense.fsdp_fwd_s))  # ce + cout + F
    if task.kind == "train":  # inference has no lb, gradient all-to-all or sync: backward = tb + bb
        bwd: list[tuple[tuple[int, ...], Arr]] = [((0, 1, 0, 0, 0), tb + bb), ((0, 1, 0, 1, 0), tb),
                                                  ((0, 0, 0, 1, 1), dense.sync_s)]
    else:
        bwd = [((0, 0, 0, 0, 0), tb + bb)]
    rest = dense.tp_comm_s + dense.moe_a2a_s + dense.optimizer_s
    weights = np.array([_add(wf, wb) for wf, _ in fwd for wb, _ in bwd], dtype=np.float64)
    consts = np.array([kf + kb + rest for _, kf in fwd for _, kb in bwd], dtype=np.float64)
    return weights, consts


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def averaging_bounds(opts: EmbeddingOptions, lay: Layout, weights: Arr) -> dict[frozenset[str], Arr]:
    """Per set U of shardings that can hold every group: (forms,) lower bounds on weights . components of every
    placement that uses exactly U (the module docstring's averaging bound; the best of a few lane choices)."""
    per_table = term_totals(opts.coef, opts.options, lay).astype(np.float64) * table_shards(opts.options)[:, None]
    widest = max(len(lanes) for lanes in COLLECTIVE_LANES.values())
    # (options, lane choices, forms): what one table of each option adds to the sums, lane k of every collective
    # (its last where it has fewer): each choice gives a valid bound, the best is kept
    cost = np.stack([np.stack([per_table[:, cols].sum(axis=1) for cols in _term_columns(k)], axis=1) @ weights.T
                     for k in range(widest)], axis=1)
    out: dict[frozenset[str], Arr] = {}
    for used, least in cheapest_sums(opts.options, opts.counts, cost):  # least: (lanes, forms)
        latency = np.zeros(len(COMPONENTS))
        for c, comp in _COMPONENT_OF.items():
            if COLLECTIVE_KIND[c] in used:
                latency[COMPONENTS.index(comp)] += opts.latency_s.get(c, 0.0)
        out[frozenset(used)] = (weights @ latency + least / lay.gpus).max(axis=0)
    return out


def _term_columns(k: int) -> list[list[int]]:
    """Per component, the term columns whose sum it bounds: lookups themselves, each collective's lane k."""
    cols: list[list[int]] = [[TERM_INDEX["lookup_fwd"]], [TERM_INDEX["lookup_bwd"]], [], [], []]
    for c, lanes in COLLECTIVE_LANES.items():
        cols[COMPONENTS.index(_COMPONENT_OF[c])].append(TERM_INDEX[f"{c}.{lanes[min(k, len(lanes) - 1)]}"])
    return cols


def step_floor_s(opts: EmbeddingOptions, lay: Layout, dense: DenseTerms, valid: IntArr, stack: DLRMStack,
                 task: DLRMTask) -> float:
    """A lower bound on the step time of every plan of the option (dense plans ``valid``, any placement of
    ``opts``); +inf when no dense plan is valid or no set of shardings holds every group."""
    if len(valid) == 0:
        return float("inf")
    weights, consts = step_forms(dense, stack, task)
    consts = consts[:, valid]
    floor = float("inf")
    for bound in averaging_bounds(opts, lay, weights).values():
        floor = min(floor, float((bound[:, None] + consts).max(axis=0).min()))
    return floor * (1.0 - ROUNDING_MARGIN)


__all__ = ["COMPONENTS", "averaging_bounds", "step_floor_s", "step_forms"]
