"""Integer columns of the registered objectives (model/objectives.py) for the CP-SAT searches.

Each search rounds the registry's float value once to an integer unit fine enough to separate plans:
training per optimizer step (us of step time, nano-$, mJ; time_to_train in ms of the run), serving per output
token (GPU-ns, micro-$ per million tokens, uJ). The same integers are used by CP-SAT and by the brute-force
reference, so both rank candidates identically.
"""

from __future__ import annotations

from dataclasses import dataclass

from madmax_opt.core.numeric import Arr
from madmax_opt.core.units import NS, US
from madmax_opt.model.objectives import Rates, objective_values
from madmax_opt.search.assemble import IntObjective
from madmax_opt.search.cpsat import to_int

UUSD = 1e6  # integer money unit of serving: micro-dollars (per million tokens)
NUSD = 1e9  # integer money unit of training: nano-dollars per step (a 10 ms step on 8 GPUs costs ~$5e-5)


@dataclass(frozen=True)
class Unit:
    """Integer units per unit of the objective's value (``per_value``) and how to name it in messages."""

    per_value: float
    quantity: str
    unit: str
    per_unit: float  # integer units per ``unit`` (to print the quantity)
    integer_unit: str  # what one integer of the objective column is (solver summaries)


def training_units(name: str, tokens_per_step: float) -> Unit:
    """Training integers are per optimizer step (every candidate processes the same tokens per step)."""
    return {
        "throughput": Unit(tokens_per_step * US, "the step time of the best plan", "s", US, "us per step"),
        "cost": Unit(tokens_per_step * NUSD, "the cost per step of the best plan", "$", NUSD, "n$ per step"),
        "energy": Unit(tokens_per_step * 1e3, "the energy per step of the best plan", "J", 1e3, "mJ per step"),
        "time_to_train": Unit(1e3, "the training time of the best plan", "s", 1e3, "ms of training"),
    }[name]


def serving_units(name: str) -> Unit:
    """Serving integers are per output token (the deployment's replicas and batch are searched)."""
    return {
        "throughput": Unit(NS, "the GPU time per output token of the best plan", "s", NS, "GPU-ns per token"),
        "cost": Unit(1e6 * UUSD, "the cost per million output tokens of the best plan", "$", UUSD,
                     "uUSD per million tokens"),
        "energy": Unit(1e6, "the energy per output token of the best plan", "J", 1e6, "uJ per output token"),
    }[name]


def integer_objective(name: str, rates: Rates, unit: Unit, field: str | None) -> IntObjective:
    """The registry's value of ``name``, rounded once to ``unit`` (saturating, never wrapping around)."""
    return IntObjective(to_int(objective_values(name, rates) * unit.per_value), unit.quantity, field, unit.unit,
                        unit.per_unit)


def rate_per_second(name: str, rates_at_one_second: Rates, unit: Unit) -> Arr:
    """Integer objective units per second of step time at fixed hardware, from the rates of a 1 s step (every
    objective is proportional to the time at fixed hardware)."""
    return objective_values(name, rates_at_one_second) * unit.per_value


__all__ = ["NS", "NUSD", "US", "UUSD", "Unit", "integer_objective", "rate_per_second", "serving_units",
           "training_units"]
