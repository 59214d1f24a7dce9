"""Fleet allocation on synthetic option tables: the CP-SAT optimum equals brute force over every assignment, for
each objective (throughput, cost, energy, deadlines), with deadlines, targets, required jobs and budgets; the
greedy baseline never beats it; ties go to the fewest GPUs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.fleet import allocate
from madmax_opt.fleet.options import JobOption, OptionTable
from madmax_opt.fleet.solve import FleetRun, instance, solve_fleet
from madmax_opt.fleet.spec import Fleet, FleetFile, Job, resolve_pool
from madmax_opt.search.cpsat import CpSatOptions

CATALOG = ["dgx-h100", "dgx-a100", "mi300x-platform", "gb200-nvl72"]
HORIZON_H = 100.0


@st.composite
def fleets(draw: Any, objective: str) -> tuple[Fleet, list[OptionTable]]:
    n_sys = draw(st.integers(2, 4))
    systems = {f"s{i}": {"system": CATALOG[i], "gpus": 1} for i in range(n_sys)}
    must = objective in ("cost", "energy")  # every job placed: room for most of them
    nodes = [draw(st.integers(2 if must else 1, 8 if must else 6)) for _ in range(n_sys)]
    for i, name in enumerate(systems):
        per_node = 4 if CATALOG[i] == "gb200-nvl72" else 8
        systems[name]["gpus"] = nodes[i] * per_node
    n_jobs = draw(st.integers(2, 6))
    jobs: dict[str, Any] = {}
    kinds = []
    for j in range(n_jobs):
        serving = draw(st.booleans())
        kinds.append(serving)
        job: dict[str, Any] = {"problem": "synthetic.yaml", "weight": draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))}
        if objective in ("throughput", "deadlines"):
            job["required"] = draw(st.booleans()) and j == 0
        if not serving:
            job["train_tokens"] = 3600.0 * draw(st.sampled_from([1e5, 1e6, 1e7]))
            if draw(st.integers(0, 3 if must else 1)) == 0:
                job["deadline_h"] = float(draw(st.sampled_from([10, 50, 200])))
        elif draw(st.booleans()):
            job["min_throughput"] = float(draw(st.sampled_from([2e4, 5e4])))
        jobs[f"j{j}"] = job
    prices = [20, 60, 200] if not must else [200, 600]
    budget: dict[str, float] = {}
    if draw(st.booleans()):
        budget["usd_per_hour"] = float(draw(st.sampled_from(prices)))
    if draw(st.booleans()):
        budget["usd"] = float(draw(st.sampled_from([2_000, 10_000, 50_000])))
    spec = FleetFile.model_validate({"systems": systems, "jobs": jobs, "objective": objective,
                                     "horizon_h": HORIZON_H, "budget": budget, "solver": {"what_if_gpus": [8, 16]}})
    pools = tuple(resolve_pool(n, s, "synthetic") for n, s in spec.systems.items())
    resolved = tuple(
        Job(name, s, {}, "synthetic", kinds[j], s.train_tokens, None, s.min_throughput, "m", "inference"
            if kinds[j] else "pretrain")
        for j, (name, s) in enumerate(spec.jobs.items())
    )
    tables = []
    for name in jobs:
        options = []
        for p in pools:
            sizes = st.lists(st.sampled_from([1, 2, 4]), min_size=int(must), max_size=2, unique=True)
            for n_nodes in draw(sizes):
                gpus = n_nodes * p.gpus_per_node
                tput = float(draw(st.integers(1, 100)) * 1000)
                options.append(JobOption(
                    job=name, system=p.name, gpu=p.gpu.name, gpus=gpus, nodes=n_nodes, plan={}, throughput=tput,
                    samples_per_s=tput / 1000, cost_per_hour_usd=p.system.price_per_gpu_hour * gpus,
                    power_w=p.system.power_w_per_gpu * gpus, usd_per_million_tokens=1.0,
                    memory_bytes_per_gpu=1.0, status="optimal"))
        tables.append(OptionTable(job=name, options=options, infeasible={}))
    return Fleet("synthetic", spec, pools, resolved), tables


def reference(fleet: Fleet, tables: list[OptionTable], free: frozenset[str] = frozenset()
              ) -> tuple[float, int] | None:
    """Brute force from the option tables alone: (best objective value, fewest GPUs at it), floats; the jobs named
    in ``free`` may take options that miss their deadline or minimum throughput."""
    spec = fleet.spec
    must = spec.objective in ("cost", "energy")
    per_job: list[list[Any]] = []
    for job, table in zip(fleet.jobs, tables, strict=True):
        ok = []
        for o in table.options:
            hours = job.train_tokens / o.throughput / 3600 if job.train_tokens else HORIZON_H
            if job.name not in free and job.spec.deadline_h is not None and hours > job.spec.deadline_h:
                continue
            if job.name not in free and job.min_throughput is not None and o.throughput < job.min_throughput:
                continue
            ok.append((o, hours))
        per_job.append(ok if must or job.spec.required else [None, *ok])
    nodes = {p.name: p.nodes for p in fleet.pools}
    best: tuple[float, int] | None = None
    for combo in itertools.product(*per_job):
        chosen = [c for c in combo if c is not None]
        if any(sum(o.nodes for o, _ in chosen if o.system == s) > n for s, n in nodes.items()):
            continue
        # budgets in whole cents per job, as the allocation counts them (a float sum could differ by a cent)
        if spec.budget.usd_per_hour and sum(round(o.cost_per_hour_usd * 100) for o, _ in chosen) > \
                spec.budget.usd_per_hour * 100:
            continue
        if spec.budget.usd and sum(round(o.cost_per_hour_usd * h * 100) for o, h in chosen) > spec.budget.usd * 100:
            continue
        weights = {j.name: j.spec.weight for j in fleet.jobs}
        value = {
            "throughput": sum(weights[o.job] * o.throughput for o, _ in chosen),
            "deadlines": sum(weights[o.job] for o, _ in chosen),
            "cost": sum(o.cost_per_hour_usd * h for o, h in chosen),
            "energy": sum(o.power_w * h / 1e3 for o, h in chosen),
        }[spec.objective]
        gpus = sum(o.gpus for o, _ in chosen)
        sign = -1 if must else 1
        if best is None or (sign * value, -gpus) > (sign * best[0], -best[1]):
            best = (value, gpus)
    return best


def check(fleet: Fleet, tables: list[OptionTable]) -> None:
    ref = reference(fleet, tables)
    run = FleetRun(fleet, tables, CpSatOptions(time_limit_s=10))
    inst = instance(fleet, run.scored)
    alloc = allocate.solve_allocation(inst.inp, run.params)
    if ref is None:
        assert alloc.objective is None
        return
    assert alloc.status == "optimal"
    result = solve_fleet(run, what_if=False, binding=False)
    assert result.value is not None
    # the integers CP-SAT sees are rounded once per option: cents, Wh, floor(tokens/s) (exact here)
    tol = {"cost": 0.01, "energy": 0.001}.get(fleet.spec.objective, 0.0) * len(fleet.jobs) + 1e-9
    assert math.isclose(result.value, ref[0], abs_tol=tol), (result.value, ref)
    if tol < 1e-6:  # exact objectives: the tie-break (fewest GPUs) must match too
        assert sum(j.gpus for j in result.jobs) == ref[1]
    assert allocate.brute_force(inst.inp) == (alloc.objective, allocate.gpus_of(inst.inp, alloc.choice))
    assert allocate.feasible(inst.inp, alloc.choice)
    if result.greedy.value is not None:
        assert result.gain_vs_greedy is not None and result.gain_vs_greedy >= -tol


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(fleets("throughput"))
def test_max_weighted_throughput_equals_brute_force(case: tuple[Fleet, list[OptionTable]]) -> None:
    check(*case)


@PROPERTY
@given(fleets("cost"))
def test_min_cost_equals_brute_force(case: tuple[Fleet, list[OptionTable]]) -> None:
    check(*case)


@PROPERTY
@given(fleets("energy"))
def test_min_energy_equals_brute_force(case: tuple[Fleet, list[OptionTable]]) -> None:
    check(*case)


@PROPERTY
@given(fleets("deadlines"))
def test_max_weight_on_time_equals_brute_force(case: tuple[Fleet, list[OptionTable]]) -> None:
    check(*case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets("throughput"))
def test_what_if_and_binding_supply_equal_brute_force_with_more_gpus(case: tuple[Fleet, list[OptionTable]]) -> None:
    """Each what-if value is the brute-force optimum of the fleet with that system's extra GPUs (whole nodes); a
    supply reported binding gains exactly what brute force gains with that system unlimited."""
    fleet, tables = case
    base = reference(fleet, tables)
    if base is None:
        return
    result = solve_fleet(FleetRun(fleet, tables, CpSatOptions(time_limit_s=10)))

    def grown(i: int, gpus: int) -> Fleet:
        pools = list(fleet.pools)
        pools[i] = dataclasses.replace(pools[i], gpus=gpus)
        return dataclasses.replace(fleet, pools=tuple(pools))

    assert len(result.what_if) == 2 * len(fleet.pools)
    for w in result.what_if:
        i = next(k for k, p in enumerate(fleet.pools) if p.name == w.system)
        ref = reference(grown(i, fleet.pools[i].gpus + w.extra_gpus), tables)
        assert ref is not None and w.value is not None
        assert math.isclose(w.value, ref[0], rel_tol=1e-12) and w.gain is not None and w.gain >= -1e-9
    for b in result.binding:
        if b.constraint.startswith("systems."):
            i = next(k for k, p in enumerate(fleet.pools) if b.constraint == f"systems.{p.name}.gpus")
            ref = reference(grown(i, 10**6), tables)
            assert ref is not None and math.isclose(b.gain, ref[0] - base[0], rel_tol=1e-9)


def binding_targets_equal_brute_force(fleet: Fleet, tables: list[OptionTable]) -> None:
    """Each job's targets dropped alone: the binding list names it exactly when brute force gains with them
    dropped, with that gain (the checks are group-tested first: a group proven no better settles its jobs)."""
    base = reference(fleet, tables)
    if base is None:
        return
    result = solve_fleet(FleetRun(fleet, tables, CpSatOptions(time_limit_s=10)), what_if=False)
    sign = -1 if fleet.spec.objective in ("cost", "energy") else 1
    tol = {"cost": 0.01, "energy": 0.001}.get(fleet.spec.objective, 0.0) * len(fleet.jobs) + 1e-9
    gains = {b.constraint.split(".")[1]: b.gain for b in result.binding if b.constraint.startswith("jobs.")}
    for job in fleet.jobs:
        ref = reference(fleet, tables, frozenset({job.name}))
        assert ref is not None
        gain = sign * (ref[0] - base[0])
        if gain > tol:
            assert job.name in gains and math.isclose(gains[job.name], gain, abs_tol=tol), (job.name, gains, gain)
        elif gain < 1e-9:
            assert job.name not in gains


TARGETS_PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@TARGETS_PROPERTY
@given(fleets("throughput"))
def test_binding_targets_equal_brute_force_throughput(case: tuple[Fleet, list[OptionTable]]) -> None:
    binding_targets_equal_brute_force(*case)


@TARGETS_PROPERTY
@given(fleets("cost"))
def test_binding_targets_equal_brute_force_cost(case: tuple[Fleet, list[OptionTable]]) -> None:
    binding_targets_equal_brute_force(*case)


def _opt(job: int, system: int, nodes: int, score: int, speed: float) -> allocate.Option:
    return allocate.Option(job=job, system=system, nodes=nodes, gpus=8 * nodes, score=score, speed=speed)


def test_greedy_takes_fastest_and_optimum_shares_the_fleet() -> None:
    """Two jobs, one 4-node system: job 0's fastest option takes all 4 nodes (score 10); greedy leaves job 1 out,
    the optimum gives each 2 nodes (6 + 6 = 12). Hand-computed."""
    options = (_opt(0, 0, 4, 10, 10.0), _opt(0, 0, 2, 6, 6.0), _opt(1, 0, 2, 6, 6.0))
    inp = allocate.AllocationInput(2, (4,), options, "max", (False, False), (0, 1))
    assert allocate.greedy(inp).choice == (0, None) and allocate.greedy(inp).objective == 10
    best = allocate.solve_allocation(inp)
    assert best.choice == (1, 2) and best.objective == 12 and best.status == "optimal"


def test_ties_go_to_fewest_gpus() -> None:
    options = (_opt(0, 0, 4, 5, 5.0), _opt(0, 0, 1, 5, 5.0))
    inp = allocate.AllocationInput(1, (4,), options, "max", (False,), (0,))
    assert allocate.solve_allocation(inp).choice == (1,)


def test_required_job_without_room_is_infeasible() -> None:
    options = (_opt(0, 0, 4, 5, 5.0), _opt(1, 0, 4, 5, 5.0))
    inp = allocate.AllocationInput(2, (4,), options, "min", (True, True), (0, 1))
    assert allocate.solve_allocation(inp).status == "infeasible"
    assert allocate.brute_force(inp) is None


def test_fleet_objectives_come_from_the_one_registry() -> None:
    """The fleet file accepts exactly the registered fleet objectives, its schema describes each from the registry,
    and the minimised ones (every job placed, hours needed) are cost and energy, the plan objectives of that name."""
    from madmax_opt.model.objectives import FLEET_OBJECTIVES, OBJECTIVES

    field = FleetFile.model_json_schema()["properties"]["objective"]
    assert field["enum"] == list(FLEET_OBJECTIVES)
    assert all(f"{o.name}: {o.summary}" in field["description"] for o in FLEET_OBJECTIVES.values())
    assert {n for n, o in FLEET_OBJECTIVES.items() if o.sense == "min"} == {"cost", "energy"}
    assert {n for n, o in FLEET_OBJECTIVES.items() if o.needs_hours and o.places_every_job} == {"cost", "energy"}
    assert all(o.plan_objective is None or o.plan_objective in OBJECTIVES for o in FLEET_OBJECTIVES.values())
