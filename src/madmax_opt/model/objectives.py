"""The objectives a search minimises: one definition each, shared by every family and every search path.

Every objective is computed from the same per-candidate quantities (:class:`Rates`): wall seconds per unit of work
(a token for transformers, a sample for recommenders) of the whole deployment, its GPUs, its price per hour, its
wall power, and the total work of a training run. At fixed hardware every objective is proportional to the seconds
per unit of work; the uneven-stage search relies on that (a stage split changes the time, not the rate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, get_args

import numpy as np

from madmax_opt.core.numeric import Arr, IntArr
from madmax_opt.core.units import NS, SECONDS_PER_HOUR, US
from madmax_opt.model.hardware_spec import System

ObjectiveName = Literal["throughput", "cost", "time_to_train", "energy"]


@dataclass(frozen=True)
class Rates:
    """Per candidate: what the objectives are computed from (arrays, SI units), and the one way they are built.

    A deployment is described, not priced: the systems it may use and, per part of it, which system each candidate
    runs that part on and on how many GPUs (one part for a uniform plan; one per pipeline stage or per hardware choice
    of a mixed pipeline). Every catalog quantity of the deployment (price, wall power, or a new per-system input such
    as grid carbon intensity) is a sum over its GPUs of a ``System`` field (``per_deployment``), so a new input is a
    ``System`` field (model/spec.py, data/systems.yaml) and the objective that reads it, here: no search changes.
    """

    seconds_per_unit: Arr  # wall seconds per token (or sample) of the whole deployment = 1 / throughput
    systems: tuple[System, ...]  # what a part's index points at (a problem's hardware options' systems)
    parts: tuple[tuple[IntArr, Arr], ...]  # per part: (index into systems, GPUs there) per candidate
    total_units: float | None = None  # task.train_tokens / task.train_samples (time_to_train)
    # serving searches the replica count itself, so its throughput is per GPU (else the largest deployment wins)
    throughput_per_gpu: bool = False

    def per_deployment(self, per_gpu: Callable[[System], float]) -> Arr:
        """Per candidate, the sum over its GPUs of ``per_gpu(system)`` (e.g. W per GPU -> W of the deployment)."""
        col = np.array([per_gpu(s) for s in self.systems], dtype=np.float64)
        total: Arr | None = None
        for idx, gpus in self.parts:
            term = col[idx] * gpus
            total = term if total is None else total + term
        assert total is not None, "a deployment has at least one part"
        return total

    @cached_property
    def gpus(self) -> Arr:
        """The whole deployment's GPUs (one per GPU of every part)."""
        return self.per_deployment(lambda _: 1.0)

    @cached_property
    def usd_per_hour(self) -> Arr:
        """The whole deployment's price (System.price_per_gpu_hour x GPUs)."""
        return self.per_deployment(lambda s: s.price_per_gpu_hour)

    @cached_property
    def watts(self) -> Arr:
        """Wall power of the whole deployment (GPUs + host share: System.power_w_per_gpu x GPUs)."""
        return self.per_deployment(lambda s: s.power_w_per_gpu)


def uniform_rates(seconds_per_unit: Arr, systems: Sequence[System], hw: IntArr, gpus: Arr,
                  total_units: float | None = None, throughput_per_gpu: bool = False) -> Rates:
    """Rates of candidates that each run on one system: ``systems[hw]`` x ``gpus`` GPUs."""
    return Rates(seconds_per_unit, tuple(systems), ((np.asarray(hw, dtype=np.int64), np.asarray(gpus)),),
                 total_units, throughput_per_gpu)


def stage_rates(seconds_per_unit: Arr, systems: Sequence[System], stage_hw: Sequence[int], gpus_per_stage: float,
                total_units: float | None = None) -> Rates:
    """Rates of one pipeline whose stages may run on different systems: one part per stage, stage s on
    ``systems[stage_hw[s]]`` with ``gpus_per_stage`` GPUs (dp x tp x cp)."""
    parts = tuple((np.array([h], dtype=np.int64), np.array([float(gpus_per_stage)])) for h in stage_hw)
    return Rates(np.asarray(seconds_per_unit, dtype=np.float64), tuple(systems), parts, total_units)


@dataclass(frozen=True)
class IntegerUnit:
    """How a search rounds an objective to integers: ``scale`` integers per unit of ``value`` (per token or sample;
    x tokens per step where ``per_step``), how to name the quantity and its unit in messages, and the problem field
    that drives it when it leaves the solver's integer range."""

    scale: float
    quantity: str  # e.g. "the step time of the best plan"
    unit: str  # of the quantity, e.g. "s"
    per_unit: float  # integers per ``unit`` (to print the quantity)
    integer_unit: str  # what one integer is (solver summaries), e.g. "us per step"
    field: str  # the problem field that drives it, e.g. "task.global_batch"
    per_step: bool = True  # training: the value per token x tokens per optimizer step


@dataclass(frozen=True)
class Objective:
    """One objective: what it minimises (``value``), in which unit, what it needs from the task, and its integer
    unit per family (training: per optimizer step; serving: per output token; None: not offered there)."""

    name: ObjectiveName
    minimises: str  # in words, for docs and reports
    unit: str
    value: Callable[[Rates], Arr]
    training: IntegerUnit
    serving: IntegerUnit | None
    needs_total_units: bool = False
    worst_case_text: Callable[[float], str] | None = None  # a training value as people read it (None: the unit's)

    def worst_case(self, value: float) -> str:
        """A training value of this objective as ``solve --robust`` reports the best worst case: the objective's
        own text, else the value in its unit per token."""
        return self.worst_case_text(value) if self.worst_case_text else f"at worst {value:.3g} {self.unit} per token"


def _throughput(r: Rates) -> Arr:
    # max units/s  <=>  min s/unit (serving: GPU-s/unit = gpus / (units/s))
    return r.seconds_per_unit * r.gpus if r.throughput_per_gpu else r.seconds_per_unit


def _cost(r: Rates) -> Arr:
    return r.usd_per_hour / SECONDS_PER_HOUR * r.seconds_per_unit  # $/unit = ($/h / 3600 s/h) x s/unit


def usd_per_million_units(usd_per_hour: Any, units_per_s: Any) -> Any:
    """US$ per million tokens (or samples), the cost objective in reports: $/h / 3600 s/h / (units/s) x 1e6."""
    return usd_per_hour / SECONDS_PER_HOUR / units_per_s * 1e6


def run_cost_usd(hours: Any, usd_per_hour: Any) -> Any:
    """US$ of a run of ``hours`` on a deployment costing ``usd_per_hour`` (constraints.budget_usd, reports)."""
    return hours * usd_per_hour  # $ = hours x $/h


def energy_mwh(hours: Any, watts: Any) -> Any:
    """Wall energy in MWh of ``hours`` at ``watts`` drawn in all (every GPU's share): W x h = Wh, 1e6 Wh a MWh."""
    return hours * watts / 1e6


def _tokens_per_s_text(s_per_token: float) -> str:
    return f"at worst {1.0 / s_per_token:,.0f} tokens/s"  # s per token of the whole deployment -> tokens/s


def _usd_per_million_text(usd_per_token: float) -> str:
    return f"at worst ${usd_per_token * 1e6:,.3g} per million tokens"


def _hours_text(run_s: float) -> str:
    return f"at worst {run_s / SECONDS_PER_HOUR:,.1f} h to train"


def _time_to_train(r: Rates) -> Arr:
    assert r.total_units is not None, "time_to_train needs the task's total work (checked when loading)"
    return r.total_units * r.seconds_per_unit  # s = units x s/unit


def _energy(r: Rates) -> Arr:
    return r.watts * r.seconds_per_unit  # J/unit = W x s/unit (wall power: GPU TDP share + host, systems.yaml)


NUSD = 1e9  # integer money unit of training: nano-dollars per step (a 10 ms step on 8 GPUs costs ~$5e-5)
UUSD = 1e6  # integer money unit of serving: micro-dollars (per million tokens)
BATCH, RUN = "task.global_batch", "task.train_tokens"  # what drives a training step's and a run's integers

OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("throughput", "seconds per token or sample (max throughput; serving: per GPU)", "s", _throughput,
                  IntegerUnit(US, "the step time of the best plan", "s", US, "us per step", BATCH),
                  IntegerUnit(NS, "the GPU time per output token of the best plan", "s", NS, "GPU-ns per token",
                              "objective", per_step=False), worst_case_text=_tokens_per_s_text),
        Objective("cost", "US$ per token or sample", "$", _cost,
                  IntegerUnit(NUSD, "the cost per step of the best plan", "$", NUSD, "n$ per step", BATCH),
                  IntegerUnit(1e6 * UUSD, "the cost per million output tokens of the best plan", "$", UUSD,
                              "uUSD per million tokens", "objective", per_step=False),
                  worst_case_text=_usd_per_million_text),
        Objective("time_to_train", "wall time of the whole training run", "s", _time_to_train,
                  IntegerUnit(1e3, "the training time of the best plan", "s", 1e3, "ms of training", RUN,
                              per_step=False), None, True, _hours_text),
        Objective("energy", "joules of wall energy per token or sample", "J", _energy,
                  IntegerUnit(1e3, "the energy per step of the best plan", "J", 1e3, "mJ per step", BATCH),
                  IntegerUnit(1e6, "the energy per output token of the best plan", "J", 1e6, "uJ per output token",
                              "objective", per_step=False)),
    )
}
assert tuple(OBJECTIVES) == get_args(ObjectiveName), "ObjectiveName and OBJECTIVES must list the same names"


FleetObjectiveName = Literal["throughput", "cost", "energy", "deadlines"]


@dataclass(frozen=True)
class FleetObjective:
    """A fleet's objective (``madmax-opt fleet``): a sum over the placed jobs of one quantity per job, maximised or
    minimised, in a human unit (``unit``, reports) and in the integers the allocation's CP-SAT model sees
    (``score_unit``). ``plan_objective``: the plan objective each job's quantity is the total of, where there is one
    (the fleet's option searches all pick the fastest plan; cost and energy are then summed over each job's hours)."""

    name: FleetObjectiveName
    sense: Literal["max", "min"]
    summary: str  # in words, for the fleet file's schema
    unit: str
    score_unit: str
    plan_objective: ObjectiveName | None = None

    @property
    def places_every_job(self) -> bool:
        """A minimised total only means something with every job in it (placing none would cost nothing)."""
        return self.sense == "min"

    @property
    def needs_hours(self) -> bool:
        """A total over each job's duration needs how long every job runs."""
        return self.plan_objective in ("cost", "energy")


FLEET_OBJECTIVES: dict[str, FleetObjective] = {
    o.name: o
    for o in (
        FleetObjective("throughput", "max", "max sum of weight x throughput", "weighted tokens/s",
                       "sum of round(1000 x weight) x floor(tokens/s)", "throughput"),
        FleetObjective("cost", "min", "min total US$ over every job (all placed)", "US$",
                       "US cents over every job's duration", "cost"),
        FleetObjective("energy", "min", "min total kWh over every job (all placed)", "kWh",
                       "Wh over every job's duration", "energy"),
        FleetObjective("deadlines", "max", "max weight of jobs placed meeting their deadlines and targets",
                       "weight of jobs on time", "sum of round(1000 x weight) of placed jobs"),
    )
}
assert tuple(FLEET_OBJECTIVES) == get_args(FleetObjectiveName), "FleetObjectiveName and FLEET_OBJECTIVES must agree"


def objective(name: str) -> Objective:
    """The registered objective ``name`` (an unknown name is rejected when a problem file is loaded)."""
    if name not in OBJECTIVES:
        raise KeyError(f"unknown objective {name!r}; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def reads_system_field(name: str, systems: Sequence[System], field: str) -> bool:
    """Whether objective ``name`` depends on the ``System`` field ``field`` of ``systems``: its value on one GPU of
    each system, probed at the field's value and at twice it plus one (a registered objective says no more than its
    formula, so this asks the formula)."""
    def value(ss: tuple[System, ...]) -> Arr:
        n = len(ss)
        rates = Rates(np.ones(n), ss, ((np.arange(n), np.ones(n)),), total_units=1.0)
        return objective_values(name, rates)

    now = tuple(systems)
    moved = tuple(s.model_copy(update={field: getattr(s, field) * 2.0 + 1.0}) for s in now)
    return not np.array_equal(value(now), value(moved))


def objective_values(name: str, rates: Rates) -> Arr:
    """The value ``name`` minimises, per candidate (float, in the objective's unit)."""
    return np.asarray(objective(name).value(rates), dtype=np.float64)


__all__ = [
    "FLEET_OBJECTIVES", "OBJECTIVES", "FleetObjective", "FleetObjectiveName", "IntegerUnit", "Objective",
    "ObjectiveName", "Rates", "energy_mwh", "objective", "objective_values", "reads_system_field", "run_cost_usd",
    "uniform_rates", "usd_per_million_units",
]
