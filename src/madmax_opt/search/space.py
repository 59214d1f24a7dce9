"""The plan space of a problem: default knob values, user restrictions, and vectorised enumeration."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.errors import ProblemError
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.plan import KNOBS, PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import RECOMPUTE_MODES

DEFAULT_CP = (1, 2, 4, 8)
DEFAULT_ZERO = (0, 1, 2, 3)
# vpp and mbs have no fixed default list: by default every value the frameworks accept is searched, per shape
# (``default_vpp``, ``default_mbs``); a problem's ``space.vpp`` / ``space.mbs`` replaces that set.
MAX_TP = 64
# Plans enumerated at most (~90 B each as columns, ~250 B more when evaluated): a space beyond this is refused with a
# message naming the knobs to restrict, never cut by a default
MAX_PLANS = 20_000_000
EMPTY_KNOB = "empty list, nothing to search; allowed: one or more values (omit the key to search all)"


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending."""
    return list(_divisors(n))


@functools.cache
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def default_vpp(layers: int, pp: int) -> list[int]:
    """Interleaving degrees Megatron-Core accepts for uniform stages: pp * vpp divides the layers (vpp = 1 without
    a pipeline)."""
    return divisors(layers // pp) if pp > 1 and layers % pp == 0 else [1]


def uneven_vpp(layers: int, pp: int) -> list[int]:
    """Interleaving degrees for uneven stages (Megatron-Core first / last stage layer counts or a pipeline layout):
    every virtual chunk holds a layer, except that the embedding and the loss may fill one chunk each, so
    pp * vpp <= layers + 2 (``spec.min_stage_layers``)."""
    return list(range(1, (layers + 2) // pp + 1)) if pp > 1 else [1]


def default_mbs(global_batch: int, dp: int) -> list[int]:
    """Micro-batch sizes that split a replica's batch (global_batch / dp) into whole micro-batches; [1] (flagged
    invalid by the evaluator, with its reason) when dp does not divide the batch."""
    return divisors(global_batch // dp) if global_batch % dp == 0 else [1]


def _restrict(name: str, default: Sequence[int], given: int | list[int] | None, source: str) -> list[int]:
    if given is None:
        return list(default)
    values = [given] if isinstance(given, int) else list(given)
    if not values:
        raise ProblemError(EMPTY_KNOB, file=source, field=f"space.{name}")
    lowest = 0 if name == "zero" else 1
    if any(v < lowest for v in values):
        raise ProblemError(f"got {values}; allowed: integers >= {lowest}", file=source, field=f"space.{name}")
    if name == "zero" and any(v > 3 for v in values):
        raise ProblemError(f"got {values}; allowed: ZeRO stages 0, 1, 2, 3", file=source, field="space.zero")
    return sorted(set(values))


def knob_values(problem: Problem, option: HardwareOption, uneven: bool = False) -> dict[str, list[int]]:
    """Values each knob may take on ``option`` (before cross-knob validity); ``uneven``: the bases of the uneven
    pipeline search, where pp need not divide the layers."""
    sp = problem.space
    m = problem.model
    domain = option.system.tiers[0].size or option.gpus
    default_tp = [t for t in _powers_of_two(min(domain, MAX_TP, m.heads)) if m.heads % t == 0]
    layers = m.layers
    default_pp = [d for d in range(1, min(layers, option.gpus) + 1) if uneven or layers % d == 0]
    # expert parallelism: powers of two dividing the expert count (MoE only)
    default_ep = [e for e in _powers_of_two(min(m.moe.num_experts, MAX_TP)) if m.moe.num_experts % e == 0] if m.moe else [1]
    rc = sp.recompute
    rc_values = list(RECOMPUTE_MODES) if rc is None else ([rc] if isinstance(rc, str) else list(rc))
    sp_values = [False, True] if sp.sp is None else ([sp.sp] if isinstance(sp.sp, bool) else list(sp.sp))
    if not rc_values:
        raise ProblemError(EMPTY_KNOB, file=problem.source, field="space.recompute")
    if not sp_values:
        raise ProblemError(EMPTY_KNOB, file=problem.source, field="space.sp")
    return {
        "tp": _restrict("tp", default_tp, sp.tp, problem.source),
        "pp": _restrict("pp", default_pp, sp.pp, problem.source),
        "cp": _restrict("cp", DEFAULT_CP, sp.cp, problem.source),
        "vpp": _restrict("vpp", [], sp.vpp, problem.source) if sp.vpp is not None else [],  # [] = default_vpp
        "mbs": _restrict("mbs", [], sp.mbs, problem.source) if sp.mbs is not None else [],  # [] = default_mbs
        "zero": _restrict("zero", DEFAULT_ZERO, sp.zero, problem.source),
        "dp": _restrict("dp", [], sp.dp, problem.source) if sp.dp is not None else [],
        "recompute": sorted({RECOMPUTE_MODES.index(r) for r in rc_values}),
        "sp": sorted({int(v) for v in sp_values}),
        "ep": _restrict("ep", default_ep, sp.ep, problem.source),
    }


def _shape_count(
    shapes: list[tuple[int, int, int, int]], kv: dict[str, list[int]], fixed: int, layers: int, global_batch: int,
    uneven: bool,
) -> tuple[int, int]:
    """Rows ``_shape_product`` would build (before duplicates are dropped), and those of them with vpp = 1 only (the
    rows of a default vpp space's vpp = 1 plans)."""
    vpp_of = uneven_vpp if uneven else default_vpp
    rows: dict[tuple[int, int], tuple[int, int]] = {}  # (dp, pp) -> (rows, vpp = 1 rows) per shape
    total = total_one = 0
    for dp, _, pp, _ in shapes:
        n = rows.get((dp, pp))
        if n is None:
            mbs = len(kv["mbs"] or default_mbs(global_batch, dp))
            n = rows[(dp, pp)] = (len(kv["vpp"] or vpp_of(layers, pp)) * mbs, mbs)
        total += n[0] * fixed
        total_one += n[1] * fixed
    return total, total_one


def _shape_product(
    shapes: list[tuple[int, int, int, int]],
    kv: dict[str, list[int]],
    fixed: Sequence[tuple[int, ...]],
    layers: int,
    global_batch: int,
    uneven: bool = False,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Rows (dp, tp, pp, cp) x (vpp, mbs, zero, recompute, sp, ep): vpp and mbs per shape (the defaults depend on
    pp and dp), the other knobs the same for every shape."""
    rest_rows, counts = [], []
    fixed_arr = np.array(fixed, dtype=np.int64).reshape(len(fixed), 4)
    cache: dict[tuple[tuple[int, ...], tuple[int, ...]], NDArray[np.int64]] = {}
    by_shape: dict[tuple[int, int], NDArray[np.int64]] = {}  # (dp, pp) -> rows of (vpp, mbs) x fixed
    for dp, _, pp, _ in shapes:
        rest = by_shape.get((dp, pp))
        if rest is None:
            vpps = tuple(kv["vpp"] or (uneven_vpp(layers, pp) if uneven else default_vpp(layers, pp)))
            mbss = tuple(kv["mbs"] or default_mbs(global_batch, dp))
            key = (vpps, mbss)
            if key not in cache:
                vm = np.array(list(itertools.product(vpps, mbss)), dtype=np.int64).reshape(-1, 2)
                cache[key] = np.hstack([np.repeat(vm, len(fixed_arr), axis=0), np.tile(fixed_arr, (len(vm), 1))])
            rest = by_shape[(dp, pp)] = cache[key]
        rest_rows.append(rest)
        counts.append(len(rest))
    if not rest_rows:
        return np.zeros((0, 4), dtype=np.int64), np.zeros((0, 6), dtype=np.int64)
    return np.repeat(np.array(shapes, dtype=np.int64).reshape(-1, 4), counts, axis=0), np.concatenate(rest_rows)


def _option_shapes(option: HardwareOption, kv: dict[str, list[int]]) -> list[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) of every allowed shape that uses all of ``option``'s GPUs, in enumeration order."""
    shapes = []
    for tp, pp, cp in itertools.product(kv["tp"], kv["pp"], kv["cp"]):
        if option.gpus % (tp * pp * cp):
            continue
        dp = option.gpus // (tp * pp * cp)
        if kv["dp"] and dp not in kv["dp"]:
            continue
        shapes.append((dp, tp, pp, cp))
    return shapes


def _too_many(problem: Problem, option: HardwareOption) -> ProblemError:
    return ProblemError(
        f"the plan space holds more than {MAX_PLANS:,} plans (at hardware option {option.name}), too many to "
        "enumerate in memory; allowed: a smaller space, e.g. restrict space.mbs, space.vpp, space.cp or "
        "space.zero, or fewer hardware options (nothing is dropped silently)",
        file=problem.source, field="space",
    )


def check_space_size(problem: Problem, uneven: bool = False, vpp_one: bool = False) -> list[int]:
    """Refuse a space of more than MAX_PLANS plans (rows before duplicates go), as ``enumerate_plans`` does, without
    enumerating it (for searches that enumerate it option by option). Returns the rows of each hardware option
    (``vpp_one``: of its vpp = 1 plans, as ``enumerate_plans(..., vpp_one=True)`` builds them before duplicates go)."""
    total = 0
    rows = []
    for option in problem.hardware:
        kv = knob_values(problem, option, uneven)
        fixed = len(kv["zero"]) * len(kv["recompute"]) * len(kv["sp"]) * len(kv["ep"])
        shapes = _option_shapes(option, kv)
        layers, batch = problem.model.layers, problem.training_task.global_batch
        count, count_one = _shape_count(shapes, kv, fixed, layers, batch, uneven)
        total += count
        if total > MAX_PLANS:
            raise _too_many(problem, option)
        rows.append(count_one if vpp_one else count)
    return rows


def enumerate_plans(
    problem: Problem, uneven: bool = False, options: Sequence[int] | None = None, vpp_one: bool = False
) -> PlanArrays:
    """Every plan in the space on every hardware option that uses all the option's GPUs (``uneven``: the bases of
    the uneven pipeline search: any pp, and any vpp with ``uneven_vpp``). ``options``: only these hardware options
    (indices, ascending); ``vpp_one``: only the vpp = 1 plans of a default vpp space (every vpp > 1 plan of it is a
    vpp = 1 plan with another vpp; ``prune.best_candidates`` adds them when a bound allows).

    Plans come in enumeration order: by option, then lexicographically by (tp, pp, cp, vpp, mbs, zero, recompute,
    sp, ep) (every knob's values ascend; ``prune.enumeration_key``). Cross-knob validity (divisibility, memory) is
    left to the evaluator's ``invalid`` code, so that brute force and the solver see exactly the same candidates.
    """
    parts = []
    total = 0
    for hw in range(len(problem.hardware)) if options is None else options:
        option = problem.hardware[hw]
        kv = knob_values(problem, option, uneven)
        if vpp_one:
            kv["vpp"] = [1]
        shapes = _option_shapes(option, kv)
        if not shapes:
            continue
        fixed = list(itertools.product(kv["zero"], kv["recompute"], kv["sp"], kv["ep"]))
        total += _shape_count(shapes, kv, len(fixed), problem.model.layers, problem.training_task.global_batch,
                              uneven)[0]
        if total > MAX_PLANS:
            raise _too_many(problem, option)
        b, r = _shape_product(shapes, kv, fixed, problem.model.layers, problem.training_task.global_batch, uneven)
        # knobs without effect are no-ops, as in Megatron-Core (sp is turned off at tp 1; ZeRO over dp x cp = 1
        # shards nothing): such a row becomes its sp-off / zero-0 twin, and the duplicates go; vpp without pp too
        no_dp = b[:, 0] * b[:, 3] == 1
        keep = ~((r[:, 4] == 1) & (b[:, 1] == 1)) if 0 in kv["sp"] else np.ones(len(b), dtype=bool)
        keep &= ~((r[:, 2] != min(kv["zero"])) & no_dp)
        r[:, 4] = np.where(b[:, 1] == 1, 0, r[:, 4])
        r[:, 2] = np.where(no_dp, 0, r[:, 2])
        keep &= ~((r[:, 0] > 1) & (b[:, 2] == 1))
        if problem.stack.flash_attention and 0 in kv["recompute"]:  # flash recomputes scores: selective == none
            keep &= r[:, 3] != RECOMPUTE_MODES.index("selective")
        keep &= (b[:, 0] * b[:, 3]) % r[:, 5] == 0  # ep ranks come from dp x cp
        b, r = b[keep], r[keep]
        parts.append(
            PlanArrays(
                dp=b[:, 0], tp=b[:, 1], pp=b[:, 2], cp=b[:, 3],
                vpp=r[:, 0], mbs=r[:, 1], zero=r[:, 2], recompute=r[:, 3], sp=r[:, 4], ep=r[:, 5],
                hw=np.full(len(b), hw, dtype=np.int64),
            )
        )
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return PlanArrays(*(empty for _ in range(10)))
    return PlanArrays.concat(parts)


def empty_space_reason(problem: Problem) -> str:
    """Why ``enumerate_plans`` found no plan: the first of its rules that emptied the space, named, for the
    infeasible message (sp at tp 1 and ZeRO at dp x cp = 1 are no-ops and never empty it)."""
    shaped = vpp_ok = ep_ok = False
    ep_values: list[int] = []
    for option in problem.hardware:
        kv = knob_values(problem, option)
        ep_values = kv["ep"]
        for tp, pp, cp in itertools.product(kv["tp"], kv["pp"], kv["cp"]):
            dp = option.gpus // (tp * pp * cp)
            if option.gpus % (tp * pp * cp) or (kv["dp"] and dp not in kv["dp"]):
                continue
            shaped = True
            vpp_ok |= pp > 1 or min(kv["vpp"] or [1]) == 1
            gradient = int(Groups(dp=float(dp), tp=float(tp), pp=float(pp), cp=float(cp), ep=1.0).gradient)
            ep_ok |= any(gradient % e == 0 for e in kv["ep"])
    sizes = ", ".join(str(o.gpus) for o in problem.hardware)
    if not shaped:
        return f"no allowed dp*tp*pp*cp equals the cluster size(s) {sizes}"
    if not vpp_ok:
        return "every allowed shape has pp = 1, and vpp > 1 needs a pipeline (rule: vpp = 1 at pp = 1)"
    if not ep_ok:
        return (f"no allowed ep ({', '.join(map(str, ep_values))}) divides dp*cp of an allowed shape (rule: expert-"
                "parallel ranks come from dp x cp)")
    return f"no plan uses all the GPUs of the cluster size(s) {sizes}"


CODE_KNOBS: tuple[str, ...] = ("hw", *KNOBS)  # the hardware option and every plan column of the registry


def knob_code(plans: PlanArrays, without: tuple[str, ...]) -> NDArray[np.int64] | None:
    """One integer per plan that is equal exactly when all knobs but ``without`` are (a mixed-radix code); None
    when the code would not fit in 62 bits."""
    cols = [getattr(plans, k) for k in CODE_KNOBS if k not in without]
    radices = [int(c.max()) + 1 if len(c) else 1 for c in cols]
    if float(np.prod(np.array(radices, dtype=np.float64))) >= 2.0**62:
        return None
    key = np.zeros(len(plans), dtype=np.int64)
    for c, radix in zip(cols, radices, strict=True):
        key = key * radix + c
    return key


def memory_rounds(plans: PlanArrays) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(round, parent) per plan for evaluating a space in rounds, so that plans proven over memory capacity are
    never evaluated. Memory per GPU is nondecreasing in vpp and in mbs with every other knob fixed
    (``pipeline.stage_in_flight``; activations and logits scale with the micro-batch): a vpp = 1 plan's parent is
    the same plan at the next smaller micro-batch size, a vpp > 1 plan's parent its vpp = 1 sibling. Round r holds
    the vpp = 1 plans with r smaller micro-batch sizes in their group, then the vpp > 1 plans last. A plan whose
    parent is over capacity (or was itself dropped) is over capacity. parent = -1: evaluate unconditionally."""
    n = len(plans)
    rounds = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    no_mbs, no_vpp = knob_code(plans, ("vpp", "mbs")), knob_code(plans, ("vpp",))
    if no_mbs is None or no_vpp is None or n == 0:
        return rounds, parent
    one = np.flatnonzero(plans.vpp == 1)
    order = one[np.lexsort((plans.mbs[one], no_mbs[one]))]  # by group, then by micro-batch size
    same_group = np.r_[False, no_mbs[order[1:]] == no_mbs[order[:-1]]]
    parent[order[1:]] = np.where(same_group[1:], order[:-1], -1)
    starts = np.flatnonzero(~same_group)
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    rounds[order] = rank
    by_code = one[np.argsort(no_vpp[one], kind="stable")]
    pos = np.minimum(np.searchsorted(no_vpp[by_code], no_vpp), max(len(by_code) - 1, 0))
    rest = plans.vpp != 1
    if len(by_code):
        found = rest & (no_vpp[by_code[pos]] == no_vpp)
        parent = np.where(found, by_code[pos], parent)
    rounds[rest] = int(rank.max(initial=0)) + 1
    return rounds, parent
