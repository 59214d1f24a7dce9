"""Training step model: named additive time terms, memory per GPU and validity for arrays of plans.

This is the single source of truth for every training cost term. The exact evaluator reports these floats; the
CP-SAT encoder rounds the same arrays to integers. Formulas follow Megatron-Core behaviour (see ``Stack``):

    step = m * t_stage(bottleneck) + (p-1)/v * t_stage(mean) + DP_exposed + optimizer   (model/step_time.py)
    t_stage = compute + recompute + TP_exposed + CP_exposed + PP_p2p + ZeRO3_exposed + launch overhead

per micro-batch, with m = global_batch / (dp * mbs) micro-batches and p = pp stages. Three layers of functions:
``layer_costs`` (model/layer_costs.py: one transformer layer, one micro-batch, plus the embedding/head extras), ``stage_costs`` (a stage of
n layers: time per micro-batch, memory, gradient sync) and ``training_terms`` (the uniform pipeline). The
non-uniform pipeline search (``stages.py``) assembles the same ``stage_costs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr, ordered_sum
from madmax_opt.model.collectives import Group
from madmax_opt.model.compute import (
    memory_bound_time_s,
)
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.layer_costs import COMM_INTERFERENCE, LayerCosts, _f, layer_costs  # noqa: F401 (re-exported)
from madmax_opt.model.memory import (
    MemoryTerms,
    model_state_bytes,
)
from madmax_opt.model.pipeline import in_flight_layer_factor, stage_in_flight
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import RC, Stack, Task
from madmax_opt.model.step_time import StepForm, step_form
from madmax_opt.model.workload import TransformerWorkload

# Adam step reads grad + master + m + v (4 + S B), writes master + m + v (S B) and the bf16 copy (2 B), and the
# grad zeroing/unscale pass touches the fp32 grad again (4 B): 10 + 2 S B per local trainable parameter, memory-bound,
# with S the state bytes (memory.OPTIMIZER_STATE_BYTES: 12 B in fp32, so 34 B).
OPTIMIZER_STEP_FIXED_BYTES = 10.0
STAGE_TERMS: tuple[str, ...] = (
    "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "zero3_comm", "overhead"
)
LAYER_TERMS: tuple[str, ...] = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "overhead")
STEP_TERMS: tuple[str, ...] = (*STAGE_TERMS, "bubble", "dp_comm", "optimizer")
MEMORY_FIELDS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "temporary")

INVALID_REASONS: dict[int, str] = {
    1: "dp*tp*pp*cp must equal the number of GPUs",
    2: "tp must divide heads and kv_heads",
    3: "pp*vpp must divide the number of layers",
    4: "dp*mbs must divide global_batch",
    5: "vpp > 1 needs pp > 1 and a micro-batch count divisible by pp",
    6: "cp > 1 needs seq_len divisible by 2*cp (load-balanced causal split)",
    7: "sp needs tp > 1",
    8: "zero > 0 needs dp*cp > 1",
    9: "tp must divide the scale-up domain or be a multiple of it",
    10: "memory per GPU exceeds capacity",
    11: "stage_layers must sum to the model's layers",
    12: "ep must divide num_experts and dp*cp (ep = 1 for dense models)",
}
MEMORY_REASON = 10


@dataclass(frozen=True)
class StageCosts:
    """One pipeline stage: time per micro-batch by term, memory per GPU, step-level DP sync and optimizer."""

    time: dict[str, Arr]  # STAGE_TERMS, per micro-batch
    hidden: dict[str, Arr]  # overlapped communication per micro-batch (zero3) or per step (dp)
    memory: MemoryTerms
    dp_exposed_s: Arr  # per step
    optimizer_s: Arr  # per step

    @property
    def per_micro_batch_s(self) -> Arr:
        return ordered_sum(self.time[k] for k in STAGE_TERMS)


def stage_costs(
    lc: LayerCosts,
    stack: Stack,
    hbm_bw: Arr,
    n_layers: Arr,
    first: Arr,
    last: Arr,
    act_multiplier: Arr,
    train_layers: Arr | None = None,
) -> StageCosts:
    """A stage of ``n_layers`` layers (+ embedding if ``first``, + head if ``last``) holding ``act_multiplier``
    micro-batches of activations (1F1B: min(p - stage, m), times the interleaving factor), of which
    ``train_layers`` have trainable base weights (the rest are frozen: no weight gradients, no optimizer state)."""
    if train_layers is None:  # no position information: the model's average share of trainable layers
        train_layers = n_layers * lc.trainable_fraction
    zero = lc.plans.zero
    extra_params = first * lc.emb_params + last * lc.head_params
    params = n_layers * lc.params + extra_params
    trainable = train_layers * lc.trainable + n_layers * lc.lora_trainable + lc.emb_trainable * extra_params
    tiers, group = lc.tiers, lc.dp_group
    # the DP group's cost coefficients (stride tp), built once for its seven collectives below
    dp_net = Group.of(group, lc.plans.tp, tiers)

    time = {k: n_layers * lc.time[k] for k in LAYER_TERMS}
    time["compute"] = time["compute"] + train_layers * lc.wgrad_s + first * lc.emb_time_s + last * lc.head_time_s
    # compute already hiding TP/CP/EP traffic cannot hide ZeRO or DP traffic as well (one window, not two)
    layer_hidden = lc.hidden["tp_comm"] + lc.hidden["cp_comm"] + lc.hidden["ep_comm"]
    time["pp_comm"] = lc.pp_comm_s
    # ZeRO-3 / FSDP: gather weights for fwd, bwd (and recompute), reduce-scatter grads, every micro-batch
    gathers = 2.0 + np.where(lc.plans.recompute == RC.FULL, 1.0, 0.0)
    zero3_on = (zero >= 3) & (group > 1)
    zero3 = np.where(
        zero3_on,
        gathers * dp_net.all_gather_s(params * lc.gather_bytes)
        + dp_net.reduce_scatter_s(trainable * lc.grad_bytes)
        + _expert_zero3_s(lc, n_layers, train_layers, gathers),
        0.0,
    )
    busy = time["compute"] + time["recompute"] - n_layers * layer_hidden
    # prefetching hides layer i+1's gather under layer i, but each pass starts with an exposed gather of its first
    # layer and the backward ends with an exposed reduce-scatter of its last (PyTorch FSDP2 / FSDP1 BACKWARD_PRE)
    first_layer = np.where(
        zero3_on,
        gathers * dp_net.all_gather_s(lc.params * lc.gather_bytes)
        + dp_net.reduce_scatter_s(lc.trainable * lc.grad_bytes),
        0.0,
    )
    exposed = np.maximum(np.minimum(first_layer, zero3), zero3 - busy)
    time["zero3_comm"] = np.maximum(0.0, exposed) if stack.dp_overlap else zero3
    hidden = {
        "tp_comm": n_layers * lc.hidden["tp_comm"],
        "cp_comm": n_layers * lc.hidden["cp_comm"],
        "ep_comm": n_layers * lc.hidden["ep_comm"],
        "zero3_comm": zero3 - time["zero3_comm"],
    }

    # ZeRO 0-2: one gradient sync per step, overlapped with the last micro-batch's backward (bucketed DDP)
    grads = trainable * lc.grad_bytes
    sync = np.select(
        [zero == 0, zero <= 2],
        [
            dp_net.all_reduce_s(grads),
            dp_net.reduce_scatter_s(grads) + dp_net.all_gather_s(trainable * 2.0),
        ],
        0.0,
    )
    sync = np.where(group > 1, sync, 0.0) + _expert_sync_s(lc, train_layers)
    bwd = n_layers * lc.bwd_s + train_layers * lc.wgrad_s - n_layers * layer_hidden
    window = np.maximum(bwd, 0.0) if stack.dp_overlap else 0.0
    dp_exposed = np.maximum(0.0, sync - window)
    hidden["dp_comm"] = sync - dp_exposed
    ex_params, ex_train = n_layers * lc.expert_params, train_layers * lc.expert_params
    opt_params = trainable / np.where(zero >= 1, group, 1.0) + ex_train / np.where(zero >= 1, lc.expert_group, 1.0)
    optimizer = memory_bound_time_s(opt_params * (OPTIMIZER_STEP_FIXED_BYTES + 2.0 * lc.optimizer_bytes), hbm_bw)

    w, g, o = model_state_bytes(params, trainable, zero, group, lc.grad_bytes, lc.optimizer_bytes)
    we, ge, oe = model_state_bytes(ex_params, ex_train, zero, lc.expert_group, lc.grad_bytes, lc.optimizer_bytes)
    w, g, o = w + we, g + ge, o + oe
    w = w + params * lc.weight_copy_bytes / np.where(zero >= 3, group, 1.0)  # FP8 weight copies (TE cache)
    act = n_layers * act_multiplier * lc.act_stored_bytes + lc.act_working_bytes + last * lc.logits_bytes
    memory = MemoryTerms(w, g, o, act, lc.zero3_layer_buffers)
    return StageCosts(time, hidden, memory, dp_exposed, optimizer)


def _expert_zero3_s(lc: LayerCosts, n_layers: Arr, train_layers: Arr, gathers: Arr) -> Arr | float:
    """ZeRO-3 traffic of the routed experts, over the expert-data-parallel group, per micro-batch."""
    if not np.any(lc.expert_params):
        return 0.0
    p, t, grp, st = n_layers * lc.expert_params, train_layers * lc.expert_params, lc.expert_group, lc.expert_stride
    net = Group.of(grp, st, lc.tiers)  # built once for both collectives
    out = gathers * net.all_gather_s(p * 2.0) + net.reduce_scatter_s(t * lc.grad_bytes)
    return np.where(np.asarray(grp) > 1, out, 0.0)


def _expert_sync_s(lc: LayerCosts, train_layers: Arr) -> Arr | float:
    """Per-step gradient sync of the routed experts over the expert-data-parallel group (ZeRO 0-2)."""
    if not np.any(lc.expert_params) or not np.any(train_layers):
        return 0.0
    zero, grp, st = lc.plans.zero, lc.expert_group, lc.expert_stride
    grads = train_layers * lc.expert_params * lc.grad_bytes
    net = Group.of(grp, st, lc.tiers)  # built once for its three collectives
    sync = np.select(
        [zero == 0, zero <= 2],
        [
            net.all_reduce_s(grads),
            net.reduce_scatter_s(grads) + net.all_gather_s(train_layers * lc.expert_params * 2.0),
        ],
        0.0,
    )
    return np.where(np.asarray(grp) > 1, sync, 0.0)


@dataclass(frozen=True)
class TrainingTerms:
    time: dict[str, Arr]  # additive terms of the step time, seconds
    hidden_comm: dict[str, Arr]  # communication overlapped with compute (not in the step time), seconds
    memory: MemoryTerms
    capacity_bytes: Arr
    invalid: NDArray[np.int64]  # 0 = valid, else a key of INVALID_REASONS (the first violated)
    tokens_per_step: float
    model_flops_per_step: float
    gpus: NDArray[np.int64]
    peak_flops: Arr
    recompute_flops_per_step: Arr  # forward FLOPs run again by activation recomputation (HFU - MFU numerator)

    @property
    def hardware_flops_per_step(self) -> Arr:
        """FLOPs the GPUs execute per step: model FLOPs + recomputed forward FLOPs (the HFU numerator)."""
        return self.model_flops_per_step + self.recompute_flops_per_step

    @property
    def step_time_s(self) -> Arr:
        return ordered_sum(self.time[k] for k in STEP_TERMS)


def _pick(cond: NDArray[np.bool_], a: dict[str, Arr], b: dict[str, Arr]) -> dict[str, Arr]:
    return {k: np.where(cond, a[k], b[k]) for k in a}


def trainable_layers(stage_end: Arr, n_layers: Arr, frozen: float) -> Arr:
    """Layers with trainable base weights in a stage of ``n_layers`` ending before layer ``stage_end``, when the
    model's first ``frozen`` layers are frozen."""
    return np.clip(stage_end - frozen, 0.0, n_layers)


def _worst_memory(stages: list[StageCosts]) -> MemoryTerms:
    """Per plan, the memory breakdown of the stage with the largest total."""
    totals = np.stack([st.memory.total for st in stages])
    worst = np.argmax(totals, axis=0)  # first maximum: ties keep the earlier stage
    return MemoryTerms(
        *(np.choose(worst, [getattr(st.memory, f) for st in stages]) for f in MEMORY_FIELDS)
    )


def training_terms(
    wl: TransformerWorkload, task: Task, stack: Stack, table: HardwareTable, plans: PlanArrays
) -> TrainingTerms:
    """Evaluate the training cost model for every plan in ``plans`` (uniform pipeline stages, vectorised)."""
    lc = layer_costs(wl, task, stack, table, plans)
    pp, vpp = _f(plans.pp), _f(plans.vpp)
    n = wl.layers / pp
    single = pp == 1
    ones = np.ones_like(pp)
    hbm_bw = table.hbm_bw[plans.hw]
    frozen, layers = float(wl.frozen_layers), float(wl.layers)
    in_flight = in_flight_layer_factor(lc.n_micro, pp, vpp)
    # stage 0 (embedding; holds the most activations) and the last stage (LM head); with pp = 1 they coincide
    first_train, last_train = trainable_layers(n, n, frozen), trainable_layers(layers * ones, n, frozen)
    first = stage_costs(lc, stack, hbm_bw, n, ones, np.where(single, 1.0, 0.0), in_flight, first_train)
    last_flight = stage_in_flight(pp - 1.0, lc.n_micro, pp, vpp)  # 1 with 1F1B; ~p with interleaving
    last = stage_costs(lc, stack, hbm_bw, n, np.where(single, 1.0, 0.0), ones, last_flight, last_train)
    # the stages in between, on average (stage time is linear in its trainable layers: exact for the mean)
    middle_train = np.where(pp > 2, (layers - frozen - first_train - last_train) / np.maximum(pp - 2.0, 1.0), 0.0)
    middle = stage_costs(lc, stack, hbm_bw, n, 0.0 * ones, 0.0 * ones, ones, middle_train)
    t_first, t_last = first.per_micro_batch_s, last.per_micro_batch_s
    first_is_bottleneck = t_first >= t_last
    bottleneck = _pick(first_is_bottleneck, first.time, last.time)
    t_mean = np.where(single, t_first, ((pp - 2.0) * middle.per_micro_batch_s + t_first + t_last) / pp)

    form = StepForm(lc.n_micro, pp, vpp)  # the one step-time form (model/step_time.py)
    time = form.terms({k: bottleneck[k] for k in STAGE_TERMS}, t_mean,
                      np.maximum(first.dp_exposed_s, last.dp_exposed_s), np.maximum(first.optimizer_s, last.optimizer_s))
    hidden = {k: form.stage_max * v for k, v in _pick(first_is_bottleneck, first.hidden, last.hidden).items()}
    hidden["dp_comm"] = np.maximum(first.hidden["dp_comm"], last.hidden["dp_comm"])

    stages = [first, last]
    if 0 < frozen < layers:
        # memory per stage is piecewise linear in the stage index (in-flight micro-batches fall, trainable
        # layers rise): its maximum is at stage 0, the last stage, or one of these breakpoints
        for s_idx in (np.floor(frozen / n), np.floor(frozen / n) + 1.0, pp - lc.n_micro):
            s_c = np.clip(s_idx, 0.0, pp - 1.0)
            mult = stage_in_flight(s_c, lc.n_micro, pp, vpp)
            stages.append(stage_costs(lc, stack, hbm_bw, n, (s_c == 0) * 1.0, (s_c == pp - 1) * 1.0, mult,
                                      trainable_layers((s_c + 1.0) * n, n, frozen)))
    memory = _worst_memory(stages)
    capacity = table.hbm_bytes[plans.hw] * (1.0 - stack.memory_reserve_fraction)
    invalid = invalid_codes(wl, task, table, plans, lc.n_micro, memory.total, capacity)
    peak = table.peak_flops(task.precision)[plans.hw]
    rc_flops = layers * _recompute_flops(wl, stack)[plans.recompute]
    return _step_terms(wl, task, time, hidden, memory, capacity, invalid, plans.gpus, peak, rc_flops)


def _recompute_flops(wl: TransformerWorkload, stack: Stack) -> Arr:
    """Recomputed forward FLOPs of one layer per token, indexed by recompute mode (0 none, 1 selective, 2 full)."""
    op_sac = wl.op_sac_applies(stack)
    return np.array([float(wl.recompute_flops_per_layer_token(m, op_sac)) for m in range(3)])


def _step_terms(
    wl: TransformerWorkload,
    task: Task,
    time: dict[str, Arr],
    hidden: dict[str, Arr],
    memory: MemoryTerms,
    capacity: Arr,
    invalid: NDArray[np.int64],
    gpus: NDArray[np.int64],
    peak: Arr,
    recompute_flops_per_token: Arr,
) -> TrainingTerms:
    tokens_per_step = float(task.global_batch * wl.seq_len)
    return TrainingTerms(
        time=time,
        hidden_comm=hidden,
        memory=memory,
        capacity_bytes=capacity,
        invalid=invalid,
        tokens_per_step=tokens_per_step,
        model_flops_per_step=tokens_per_step * wl.model_flops_per_token,
        gpus=gpus,
        peak_flops=peak,
        recompute_flops_per_step=tokens_per_step * recompute_flops_per_token,
    )


def staged_terms(
    wl: TransformerWorkload,
    task: Task,
    stack: Stack,
    table: HardwareTable,
    base: PlanArrays,
    stage_layers: list[int],
    stage_recompute: list[int],
    stage_hw: list[int] | None = None,
) -> TrainingTerms:
    """One uneven pipeline: stage s has ``stage_layers[s]`` layers, its own recompute mode (and, for mixed
    pipelines, its own hardware option), and holds ``stage_in_flight`` micro-batches of activations. With
    ``base.vpp`` = v > 1 each stage's layers run as v virtual chunks (Megatron-Core's interleaved schedule with
    first / last stage layer counts or a pipeline layout): p2p per chunk and the bubble (p - 1)/v of the mean
    stage time. Same stage costs and step assembly as ``training_terms``; memory is compared stage by stage."""
    p = len(stage_layers)
    v = float(base.vpp[0])
    idx = np.zeros(p, dtype=np.int64)
    stages = base.take(idx)
    hw = stages.hw if stage_hw is None else np.asarray(stage_hw, dtype=np.int64)
    stages = PlanArrays(
        **{**stages.__dict__, "recompute": np.asarray(stage_recompute, dtype=np.int64), "hw": hw}
    )
    lc = layer_costs(wl, task, stack, table, stages)
    s_idx = np.arange(p, dtype=np.float64)
    n_layers = np.asarray(stage_layers, dtype=np.float64)
    train = trainable_layers(np.cumsum(n_layers), n_layers, float(wl.frozen_layers))
    sc = stage_costs(
        lc, stack, table.hbm_bw[stages.hw], n_layers, (s_idx == 0).astype(np.float64),
        (s_idx == p - 1).astype(np.float64), stage_in_flight(s_idx, lc.n_micro, float(p), v), train,
    )
    t = sc.per_micro_batch_s
    b = int(np.argmax(t))
    m = lc.n_micro[:1]
    form = step_form(m, float(p), v)  # the one step-time form (model/step_time.py)
    time = form.terms({k: sc.time[k][b] for k in STAGE_TERMS}, np.array([t.mean()]),
                      np.array([sc.dp_exposed_s.max()]), np.array([sc.optimizer_s.max()]))
    hidden = {k: form.stage_max * v[b] for k, v in sc.hidden.items()}
    hidden["dp_comm"] = np.array([sc.hidden["dp_comm"].max()])
    capacities = table.hbm_bytes[hw] * (1.0 - stack.memory_reserve_fraction)
    worst = int(np.argmax(sc.memory.total - capacities))  # the stage closest to (or over) its capacity
    memory = MemoryTerms(*(np.array([getattr(sc.memory, f)[worst]]) for f in MEMORY_FIELDS))
    capacity = capacities[worst : worst + 1]
    # a mixed pipeline's GPU count is a sum over types: the caller checks it against the supplies
    invalid = invalid_codes(
        wl, task, table, base, m, memory.total, capacity, check_layers=False, check_gpus=stage_hw is None
    )
    if sum(stage_layers) != wl.layers:  # a structural rule: it outranks "does not fit" (emit --force overrides that)
        invalid = np.where((invalid == 0) | (invalid == MEMORY_REASON), 11, invalid)
    peak = np.array([table.peak_flops(task.precision)[hw].mean()])  # equal GPUs per stage
    rc_flops = np.array([float(np.dot(n_layers, _recompute_flops(wl, stack)[np.asarray(stage_recompute)]))])
    return _step_terms(wl, task, time, hidden, memory, capacity, invalid, base.gpus, peak, rc_flops)


def invalid_codes(
    wl: TransformerWorkload,
    task: Task,
    table: HardwareTable,
    plans: PlanArrays,
    n_micro: Arr,
    mem_total: Arr,
    capacity: Arr,
    check_layers: bool = True,
    check_gpus: bool = True,
) -> NDArray[np.int64]:
    """The first violated validity rule per plan (0 = valid); see INVALID_REASONS."""
    m = wl.model
    tp, pp, vpp, cp = plans.tp, plans.pp, plans.vpp, plans.cp
    gradient_group = Groups.of(plans).gradient  # dp x cp
    node = table.tier_size[0][plans.hw]
    node = np.where(np.isinf(node), 1 << 30, node).astype(np.int64)
    checks = [
        (1, (plans.gpus != table.gpus[plans.hw].astype(np.int64)) & check_gpus),
        (2, (m.heads % tp != 0) | (m.n_kv_heads % tp != 0)),
        (3, (wl.layers % (pp * vpp) != 0) & check_layers),
        (4, task.global_batch % (plans.dp * plans.mbs) != 0),
        (5, (vpp > 1) & ((pp == 1) | (np.round(n_micro).astype(np.int64) % pp != 0))),
        (6, (cp > 1) & (wl.seq_len % (2 * cp) != 0)),
        (7, (plans.sp > 0) & (tp == 1)),
        (8, (plans.zero > 0) & (gradient_group == 1)),
        (9, (node % tp != 0) & (tp % node != 0)),
        (12, (wl.num_experts % plans.ep != 0) | (gradient_group % plans.ep != 0) if wl.moe else plans.ep != 1),
        (MEMORY_REASON, mem_total > capacity),
    ]
    code = np.zeros(len(plans), dtype=np.int64)
    for c, bad in reversed(checks):  # the first violated check wins
        code = np.where(bad, c, code)
    return code
