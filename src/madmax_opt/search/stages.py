"""Uneven pipelines: CP-SAT chooses the layers and the recompute mode of every stage.

For a base plan (hardware, dp, tp, pp, cp, mbs, zero, sp; 1F1B) the step time is

    T = m * max_s t_s + (p - 1)/p * sum_s t_s + max_s dp_s + max_s opt_s

where stage s with n_s layers and recompute r_s costs t_s = stage_costs(n_s, r_s, first/last extras) per
micro-batch and must fit in memory holding min(p - s, m) micro-batches. Every (s, n, r) candidate is evaluated by
the same vectorised ``training.stage_costs`` as the uniform model, rounded once to microseconds, and CP-SAT picks
one per stage (``add_exactly_one``) with sum_s n_s = L, ``tmax >= t_s`` and the objective p*T (integral).
Raw space: (number of compositions of L into p parts) x R^p, e.g. 10^25 for 126 layers on 16 stages.

Bases are explored best-first by a valid lower bound, (m + p - 1)/p * (L * c_layer + extras): tmax is at least
the mean, recomputation and exposed ZeRO-3 traffic only add. A base whose bound is not below the incumbent
(initially the best uniform plan) cannot improve it, so the search is exact when it finishes within its budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from ortools.sat.python import cp_model

from madmax_opt.analysis.evaluator import Model
from madmax_opt.core.errors import ProblemError
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import RECOMPUTE_MODES, Plan
from madmax_opt.model.training import invalid_codes, layer_costs, stage_costs
from madmax_opt.search.space import enumerate_plans

US = 1e6


@dataclass(frozen=True)
class UnevenResult:
    plan: Plan | None  # None when no uneven plan beats the incumbent
    step_us: float | None  # the solver's (rounded) step time of ``plan``
    status: str  # optimal | feasible (budget ran out) | no-improvement
    bases_solved: int
    bases_pruned: int
    wall_s: float
    booleans: int  # largest CP-SAT model built

    def tolerance_s(self, n_micro: float, pp: int) -> float:
        """Rounding bound: each stage time rounded to 1 us enters m + (p-1) times, dp and optimizer once."""
        return (n_micro + pp + 2) * 0.5 / US


def _bases(model: Model) -> PlanArrays:
    """Distinct pipeline bases (pp > 1, vpp = 1) that are structurally valid whatever the split."""
    plans = enumerate_plans(model.problem)
    if len(plans) == 0:
        return plans
    sel = (
        (plans.pp > 1) & (plans.vpp == 1) & (plans.recompute == plans.recompute.min())
    )  # recompute: per stage
    plans = plans.take(np.flatnonzero(sel))
    if len(plans) == 0:
        return plans
    n_micro = model.problem.training_task.global_batch / (plans.dp * plans.mbs)
    inf = np.full(len(plans), np.inf)
    code = invalid_codes(
        model.workload,
        model.problem.training_task,
        model.table,
        plans,
        n_micro,
        np.zeros_like(inf),
        inf,
        check_layers=False,
    )  # memory is checked per stage candidate
    over_supply = np.array([o.supply is not None and o.gpus > o.supply for o in model.problem.hardware])
    if not model.problem.space.mixed_stages:  # a homogeneous pipeline must fit its GPU type's supply
        code = np.where(over_supply[plans.hw], -1, code)
    plans = plans.take(np.flatnonzero(code == 0))
    if model.problem.space.mixed_stages and len(plans):  # stage hardware is free: one base per shape
        key = np.stack([plans.dp, plans.tp, plans.pp, plans.cp, plans.mbs, plans.zero, plans.sp, plans.ep], axis=1)
        _, first = np.unique(key, axis=0, return_index=True)
        plans = plans.take(np.sort(first))
    return plans


def stage_hardware(model: Model, base: PlanArrays) -> list[int]:
    """Hardware options a stage of ``base`` may use: its own, or one per listed system in mixed mode."""
    if not model.problem.space.mixed_stages:
        return [int(base.hw[0])]
    return sorted({model.system_index(o.system.name) for o in model.problem.hardware})


def _lower_bounds_us(model: Model, bases: PlanArrays) -> NDArray[np.float64]:
    """(m + p - 1)/p * sum of the cheapest possible stage times; per component minimum over stage hardware."""
    p = model.problem
    hw_choices = stage_hardware(model, bases.take([0])) if p.space.mixed_stages else [None]
    parts = []
    for hw in hw_choices:
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
        parts.append((per_layer, lc.emb_time_s, lc.head_time_s, lc.pp_comm_s, lc.n_micro))
    per_layer, emb, head, p2p, n_micro = (np.min([x[i] for x in parts], axis=0) for i in range(5))
    pp = bases.pp.astype(np.float64)
    total = model.workload.layers * per_layer + emb + head + pp * p2p
    return (n_micro + pp - 1) / pp * total * US


def _candidates(
    model: Model, base: PlanArrays, modes: list[int], hw_choices: list[int] | None = None
) -> dict[str, NDArray[np.float64]]:
    """All (stage, layers, recompute, hardware) rows for one base with rounded times, fitting in memory."""
    p = int(base.pp[0])
    layers = model.workload.layers
    hws = np.array(hw_choices if hw_choices is not None else [int(base.hw[0])])
    s, n, r, w = np.meshgrid(np.arange(p), np.arange(1, layers - p + 2), np.array(modes), hws, indexing="ij")
    s, n, r, w = s.ravel(), n.ravel(), r.ravel(), w.ravel()
    rows = base.take(np.zeros(len(s), dtype=np.int64))
    rows = PlanArrays(**{**rows.__dict__, "recompute": r.astype(np.int64), "hw": w.astype(np.int64)})
    pr = model.problem
    lc = layer_costs(model.workload, pr.training_task, pr.stack, model.table, rows)
    sf = s.astype(np.float64)
    sc = stage_costs(
        lc,
        pr.stack,
        model.table.hbm_bw[rows.hw],
        n.astype(np.float64),
        (sf == 0) * 1.0,
        (sf == p - 1) * 1.0,
        np.minimum(p - sf, lc.n_micro),
    )
    capacity = model.table.hbm_bytes[rows.hw] * (1.0 - pr.stack.memory_reserve_fraction)
    fits = sc.memory.total <= capacity
    t_us = np.rint(sc.per_micro_batch_s * US)  # rounded once per candidate
    return {
        "stage": s[fits],
        "layers": n[fits],
        "recompute": r[fits],
        "hw": w[fits],
        "t_us": t_us[fits],
        "dp_us": np.rint(sc.dp_exposed_s * US)[fits],
        "opt_us": np.rint(sc.optimizer_s * US)[fits],
        "n_micro": lc.n_micro[:1],
    }


def _solve_base(
    cand: dict[str, NDArray[np.float64]],
    p: int,
    layers: int,
    incumbent_us: float,
    time_limit_s: float,
    supply: list[tuple[list[int], int]] | None = None,
) -> tuple[str, float | None, list[int], int]:
    """CP-SAT over one base; returns (status, step_us, chosen row indices, booleans)."""
    m_int = round(float(cand["n_micro"][0]))
    stage = cand["stage"].astype(np.int64)
    if any(not np.any(stage == s) for s in range(p)):
        return "infeasible", None, [], 0
    mdl = cp_model.CpModel()
    x = [mdl.new_bool_var(f"x{i}") for i in range(len(stage))]
    t = cand["t_us"].astype(np.int64)
    hi = int(t.max()) + 1
    tmax = mdl.new_int_var(0, hi, "tmax")
    dpmax = mdl.new_int_var(0, int(cand["dp_us"].max()) + 1, "dpmax")
    optmax = mdl.new_int_var(0, int(cand["opt_us"].max()) + 1, "optmax")
    for s in range(p):
        rows = np.flatnonzero(stage == s)
        mdl.add_exactly_one([x[i] for i in rows])
        mdl.add(tmax >= sum(int(t[i]) * x[i] for i in rows))
        mdl.add(dpmax >= sum(int(cand["dp_us"][i]) * x[i] for i in rows))
        mdl.add(optmax >= sum(int(cand["opt_us"][i]) * x[i] for i in rows))
    mdl.add(sum(int(cand["layers"][i]) * x[i] for i in range(len(x))) == layers)
    for hws, stages_allowed in supply or []:  # stages on one GPU type (any of its systems) within its supply
        rows = np.flatnonzero(np.isin(cand["hw"], hws))
        mdl.add(sum(x[i] for i in rows) <= stages_allowed)
    objective = (
        p * m_int * tmax + (p - 1) * sum(int(t[i]) * x[i] for i in range(len(x))) + p * (dpmax + optmax)
    )
    assert p * m_int * hi < 2**50, "objective overflow"
    mdl.minimize(objective)
    if np.isfinite(incumbent_us):
        mdl.add(objective <= int(np.ceil(incumbent_us * p)) - 1)  # only strictly better plans are of interest
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = time_limit_s
    st = solver.solve(mdl)
    if st == cp_model.INFEASIBLE:
        return "infeasible", None, [], len(x)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None, [], len(x)
    chosen = [i for i in range(len(x)) if solver.value(x[i])]
    status = "optimal" if st == cp_model.OPTIMAL else "feasible"
    return status, solver.objective_value / p, chosen, len(x)


def _stage_supply(model: Model, base: PlanArrays, hw_choices: list[int]) -> list[tuple[list[int], int]]:
    """Per GPU type with a supply: (its hardware choices, how many stages of dp*tp*cp GPUs the supply holds)."""
    if not model.problem.space.mixed_stages:
        return []
    per_stage = int(base.dp[0] * base.tp[0] * base.cp[0])
    out = []
    hw_by_gpu: dict[str, list[int]] = {}
    for hw in hw_choices:
        hw_by_gpu.setdefault(model.problem.hardware[hw].gpu.name, []).append(hw)
    for gpu, hws in hw_by_gpu.items():
        limits = [o.supply for o in model.problem.hardware if o.gpu.name == gpu and o.supply is not None]
        if limits:
            out.append((hws, min(limits) // per_stage))
    return out


def solve_uneven(model: Model, incumbent_us: float, time_limit_s: float = 30.0) -> UnevenResult:
    """Best uneven pipeline plan strictly better than ``incumbent_us`` (the best uniform plan), if any."""
    t0 = time.perf_counter()
    pr = model.problem
    if 0 < model.workload.frozen_layers < model.workload.layers:
        # a stage's trainable layers depend on where the stage starts, i.e. on the other stages' sizes
        raise ProblemError(
            "uneven stages with partly frozen layers are not supported; allowed: frozen_layers 0 (or LoRA), "
            "or uneven_stages: false",
            file=pr.source,
            field="space.uneven_stages",
        )
    bases = _bases(model)
    if len(bases) == 0:
        return UnevenResult(None, None, "no-improvement", 0, 0, time.perf_counter() - t0, 0)
    lb = _lower_bounds_us(model, bases)
    order = np.lexsort((np.arange(len(bases)), lb))
    modes = sorted(set(np.unique(enumerate_plans(pr).recompute).tolist()))
    best_plan, best_us, exact, solved, booleans = None, float(incumbent_us), True, 0, 0
    pruned = 0
    for pos, j in enumerate(order):
        if lb[j] >= best_us:
            pruned = len(order) - pos
            break
        remaining = time_limit_s - (time.perf_counter() - t0)
        if remaining <= 0:
            exact = False
            break
        base = bases.take([int(j)])
        hw_choices = stage_hardware(model, base)
        cand = _candidates(model, base, modes, hw_choices)
        supply = _stage_supply(model, base, hw_choices)
        status, step_us, chosen, nb = _solve_base(
            cand, int(base.pp[0]), model.workload.layers, best_us, remaining, supply
        )
        solved += 1
        booleans = max(booleans, nb)
        if status in ("unknown", "feasible"):
            exact = False
        if step_us is not None and step_us < best_us:
            best_us = step_us
            order_stages = sorted(chosen, key=lambda i: int(cand["stage"][i]))
            opt = pr.hardware[int(base.hw[0])]
            best_plan = base.plan(0, system=opt.system.name).model_copy(
                update={
                    "recompute": RECOMPUTE_MODES[int(cand["recompute"][order_stages[0]])],
                    "stage_layers": [int(cand["layers"][i]) for i in order_stages],
                    "stage_recompute": [RECOMPUTE_MODES[int(cand["recompute"][i])] for i in order_stages],
                    "stage_systems": [pr.hardware[int(cand["hw"][i])].system.name for i in order_stages]
                    if pr.space.mixed_stages
                    else None,
                }
            )
    status = (
        ("optimal" if exact else "feasible")
        if best_plan is not None
        else ("no-improvement" if exact else "feasible")
    )
    return UnevenResult(
        best_plan, best_us if best_plan else None, status, solved, pruned, time.perf_counter() - t0, booleans
    )
