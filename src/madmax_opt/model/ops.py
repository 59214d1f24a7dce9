"""The op table of one transformer layer: each op owns its FLOPs, bytes, roofline and time (Calculon-style).

One row per op and pass, for one micro-batch on one GPU, vectorised over plans (every field an array):

    pass       fwd | bwd-input (activation gradients) | bwd-weight (weight gradients) | recompute
    roofline   gemm:          t = FLOPs / (peak x gemm_eff x d / (d + d_half))   (d = smallest per-GPU dimension)
               grouped-gemm:  the same at gemm_eff x grouped_gemm_ratio (MoE routed experts)
               attention:     flash: t = FLOPs x (1/2 if causal) / (peak x attn_eff); unfused: batched GEMMs
               hbm:           t = bytes / achieved HBM bandwidth (norms, residuals, activations, softmax, FP8 casts)
               collective:    alpha-beta over the network tiers the group spans (``collectives.py``)
               ceiling:       max(0, FLOPs / (peak x ceiling) - time) of the layer's compute passes: no layer
                              computes above the best executed-FLOP utilisation measured on its (GPU, precision)
                              (``compute.utilization_ceiling``, data/utilization_ceilings.yaml)
    term       the LayerCosts term the row's time feeds: compute, recompute, tp_comm, cp_comm, ep_comm

FLOPs are model FLOPs (MFU convention, ``workload.py``): attention counts the full s x s matrix, backward = 2 x
forward; the causal skip and flash's recomputed QK^T are in the time only. Bytes of GEMM and attention rows are
their operand traffic and inform only (their rooflines price FLOPs); bytes of hbm rows set their time; bytes of a
collective are the buffer each rank sends or gathers.

``training.layer_costs`` sums the rows into the LayerCosts terms; the overlap of collectives with compute (which
part of a row's time is exposed) is a schedule property and stays there. Rows of one term and pass are added
group by group (the rows of a group first, in order), then passes in the order asked: ``group`` is that bracket,
kept so the totals are bitwise those of the closed-form sums the table replaced. A new effect is one more row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr, ordered_sum
from madmax_opt.model.collectives import Tiers, all_gather_s, all_reduce_s
from madmax_opt.model.compute import (
    CAST_BYTES_PER_ELEMENT,
    LOW_PRECISION_GEMMS,
    cast_time_s,
    gemm_time_s,
    memory_bound_time_s,
    utilization_ceiling,
)
from madmax_opt.model.groups import Groups
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.moe import ExpertCosts, expert_costs
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.spec import RC, Stack, Task
from madmax_opt.model.workload import ACT_BYTES, Gemm, TransformerWorkload

PASSES: tuple[str, ...] = ("fwd", "bwd-input", "bwd-weight", "recompute")
ROOFLINES: tuple[str, ...] = ("gemm", "grouped-gemm", "attention", "hbm", "collective", "ceiling")
TERMS: tuple[str, ...] = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")  # LayerCosts terms rows feed
FLASH_BWD_FACTOR = 2.5  # flash-attention backward = 2x forward + recomputed QK^T/softmax (Dao 2022, Sec. 3.1)


@dataclass(frozen=True)
class Op:
    """One row of the table: an op in one pass of one layer, per micro-batch on one GPU (arrays over plans)."""

    name: str
    pass_: str  # one of PASSES
    term: str  # the LayerCosts term its time feeds
    roofline: str  # one of ROOFLINES
    group: str  # summation bracket inside (term, pass); see the module docstring
    flops_of: Callable[[], Arr]  # FLOPs and bytes are computed when asked (reports, tests), not on the cost path
    bytes_of: Callable[[], Arr]
    time_s: Arr
    window_s: Arr | None = None  # compute a backward TP collective runs under (its exposed part is the excess)
    ranks: Arr | None = None  # collectives: the process group's size and stride (which tiers it spans)
    stride: Arr | None = None

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES or self.term not in TERMS or self.roofline not in ROOFLINES:
            raise ValueError(f"op {self.name}: pass {self.pass_!r}, term {self.term!r} or roofline {self.roofline!r} "
                             f"is not one of {PASSES}, {TERMS}, {ROOFLINES}")

    @property
    def flops(self) -> Arr:
        return self.flops_of()

    @property
    def bytes(self) -> Arr:
        return self.bytes_of()


@dataclass(frozen=True)
class LayerOps:
    """The rows of one layer plus the per-plan quantities the layer schedule (overlap windows, extras) reads."""

    rows: tuple[Op, ...]
    tiers: Tiers
    tokens: Arr  # tokens of one micro-batch on one GPU = mbs * s / cp
    sp_div: Arr  # tp where sequence parallelism shards the replicated activations, else 1
    full_rc: Arr  # 1 where the plan recomputes whole layers, else 0
    peak: Arr  # bf16 peak (attention, LM head) and the plain GEMM roofline
    eff: Arr
    half: Arr
    hbm_bw: Arr
    attn_fwd_s: Arr
    attn_bwd_factor: float
    experts: ExpertCosts
    ceiling: Arr  # executed-FLOP utilisation ceiling of the plan's (GPU, precision), fraction of the task's peak

    def select(self, term: str | None = None, pass_: str | None = None) -> list[Op]:
        """The rows of ``term`` in ``pass_`` (None: any); a name outside TERMS / PASSES is a bug, never zero."""
        if term not in (None, *TERMS) or pass_ not in (None, *PASSES):
            raise ValueError(f"unknown op term {term!r} or pass {pass_!r}; terms: {TERMS}, passes: {PASSES}")
        return [r for r in self.rows if term in (None, r.term) and pass_ in (None, r.pass_)]

    def total_s(self, term: str, *passes: str) -> Arr:
        """Time of ``term`` over ``passes``: per pass, rows summed group by group; passes left to right."""
        return ordered_sum(self._pass_total(term, p) for p in passes)

    def _pass_total(self, term: str, pass_: str) -> Arr:
        groups: dict[str, list[Arr]] = {}
        for r in self.select(term, pass_):
            groups.setdefault(r.group, []).append(r.time_s)
        if not groups:
            return np.zeros_like(self.tokens)
        return ordered_sum(ordered_sum(ts) for ts in groups.values())


def exposed_hidden(rows: Iterable[Op]) -> tuple[Arr, Arr]:
    """Sum over collectives of max(0, t - window) (exposed) and min(t, window) (hidden); no window = exposed."""
    rows = list(rows)
    exposed = ordered_sum(r.time_s if r.window_s is None else np.maximum(0.0, r.time_s - r.window_s) for r in rows)
    windowed = [np.minimum(r.time_s, r.window_s) for r in rows if r.window_s is not None]
    return exposed, ordered_sum(windowed) if windowed else np.zeros_like(exposed)


def _f(a: NDArray[np.int64]) -> Arr:
    return a.astype(np.float64)


def _const(a: Arr) -> Callable[[], Arr]:
    return lambda: a


def _scaled(of: Callable[[], Arr], by: Arr) -> Callable[[], Arr]:
    return lambda: of() * by


def _operand_bytes(elem_bytes: float, tokens: Arr, k: Arr | float, n: Arr | float) -> Callable[[], Arr]:
    """Input (tokens x k), weight (k x n) and output (tokens x n) of a GEMM at ``elem_bytes`` per element."""
    return lambda: elem_bytes * (tokens * k + k * n + tokens * n)


def layer_ops(
    wl: TransformerWorkload, task: Task, stack: Stack, table: HardwareTable, plans: PlanArrays
) -> LayerOps:
    """The op table of one layer for every plan in ``plans`` (vectorised)."""
    dp, tp, cp, mbs, ep = (_f(x) for x in (plans.dp, plans.tp, plans.cp, plans.mbs, plans.ep))
    rc, sp, hw = plans.recompute, plans.sp, plans.hw
    tiers = table.tiers(hw)
    low = task.precision in LOW_PRECISION_GEMMS
    # FP8 / MXFP8 reach the weight GEMMs only (TE fp8_autocast, torchao Float8Linear): attention, norms and the
    # LM head run in bf16 at the bf16 peak; MX block scaling costs mxfp8_gemm_ratio of the FP8 GEMM rate
    peak = table.peak_flops("bf16" if low else task.precision)[hw]
    eff, half = table.gemm_eff[hw], table.gemm_half_dim[hw]
    mm_peak = table.peak_flops(task.precision)[hw]
    mm_eff = table.fp8_gemm_eff[hw] * np.where(task.precision == "mxfp8", table.mxfp8_gemm_ratio[hw], 1.0) if low \
        else eff
    hbm_bw = table.hbm_bw[hw]
    m = wl.model
    s = float(wl.seq_len)
    h = float(m.hidden)
    tokens = mbs * s / cp  # tokens of one micro-batch on one GPU
    sp_div = np.where(sp > 0, tp, 1.0)
    full_rc = np.where(rc == RC.FULL, 1.0, 0.0)
    zero = np.zeros_like(dp)
    elem_bytes = 1.0 if low else float(ACT_BYTES)  # GEMM operand size
    rows: list[Op] = []

    def row(name: str, pass_: str, term: str, roofline: str, group: str, flops: Callable[[], Arr],
            bytes_: Callable[[], Arr], time_s: Arr, **kw: Arr | None) -> None:
        rows.append(Op(name, pass_, term, roofline, group, flops, bytes_, time_s, **kw))

    def none() -> Arr:
        return zero

    # ---- weight GEMMs: y = x W (fwd), dx = dy W^T (bwd-input), dW = x^T dy (bwd-weight): same FLOPs, same time
    gemms: list[tuple[str, Callable[[], Arr], Callable[[], Arr], Arr]] = []
    column_parallel: list[tuple[str, Arr]] = []  # GEMMs whose input TP gathers (QKV, MLP up, router)
    cast_fwd, cast_bwd = zero, zero  # FP8 quantisation of GEMM operands
    cast_elements: list[tuple[Arr | float, Arr | float]] = []  # per GEMM: elements per token cast in fwd, in bwd

    def priced(g: Gemm) -> tuple[Arr, Arr, Arr, Arr | float, Arr | float]:
        """FLOPs, time, TP-sharded dimension and local (k, n) of a weight GEMM on one micro-batch on one GPU."""
        sharded = (g.n if g.tp_dim == "n" else g.k) / tp
        other = float(g.k if g.tp_dim == "n" else g.n)
        flops = tokens * g.flops_per_token / tp
        t = gemm_time_s(flops, np.minimum(np.minimum(tokens, sharded), other), mm_peak, mm_eff, half)
        return flops, t, sharded, *((other, sharded) if g.tp_dim == "n" else (sharded, other))

    for g in wl.gemms:
        flops, t_gemm, sharded, k_loc, n_loc = priced(g)
        gemms.append((g.name, _const(flops), _operand_bytes(elem_bytes, tokens, k_loc, n_loc), t_gemm))
        if g.tp_dim == "n":
            column_parallel.append((g.name, t_gemm))
        if low:  # quantise the input x (tokens x k) in forward and the output gradient dy (tokens x n) in backward;
            # with SP the unsharded operand is cast on its sequence shard before the FP8 all-gather (TE)
            k_cast, n_cast = (g.k / sp_div, sharded) if g.tp_dim == "n" else (sharded, g.n / sp_div)
            cast_fwd = cast_fwd + cast_time_s(tokens * k_cast, task.precision, hbm_bw)
            cast_bwd = cast_bwd + cast_time_s(tokens * n_cast, task.precision, hbm_bw)
            cast_elements.append((k_cast, n_cast))
    groups = Groups.of(plans)
    ex = expert_costs(wl, tokens, groups, sp_div, tiers, mm_peak, mm_eff, half, table.grouped_gemm_ratio[hw])
    for pass_ in ("fwd", "bwd-input", "bwd-weight"):
        for name, flops_of, bytes_of, t_gemm in gemms:
            row(name, pass_, "compute", "gemm", "gemm", flops_of, bytes_of, t_gemm)
        if wl.moe:
            row("experts", pass_, "compute", "grouped-gemm", "gemm", lambda: ex.fwd_flops,
                lambda: ex.operand_elements * elem_bytes, ex.fwd_gemm_s)

    # ---- attention core, its unfused softmax traffic, elementwise kernels, FP8 casts ----------------------------
    attn_flops = tokens * wl.attn_flops_per_token / tp
    qkvo_bytes = tokens * (2 * m.heads + 2 * m.n_kv_heads) * m.head_dim * ACT_BYTES / tp  # Q, O; K, V
    if stack.flash_attention:
        attn_fwd = attn_flops * (0.5 if wl.causal else 1.0) / (peak * table.attn_eff[hw])
        attn_bwd_factor = FLASH_BWD_FACTOR
    else:  # unfused: batched GEMMs of inner dim head_dim over the full s x s matrix + softmax traffic
        attn_fwd = gemm_time_s(attn_flops, np.full_like(dp, float(m.head_dim)), peak, eff, half)
        attn_bwd_factor = 2.0
    score_bytes = tokens * s * wl.score_elementwise_bytes_per_key / tp
    score_elem = memory_bound_time_s(score_bytes, hbm_bw)
    elem_bytes_moved = tokens * (wl.elementwise_replicated_bytes / sp_div + wl.elementwise_tp_bytes / tp)
    elem = memory_bound_time_s(elem_bytes_moved, hbm_bw)
    cast_b = CAST_BYTES_PER_ELEMENT.get(task.precision, 0.0)
    row("attention", "fwd", "compute", "attention", "attention", lambda: attn_flops, lambda: qkvo_bytes, attn_fwd)
    if wl.score_elementwise_bytes_per_key:
        row("softmax", "fwd", "compute", "hbm", "softmax", none, lambda: score_bytes, score_elem)
    row("elementwise", "fwd", "compute", "hbm", "elementwise", none, lambda: elem_bytes_moved, elem)
    if low:
        row("fp8 cast", "fwd", "compute", "hbm", "cast", none,
            lambda: ordered_sum(tokens * x * cast_b for x, _ in cast_elements), cast_fwd)
    # backward reads Q, K, V, O, dO and writes dQ, dK, dV: twice the forward operands
    row("attention", "bwd-input", "compute", "attention", "attention", lambda: 2.0 * attn_flops,
        lambda: 2.0 * qkvo_bytes, attn_fwd * attn_bwd_factor)
    if wl.score_elementwise_bytes_per_key:
        row("softmax", "bwd-input", "compute", "hbm", "elementwise", none, lambda: 2.0 * score_bytes,
            2.0 * score_elem)
    row("elementwise", "bwd-input", "compute", "hbm", "elementwise", none, lambda: 2.0 * elem_bytes_moved,
        2.0 * elem)
    if low:
        row("fp8 cast", "bwd-input", "compute", "hbm", "cast", none,
            lambda: ordered_sum(tokens * x * cast_b for _, x in cast_elements), cast_bwd)
    # recompute: selective re-runs the unfused attention core and its softmax (flash recomputes inside its bwd);
    # full re-runs the whole forward. torchtitan's op-level SAC re-runs the block's forward returning the saved
    # ops' outputs (attention, every odd mm; workload._op_sac_mms): the other mm's, every elementwise op and FP8 cast
    op_sac = wl.op_sac_applies(stack)
    selective = {"attention": attn_fwd * (not stack.flash_attention), "softmax": score_elem}
    if op_sac:
        selective = {"elementwise": elem, "fp8 cast": cast_fwd}
    is_sel, is_full = rc == RC.SELECTIVE, rc == RC.FULL
    for r in [r for r in rows if r.pass_ == "fwd"]:
        if r.name in selective:
            t_sel = selective[r.name]
            on = np.where(is_full | (is_sel & (t_sel > 0)), 1.0, 0.0)
            row(r.name, "recompute", "recompute", r.roofline, r.group, _scaled(r.flops_of, on),
                _scaled(r.bytes_of, on), np.select([is_sel, is_full], [t_sel, r.time_s], 0.0))
        else:
            row(r.name, "recompute", "recompute", r.roofline, r.group, _scaled(r.flops_of, full_rc),
                _scaled(r.bytes_of, full_rc), np.where(is_full, r.time_s, 0.0))
    sel_on = np.where(is_sel, 1.0, 0.0)
    for g in wl.sac_recompute_gemms if op_sac else ():  # each at its own shape (wk is narrow under GQA)
        flops, t_mm, _, k_loc, n_loc = priced(g)
        row(f"{g.name} (op sac)", "recompute", "recompute", "gemm", "gemm", _const(flops * sel_on),
            _scaled(_operand_bytes(elem_bytes, tokens, k_loc, n_loc), sel_on), t_mm * sel_on)

    # ---- utilisation ceiling: a layer's compute (fwd + bwd + recompute) takes at least its FLOPs / (task-precision
    # peak x ceiling): the bwd-input row lifts a frozen layer (no weight gradients), the bwd-weight row a trainable one
    ceiling = np.array([utilization_ceiling(o.gpu.name, task.precision).hfu for o in table.options])[hw]

    def time_flops(*passes: str) -> tuple[Arr, Arr]:
        in_passes = [r for r in rows if r.pass_ in passes and r.term in ("compute", "recompute")]
        return ordered_sum(r.time_s for r in in_passes), ordered_sum(r.flops for r in in_passes)

    frozen_s, frozen_flops = time_flops("fwd", "bwd-input", "recompute")
    lift_frozen = np.maximum(0.0, frozen_flops / (mm_peak * ceiling) - frozen_s)
    trained_s, trained_flops = time_flops("fwd", "bwd-input", "bwd-weight", "recompute")
    lift_trained = np.maximum(0.0, trained_flops / (mm_peak * ceiling) - trained_s - lift_frozen)
    row("utilisation ceiling", "bwd-input", "compute", "ceiling", "ceiling", none, none, lift_frozen)
    row("utilisation ceiling", "bwd-weight", "compute", "ceiling", "ceiling", none, none, lift_trained)

    # ---- TP (+SP) communication ---------------------------------------------------------------------------------
    # Per layer: forward 2 all-reduces (SP: 2 all-gathers + 2 reduce-scatters), again in a full recompute. Backward
    # (Megatron LinearWithGradAccumulationAndAsyncCommunication; TE alike) at each column-parallel GEMM: without SP
    # the input-grad all-reduce runs under the weight-grad GEMM; with SP the saved sharded input is all-gathered
    # again under the input-grad GEMM and the input grad reduce-scattered under the weight-grad GEMM, while the
    # all-gather of the output grad (conjugate of the forward reduce-scatter) stays exposed.
    act_bytes = tokens * h * ACT_BYTES
    ones = np.ones_like(tp)
    ar = np.where(tp > 1, all_reduce_s(act_bytes, tp, ones, tiers), 0.0)
    ag = np.where(tp > 1, all_gather_s(act_bytes, tp, ones, tiers), 0.0)  # = one reduce-scatter
    with_sp = sp > 0
    tp_on = np.where(tp > 1, 1.0, 0.0)
    coll = {"ranks": tp, "stride": ones}
    row("tp all-reduce x2 (sp: ag + rs)", "fwd", "tp_comm", "collective", "tp", none,
        lambda: 2.0 * act_bytes * tp_on, 2.0 * ar, **coll)
    # op SAC saves the reduce-scatters' outputs (torchtitan's save list) and re-runs the all-gathers (all-reduces)
    sac_coll = np.where(is_sel, 1.0, 0.0) * op_sac
    rc_coll = np.where(with_sp, 2.0 * ag, 2.0 * ar) * sac_coll + 2.0 * ar * full_rc
    row("tp all-reduce x2 (sp: ag + rs)", "recompute", "tp_comm", "collective", "tp", none,
        lambda: 2.0 * act_bytes * tp_on * (full_rc + sac_coll), rc_coll, **coll)
    row("sp output-grad all-gather x2", "bwd-input", "tp_comm", "collective", "tp", none,
        lambda: np.where(with_sp, 2.0, 0.0) * act_bytes * tp_on, np.where(with_sp, 2.0 * ag, 0.0), **coll)
    train_frac = wl.trainable_fraction
    for name, t_col in column_parallel:
        wgrad = t_col * train_frac  # weight-grad GEMM window, averaged over trainable and frozen layers
        row(f"{name} input-grad all-reduce (sp: rs)", "bwd-input", "tp_comm", "collective", "tp", none,
            lambda: act_bytes * tp_on, np.where(with_sp, ag, ar), window_s=wgrad, **coll)
        row(f"{name} sp input all-gather", "bwd-input", "tp_comm", "collective", "tp", none,
            lambda: np.where(with_sp, 1.0, 0.0) * act_bytes * tp_on, np.where(with_sp, ag, 0.0), window_s=t_col,
            **coll)

    # ---- CP (ring attention passes K/V blocks) and EP (token dispatch + combine) ------------------------------
    kv_bytes = mbs * s * 2 * m.n_kv_heads * m.head_dim * ACT_BYTES / tp  # whole-sequence K and V of a layer
    cp_on = np.where(cp > 1, 1.0, 0.0)
    cp_fwd = np.where(cp > 1, all_gather_s(kv_bytes, cp, tp, tiers), 0.0)
    cp_coll = {"ranks": cp, "stride": tp}
    row("cp kv all-gather", "fwd", "cp_comm", "collective", "cp", none, lambda: kv_bytes * cp_on, cp_fwd,
        **cp_coll)
    row("cp kv all-gather", "recompute", "cp_comm", "collective", "cp", none, lambda: kv_bytes * cp_on * full_rc,
        cp_fwd * full_rc, **cp_coll)
    row("cp kv + dkv all-gather", "bwd-input", "cp_comm", "collective", "cp", none, lambda: 2.0 * kv_bytes * cp_on,
        2.0 * cp_fwd, **cp_coll)
    if wl.moe:
        ep_coll = {"ranks": ep, "stride": groups.expert_stride}
        def a2a_bytes() -> Arr:
            return 2.0 * ex.a2a_bytes * np.where(ep > 1, 1.0, 0.0)

        row("ep dispatch + combine", "fwd", "ep_comm", "collective", "ep", none, a2a_bytes,
            2.0 * ex.a2a_each_s, **ep_coll)
        row("ep dispatch + combine", "recompute", "ep_comm", "collective", "ep", none, lambda: a2a_bytes() * full_rc,
            2.0 * ex.a2a_each_s * full_rc, **ep_coll)
        row("ep dispatch + combine", "bwd-input", "ep_comm", "collective", "ep", none, a2a_bytes,
            2.0 * ex.a2a_each_s, **ep_coll)
    return LayerOps(tuple(rows), tiers, tokens, sp_div, full_rc, peak, eff, half, hbm_bw, attn_fwd,
                    attn_bwd_factor, ex, ceiling)
