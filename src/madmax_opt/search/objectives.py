"""Integer columns of the registered objectives (model/objectives.py) for the searches.

Each search rounds the registry's float value once to the integer unit the registry gives per family, fine
enough to separate plans: training per optimizer step (us of step time, nano-$, mJ; time_to_train in ms of the
run), serving per output token (GPU-ns, micro-$ per million tokens, uJ). The same integers are used by the search
(a sort or CP-SAT) and by the brute-force reference, so both rank candidates identically.
"""

from __future__ import annotations

from dataclasses import dataclass

from madmax_opt.core.numeric import Arr
from madmax_opt.core.units import NS, US
from madmax_opt.model.objectives import NUSD, UUSD, IntegerUnit, Rates, objective, objective_values
from madmax_opt.search.assemble import IntObjective
from madmax_opt.search.cpsat import to_int


@dataclass(frozen=True)
class Unit:
    """Integer units per unit of the objective's value (``per_value``) and how to name it in messages."""

    per_value: float
    quantity: str
    unit: str
    per_unit: float  # integer units per ``unit`` (to print the quantity)
    integer_unit: str  # what one integer of the objective column is (solver summaries)
    field: str | None = None  # the problem field that drives it


def _unit(u: IntegerUnit, per_step: float) -> Unit:
    return Unit(u.scale * (per_step if u.per_step else 1.0), u.quantity, u.unit, u.per_unit, u.integer_unit, u.field)


def training_units(name: str, tokens_per_step: float) -> Unit:
    """Training integers are per optimizer step (every candidate processes the same tokens per step)."""
    return _unit(objective(name).training, tokens_per_step)


def serving_units(name: str) -> Unit:
    """Serving integers are per output token (the deployment's replicas and batch are searched)."""
    u = objective(name).serving
    if u is None:  # rejected when the problem is loaded (io/problem.py: "needs a training run")
        raise KeyError(f"objective {name!r} is not offered for serving")
    return _unit(u, 1.0)


def integer_objective(name: str, rates: Rates, unit: Unit) -> IntObjective:
    """The registry's value of ``name``, rounded once to ``unit`` (saturating, never wrapping around)."""
    return IntObjective(to_int(objective_values(name, rates) * unit.per_value), unit.quantity, unit.field, unit.unit,
                        unit.per_unit)


def rate_per_second(name: str, rates_at_one_second: Rates, unit: Unit) -> Arr:
    """Integer objective units per second of step time at fixed hardware, from the rates of a 1 s step (every
    objective is proportional to the time at fixed hardware)."""
    return objective_values(name, rates_at_one_second) * unit.per_value


__all__ = ["NS", "NUSD", "US", "UUSD", "Unit", "integer_objective", "rate_per_second", "serving_units",
           "training_units"]
