"""CP-SAT assembly shared by the training and serving searches: pick the best candidate(s) under linear limits.

"Enumerate, then assemble" (docs/reference/solver-notes.md): candidates arrive with integer objective values
(rounded once) and integer columns for the side constraints. Each candidate gets one Boolean, exactly one is
chosen, every limit is a linear constraint over the Booleans, and ties break by enumeration order (objective x n +
position, exact in integers), so the answer equals a brute-force sort. Within one group (hardware option) every
limit is monotone in the objective, so only a group's ``top_k`` best admissible candidates can be in the top-k:
the rest are dropped before the model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.errors import InternalError
from madmax_opt.core.numeric import IntArr
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.search.cpsat import (
    INT_LIMIT,
    STATUS,
    CpSatOptions,
    check_range,
    gap,
    has_solution,
    time_limit_error,
)
from madmax_opt.search.cpsat import run as cpsat_run
from madmax_opt.search.ortools_import import load_cp_model


@dataclass(frozen=True)
class Limit:
    """sum_i coeffs[i] * x_i  <= bound  (or >= bound with ``at_least``)."""

    coeffs: NDArray[np.int64]
    bound: int
    at_least: bool = False

    def holds(self) -> NDArray[np.bool_]:
        return np.asarray(self.coeffs >= self.bound if self.at_least else self.coeffs <= self.bound)


@dataclass(frozen=True)
class Pick:
    status: str  # optimal | feasible
    top: list[int]  # candidate indices, best first
    objective: int
    best_bound: float
    booleans: int


def solver_summary(
    objective: float | None, best_bound: float | None, wall_s: float, candidates: int, booleans: int
) -> dict[str, Any]:
    """The ``solver`` object of the solve JSON: objective, proven bound, relative gap, size, time."""
    obj = objective or 0
    bound = best_bound if best_bound is not None else float("nan")
    g = gap(obj, bound)
    # CP-SAT reports its bound as a float (best_objective_bound, and the uneven search divides sums of integers by
    # p v): a bound above the objective by float rounding only (relative 1e-9) is that noise, and the gap is 0;
    # anything larger would be a wrong bound
    if -1e-9 <= g < 0.0:
        g = 0.0
    if g < 0.0:
        raise InternalError(f"solver bound {bound} above its own solution {obj} (gap {g:.3g})")
    return {
        "wall_s": wall_s,
        "objective": obj,
        "best_bound": bound,
        "gap": g,
        "candidates": candidates,
        "booleans": booleans,
    }


def supplies(hardware: Sequence[HardwareOption]) -> dict[str, int]:
    """GPU supply per GPU type (the tightest one given)."""
    out: dict[str, int] = {}
    for o in hardware:
        if o.supply is not None:
            out[o.gpu.name] = min(out.get(o.gpu.name, o.supply), o.supply)
    return out


def cluster_limits(
    hardware: Sequence[HardwareOption],
    hw: IntArr,
    gpus: IntArr,
    cost_cents_per_hour: IntArr,
    max_gpus: int | None,
    max_cost_per_hour: float | None,
) -> list[Limit]:
    """GPU count, $/hour budget and GPU supply per type, for candidates on options ``hw``."""
    limits = []
    if max_gpus is not None:
        limits.append(Limit(gpus, max_gpus))
    if max_cost_per_hour is not None:
        limits.append(Limit(cost_cents_per_hour, round(max_cost_per_hour * 100)))
    types = np.array([o.gpu.name for o in hardware])[hw] if len(hw) else np.array([], dtype=str)
    for name, supply in supplies(hardware).items():
        limits.append(Limit(np.where(types == name, gpus, 0), supply))
    return limits


def admissible_mask(valid: NDArray[np.bool_], limits: Sequence[Limit]) -> NDArray[np.bool_]:
    ok = valid.copy()
    for lim in limits:
        ok &= lim.holds()
    return ok


def brute_force(objective: IntArr, ok: NDArray[np.bool_]) -> IntArr:
    """Admissible indices sorted by (objective, enumeration order): the reference answer."""
    idx = np.flatnonzero(ok)
    return idx[np.lexsort((idx, objective[idx]))]


@dataclass(frozen=True)
class IntObjective:
    """The integer column CP-SAT minimises, and how to name it when it leaves the solver's range."""

    values: IntArr
    quantity: str  # e.g. "the step time of the best plans"
    field: str | None  # the problem field that drives it, e.g. "task.global_batch"
    unit: str = ""
    per_unit: float = 1.0  # integer units per ``unit`` (1e6 for us -> s)


def pick_best(
    objective: IntObjective,
    ok: NDArray[np.bool_],
    group: IntArr,
    limits: Sequence[Limit],
    *,
    cpsat: CpSatOptions,
    top_k: int = 1,
    label: Callable[[int], str] | None = None,
    file: str | None = None,
) -> Pick | None:
    """The ``top_k`` best admissible candidates by CP-SAT; None when none is admissible.

    Raises ProblemError when the kept objective values leave CP-SAT's integer range (naming the quantity) and
    TimeLimitError when the time limit runs out before any plan is found."""
    load_cp_model()  # without pandas (search/ortools_import.py)
    from ortools.sat.python import cp_model

    obj = objective.values
    keep_list: list[int] = []
    for g in np.unique(group[ok]):
        idx = np.flatnonzero(ok & (group == g))
        keep_list.extend(idx[np.lexsort((idx, obj[idx]))][:top_k].tolist())
    if not keep_list:
        return None
    keep = np.array(sorted(keep_list), dtype=np.int64)
    n = len(keep)
    check_range(float(obj[keep].min()), INT_LIMIT // (n + 1), objective.quantity, field=objective.field, file=file,
                unit=objective.unit, scale=objective.per_unit)  # the best plan itself is out of range: refuse
    keep = keep[obj[keep] < INT_LIMIT // (n + 1)]  # (worse plans out of range cannot be in the top-k)
    n = len(keep)
    m = cp_model.CpModel()
    x = [m.new_bool_var(label(int(i)) if label else f"candidate_{i}") for i in keep]
    m.add_exactly_one(x)
    for lim in limits:
        expr = sum(int(q) * v for q, v in zip(np.minimum(lim.coeffs[keep], INT_LIMIT), x, strict=True))
        m.add(expr >= lim.bound if lim.at_least else expr <= lim.bound)
    coeffs = obj[keep] * n + np.arange(n)  # ties break by enumeration order, exactly
    m.minimize(sum(int(q) * v for q, v in zip(coeffs, x, strict=True)))
    m.add_hint(x[int(np.argmin(coeffs))], 1)  # the best candidate before the limits: a greedy start
    top: list[int] = []
    status, best, bound = "infeasible", 0, 0.0
    for rank in range(top_k):
        st, solver = cpsat_run(m, cpsat, "plan selection")
        if not has_solution(st):
            if rank == 0 and st == cp_model.UNKNOWN:
                raise time_limit_error(cpsat, "plan selection")
            break
        chosen = next(j for j, v in enumerate(x) if solver.value(v))
        top.append(int(keep[chosen]))
        if rank == 0:
            status = STATUS[int(st)]
            best = round(solver.objective_value) // n  # a float in the API: never truncate
            bound = float(np.floor(solver.best_objective_bound / n))  # back to objective units
        m.add(x[chosen] == 0)
        m.clear_hints()
    if not top:
        return None
    return Pick(status, top, best, bound, len(x))
