"""DLRM spec, catalog, lowering and cost model against hand-computed values.

Toy hardware (conftest.py): HBM 2e12 B/s x hbm_eff 0.5 = 1e12 B/s achieved, GEMMs at exactly 0.5 x 1e15 FLOP/s
(gemm_half_dim 0). The DLRM toy system below has 2-GPU nodes: intra-node 200e9 x 0.5 = 1e11 B/s, 10 us; inter-node
25e9 x 0.8 = 2e10 B/s, 20 us.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from cli_helpers import run_main
from conftest import toy_gpu, toy_system
from madmax_opt.core.errors import ProblemError
from madmax_opt.io.dlrm_problem import dlrm_models, dlrm_problem_from_dict
from madmax_opt.io.file_family import is_dlrm_data
from madmax_opt.model.dlrm import layout_of, lower
from madmax_opt.model.dlrm_dense import (
    STEP_TERMS,
    DensePlans,
    DenseTerms,
    dense_terms,
    step_terms,
    step_time_s,
)
from madmax_opt.model.dlrm_embedding import (
    COLLECTIVE_LANES,
    NODE,
    REMOTE,
    SELF,
    TERM_INDEX,
    TERMS,
    EmbeddingTimes,
    ShardArrays,
    embedding_options,
    embedding_times,
    per_gpu_terms,
    shard_coefficients,
    shards_from_plan,
)
from madmax_opt.model.dlrm_spec import DensePlan, DLRMModel, DLRMStack, DLRMTask, TableGroup
from madmax_opt.model.hardware import HardwareOption
from madmax_opt.model.spec import Tier

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "src" / "madmax_opt" / "data" / "dlrm.yaml"
W0, A0 = 1e11, 10e-6  # intra-node: 200e9 x 0.5, latency
W1, A1 = 2e10, 20e-6  # inter-node: 25e9 x 0.8
HBM = 1e12  # toy GPU: 2e12 x 0.5


def toy_option(gpus: int, node: int = 2) -> HardwareOption:
    tiers = [Tier(name="nvl", size=node, bw=200e9, latency_s=A0, efficiency=0.5),
             Tier(name="net", size=None, bw=25e9, latency_s=A1, efficiency=0.8)]
    return HardwareOption(toy_system(tiers), toy_gpu(), gpus)


def toy_model(tables: list[TableGroup] | None = None, **fields: Any) -> DLRMModel:
    base: dict[str, Any] = {
        "name": "toy", "tables": tables or [TableGroup(name="t", rows=1000, dim=16, pooling=4)],
        "dense_features": 16, "bottom_mlp": {"layers": 2, "width": 32}, "top_mlp": {"layers": 2, "width": 32},
        "dense_precision": "bf16",
    }
    return DLRMModel(**(base | fields))


# ============================================================================================ catalog, lowering


def test_catalog_has_the_paper_models_and_variants() -> None:
    raw = yaml.safe_load(CATALOG.read_text())  # read independently of madmax_opt's loader
    names = set(dlrm_models())
    assert names == set(raw)
    for base in ("dlrm-a", "dlrm-a-small", "dlrm-f", "dlrm-i"):
        assert {base, f"{base}-moe", f"{base}-transformer"} <= names


@pytest.mark.parametrize(
    ("name", "tables", "rows", "dim", "pooling", "layers", "width"),
    [("dlrm-a", 4096, 2_080_000, 94, 15, 10, 3994), ("dlrm-a-small", 4096, 130_000, 94, 15, 10, 3994),
     ("dlrm-f", 64, 732_000_000, 256, 20, 4, 560), ("dlrm-i", 512, 7_050_000, 92, 70, 22, 826)],
)
def test_catalog_matches_the_paper_table(name: str, tables: int, rows: int, dim: int, pooling: int, layers: int,
                                         width: int) -> None:
    m = dlrm_models()[name]
    assert m.n_tables == tables
    assert (m.tables[0].rows, m.tables[0].dim, m.tables[0].pooling) == (rows, dim, pooling)
    assert (m.bottom_mlp.layers, m.top_mlp.layers, m.bottom_mlp.width, m.top_mlp.width) == (layers, layers, width,
                                                                                            width)
    assert m.tables[0].precision == "fp16" and m.dense_precision == "fp32"


def test_dlrm_a_parameter_count_matches_the_paper() -> None:
    """Paper: ~801 B parameters, ~800.9 B of them embeddings."""
    wl = lower(dlrm_models()["dlrm-a"])
    assert wl.model.embedding_params == 4096 * 2_080_000 * 94  # 800.9 B
    assert abs(wl.model.embedding_params - 800.9e9) < 0.1e9  # 800.85 B: "~800.9 B" in the paper
    assert 0.1e9 < wl.dense_params < 0.5e9
    assert 800.9e9 < wl.params < 801.5e9


def test_lowering_shapes_by_hand() -> None:
    """DLRM-A: bottom 512 -> 3994 x 9 -> 94; compress 4097 -> 90 features; dot: 90*89/2 + 94 = 4099 top inputs."""
    wl = lower(dlrm_models()["dlrm-a"])
    bottom = [g for g in wl.gemms if g.block == "bottom"]
    assert [(g.k, g.n) for g in bottom] == [(512, 3994)] + [(3994, 3994)] * 8 + [(3994, 94)]
    compress = next(g for g in wl.gemms if g.name == "compress")
    assert (compress.k, compress.n, compress.tokens) == (4097, 90, 94)
    assert wl.interaction_out == 90 * 89 // 2 + 94 == 4099
    top = [g for g in wl.gemms if g.block == "top"]
    assert [(g.k, g.n) for g in top] == [(4099, 3994)] + [(3994, 3994)] * 8 + [(3994, 1)]
    assert wl.interaction_flops_per_sample == 2 * 90 * 90 * 94


def test_moe_and_transformer_variants() -> None:
    moe = lower(dlrm_models()["dlrm-i-moe"])
    plain = lower(dlrm_models()["dlrm-i"])
    experts = [g for g in moe.gemms if g.expert]
    assert len(experts) == 21  # 22 top layers, the final logit stays dense
    expert_layer_params = sum(g.params for g in experts)
    assert moe.expert_params == 16 * expert_layer_params
    routers = [g for g in moe.gemms if g.name.startswith("router")]
    assert [(g.k, g.n) for g in routers] == [(g.k, 16) for g in experts]
    # active FLOPs: top-2 of the experts + routers vs. the dense top MLP
    extra = sum(g.flops_per_sample for g in experts) + sum(g.flops_per_sample for g in routers)
    assert moe.dense_fwd_flops_per_sample == pytest.approx(plain.dense_fwd_flops_per_sample + extra)
    tf = lower(dlrm_models()["dlrm-a-transformer"])
    seq = [g for g in tf.gemms if g.name.startswith("seq")]
    # input projection 94 -> 512 plus 4 layers of qkv, proj, up, down on 80 tokens
    assert len(seq) == 1 + 4 * 4
    qkv = next(g for g in seq if g.name == "seq0_qkv")
    assert (qkv.k, qkv.n, qkv.tokens) == (512, 1536, 80)
    assert tf.attn_flops_per_sample == 4 * 4.0 * 80 * 80 * 512
    assert tf.interaction_out == 4099 + 512


def test_dot_interaction_needs_equal_dims() -> None:
    with pytest.raises(ValueError, match="one embedding dim"):
        toy_model([TableGroup(name="a", rows=10, dim=8, pooling=1), TableGroup(name="b", rows=10, dim=16, pooling=1)])


# ============================================================================================ embedding terms


def test_table_wise_coefficients_by_hand() -> None:
    """R=1000, d=16, fp16 (e=2), P=4, int64 ids; B=64 on N=4 GPUs in 2 nodes: b=16 samples per GPU."""
    t = TableGroup(name="t", rows=1000, dim=16, pooling=4)
    lay = layout_of(toy_option(4), DLRMStack())
    c = shard_coefficients(t, "table_wise", 1, DLRMTask(global_batch=64), lay)

    def at(term: str, rel: int) -> float:
        return float(c[TERM_INDEX[term], rel])

    # forward: 64 samples x (4 rows x (32 B + 8 B id) + 32 B pooled write) = 12,288 B
    assert at("lookup_fwd", SELF) == pytest.approx(12_288 / HBM)
    # backward: 64 x (4 x (read + write 32 B + 8 B rowwise state + 8 B id) + 32 B grad read) = 22,528 B
    assert at("lookup_bwd", SELF) == pytest.approx(22_528 / HBM)
    # rows 1000 x (32 B + 4 B state) + pooled out and grad 2 x 64 x 32 B + ids 64 x 4 x 8 B
    assert at("memory", SELF) == pytest.approx(36_000 + 4_096 + 2_048)
    assert at("lookup_fwd", NODE) == at("lookup_fwd", REMOTE) == 0.0
    ids = 16 * (4 * 8 + 4)  # one GPU's ids + lengths of this table: 576 B
    pooled = 16 * 32  # one GPU's pooled rows: 512 B
    assert at("tw_in.recv_intra", SELF) == pytest.approx(1 * ids / W0)
    assert at("tw_in.recv_inter", SELF) == pytest.approx(2 * ids / W1)
    assert at("tw_in.send_intra", NODE) == pytest.approx(ids / W0)
    assert at("tw_in.send_inter", REMOTE) == pytest.approx(ids / W1)
    assert at("tw_out.send_intra", SELF) == pytest.approx(1 * pooled / W0)
    assert at("tw_out.send_inter", SELF) == pytest.approx(2 * pooled / W1)
    assert at("tw_out.recv_intra", NODE) == pytest.approx(pooled / W0)
    assert at("tw_out.recv_inter", REMOTE) == pytest.approx(pooled / W1)


def test_inference_memory_by_hand() -> None:
    """Serving keeps no optimizer state and no gradient buffers: rows + pooled output + ids only."""
    t = TableGroup(name="t", rows=1000, dim=16, pooling=4)
    lay = layout_of(toy_option(4), DLRMStack())
    task = DLRMTask(global_batch=64, kind="inference")
    tw = shard_coefficients(t, "table_wise", 1, task, lay)
    assert tw[TERM_INDEX["memory"], SELF] == pytest.approx(1000 * 32 + 64 * 32 + 64 * 4 * 8)
    dp = shard_coefficients(t, "data_parallel", 1, task, lay)
    assert dp[TERM_INDEX["memory"], SELF] == pytest.approx(1000 * 32 + 16 * 32 + 16 * 4 * 8)


def test_column_and_table_row_wise_coefficients_by_hand() -> None:
    t = TableGroup(name="t", rows=1000, dim=16, pooling=4)
    lay = layout_of(toy_option(4), DLRMStack())
    task = DLRMTask(global_batch=64)
    cw = shard_coefficients(t, "column_wise", 2, task, lay)
    # one of two column shards: 8 columns, 16 B rows: 64 x (4 x (16 + 8) + 16) B forward
    assert cw[TERM_INDEX["lookup_fwd"], SELF] == pytest.approx(64 * (4 * 24 + 16) / HBM)
    assert cw[TERM_INDEX["cw_out.send_inter"], SELF] == pytest.approx(2 * 16 * 16 / W1)
    assert cw[TERM_INDEX["cw_in.send_inter"], REMOTE] == pytest.approx(16 * 36 / W1)  # ids go to every shard
    tr = shard_coefficients(t, "table_row_wise", 1, task, lay)
    # rows split over the node's 2 GPUs: each gathers half of the 64 x 4 lookups, writes 64 partial sums
    assert tr[TERM_INDEX["lookup_fwd"], NODE] == pytest.approx(64 * (4 * 40 / 2 + 32) / HBM)
    assert tr[TERM_INDEX["memory"], NODE] == pytest.approx(500 * 36 + 2 * 64 * 32 + 64 * 4 * 8 / 2)
    # intra-node reduce-scatter of 64 partial pooled rows: each GPU sends (2-1) x 32 rows x 32 B
    assert tr[TERM_INDEX["twrw_out_intra.send_intra"], NODE] == pytest.approx(32 * 32 / W0)
    # each node GPU then holds B/G = 32 reduced rows; the 16 of its peer in the other node go inter-node
    assert tr[TERM_INDEX["twrw_out_inter.send_inter"], NODE] == pytest.approx(1 * 16 * 32 / W1)
    assert tr[TERM_INDEX["twrw_out_inter.recv_inter"], REMOTE] == pytest.approx(16 * 32 / W1)


def test_balanced_collectives_equal_the_collectives_module() -> None:
    """Independent check of the lane model: one identical table-wise table per GPU is a balanced all-to-all; one
    row-wise table is a reduce-scatter; one data-parallel table is an all-reduce (hand-computed alpha-beta)."""
    t = TableGroup(name="t", count=4, rows=1000, dim=16, pooling=4)
    model = toy_model([t])
    lay = layout_of(toy_option(4), DLRMStack())
    task = DLRMTask(global_batch=64)
    opts = embedding_options(model, task, lay)
    tw = opts.index(0, "table_wise")
    times = embedding_times(opts, ShardArrays(np.full(4, tw), np.arange(4), np.ones(4, dtype=np.int64)), lay)
    # all-to-all of S = N x b x d x e = 2048 B per GPU: max(1/4 S / W0, 2/4 S / W1) + both latencies
    assert times.per_collective_s["tw_out"] == pytest.approx(max(512 / W0, 1024 / W1) + A0 + A1)
    # ids: every GPU receives 3 x 576 B (1 intra, 2 inter) and sends the same
    assert times.per_collective_s["tw_in"] == pytest.approx(max(576 / W0, 2 * 576 / W1) + A0 + A1)
    rw = opts.index(0, "row_wise")
    times = embedding_times(opts, ShardArrays(np.array([rw]), np.array([-1]), np.array([4])), lay)
    # hierarchical reduce-scatter of B x d x e = 2048 B: (1/2) 2048 / W0 + (1/2)(1024) / W1 + latencies, x 4 tables
    assert times.per_collective_s["rw_out"] == pytest.approx(4 * (1024 / W0 + 512 / W1) + A0 + A1)
    dp = opts.index(0, "data_parallel")
    times = embedding_times(opts, ShardArrays(np.array([dp]), np.array([-1]), np.array([1])), lay)
    # ring all-reduce of 32,000 B: 2 (1/2) S / W0 + 2 (1/2) (S/2) / W1 + latencies
    assert times.dp_allreduce_s == pytest.approx(32_000 / W0 + 16_000 / W1 + A0 + A1)


def test_per_gpu_terms_match_a_naive_loop() -> None:
    """The node-sum formulation (what CP-SAT sees) equals a plain loop over shards and GPUs."""
    rng = np.random.default_rng(7)
    tables = [TableGroup(name=f"t{i}", count=3, rows=int(rng.integers(100, 10_000)), dim=16,
                         pooling=float(rng.integers(1, 30))) for i in range(3)]
    model = toy_model(tables)
    lay = layout_of(toy_option(8, node=4), DLRMStack())
    opts = embedding_options(model, DLRMTask(global_batch=256), lay)
    rows = []
    for o, opt in enumerate(opts.options):
        for _ in range(2):
            loc = {"gpu": int(rng.integers(8)), "node": int(rng.integers(2)), "global": -1}[opt.located]
            rows.append((o, loc, int(rng.integers(1, 4))))
    arr = np.array(rows)
    shards = ShardArrays(arr[:, 0], arr[:, 1], arr[:, 2])
    expected = np.zeros((len(TERMS), 8))
    for o, loc, k in rows:
        opt = opts.options[o]
        for g in range(8):
            if opt.located == "global":
                rel = SELF
            elif opt.located == "node":
                rel = NODE if g // 4 == loc else REMOTE
            else:
                rel = SELF if g == loc else (NODE if g // 4 == loc // 4 else REMOTE)
            expected[:, g] += k * opts.coef[o, :, rel]
    assert np.allclose(per_gpu_terms(opts.coef, opts.options, shards, lay), expected, rtol=1e-12, atol=0)


def test_plan_placement_is_checked() -> None:
    model = toy_model([TableGroup(name="t", count=4, rows=1000, dim=16, pooling=4)])
    lay = layout_of(toy_option(4), DLRMStack())
    opts = embedding_options(model, DLRMTask(global_batch=64), lay)
    from madmax_opt.model.dlrm_spec import ShardEntry

    ok = [ShardEntry(group="t", count=3, sharding="table_wise", gpus=[1]),
          ShardEntry(group="t", sharding="column_wise", gpus=[0, 3])]
    shards = shards_from_plan(ok, model, opts, lay)
    assert sorted(zip(shards.location.tolist(), shards.count.tolist(), strict=True)) == [(0, 1), (1, 3), (3, 1)]
    with pytest.raises(ProblemError, match="holds 3"):
        shards_from_plan(ok[:1], model, opts, lay, file="p.yaml")
    with pytest.raises(ProblemError, match=r"placement\[0\].gpus: GPU 9 does not exist; allowed: 0..3"):
        shards_from_plan([ShardEntry(group="t", count=4, sharding="table_wise", gpus=[9])], model, opts, lay,
                         file="p.yaml")
    with pytest.raises(ProblemError, match="unknown table group 'x'"):
        shards_from_plan([ShardEntry(group="x", count=4, sharding="row_wise")], model, opts, lay)


# ================================================================================================= dense part


def test_dense_times_by_hand() -> None:
    """Toy model, 4 GPUs, B = 64 (b = 16), bf16: GEMMs at 5e14 FLOP/s, ReLU traffic at 1e12 B/s."""
    model = toy_model([TableGroup(name="t", count=3, rows=1000, dim=8, pooling=4)])
    wl = lower(model)
    task = DLRMTask(global_batch=64)
    lay = layout_of(toy_option(4), DLRMStack())
    dt = dense_terms(wl, task, DLRMStack(), lay, DensePlans.of([DensePlan(strategy="ddp")]))
    # bottom: 16 -> 32 -> 8 (the embedding dim): 2 x (16x32 + 32x8) FLOPs per sample; ReLU 2 x 2 B x (32 + 8)
    bottom = 16 * 2 * (16 * 32 + 32 * 8) / 5e14 + 16 * 2 * 2 * (32 + 8) / 1e12
    assert dt.bottom_fwd_s[0] == pytest.approx(bottom)
    assert dt.bottom_bwd_s[0] == pytest.approx(2 * bottom)
    # dot over F = 3 tables + 1 = 4 vectors of dim 8: 2 x 4 x 4 x 8 FLOPs; top input 4*3/2 + 8 = 14 -> 32 -> 1
    inter = 16 * 2 * 4 * 4 * 8 / 5e14
    top = 16 * 2 * (14 * 32 + 32 * 1) / 5e14 + 16 * 2 * 2 * (32 + 1) / 1e12
    assert dt.top_fwd_s[0] == pytest.approx(inter + top)
    # DDP: ring all-reduce of fp32 gradients of every dense parameter (weights + biases), 2 nodes of 2
    params = (16 * 32 + 32) + (32 * 8 + 8) + (14 * 32 + 32) + (32 * 1 + 1)
    grads = 4.0 * params
    assert dt.sync_s[0] == pytest.approx(grads / W0 + grads / 2 / W1 + A0 + A1)
    # Adam, mixed precision: 34 B of traffic per parameter; memory 18 B per parameter + stored activations
    assert dt.optimizer_s[0] == pytest.approx(34 * params / 1e12)
    assert dt.memory["weights"][0] + dt.memory["optimizer_and_grads"][0] == pytest.approx(18 * params)


def test_fsdp_and_tp_collectives_by_hand() -> None:
    model = toy_model([TableGroup(name="t", count=3, rows=1000, dim=8, pooling=4)])
    wl = lower(model)
    task = DLRMTask(global_batch=64)
    lay = layout_of(toy_option(4), DLRMStack())
    dt = dense_terms(wl, task, DLRMStack(), lay, DensePlans.of([DensePlan(strategy="fsdp"),
                                                                DensePlan(strategy="ddp", tp=2)]))
    params = (16 * 32 + 32) + (32 * 8 + 8) + (14 * 32 + 32) + (32 * 1 + 1)
    # FSDP forward: all-gather of the bf16 weights, one gather per layer (4 units): (1/2) S / W0 + (1/2) S/2 / W1
    s = 2.0 * params
    assert dt.fsdp_fwd_s[0] == pytest.approx(s / 2 / W0 + s / 4 / W1 + 4 * (A0 + A1))
    # TP 2 (inside a node): bottom pair 16->32 (column), 32->8 (row): fwd all-reduce of the row GEMM output over
    # 2 GPUs (t x b = 32 samples x 8 x 2 B), bwd all-reduce of the column GEMM input grad (32 x 16 x 2 B); the block
    # input is gathered (32 x 16 x 2 B over 2) and its grad scattered. Same for the top pair 14->32, 32->1.
    ar = lambda n_bytes: n_bytes / W0 + A0  # noqa: E731 - ring all-reduce over 2 GPUs of one node
    ag = lambda n_bytes: n_bytes / 2 / W0 + A0  # noqa: E731
    bottom = ar(32 * 8 * 2) + ar(32 * 16 * 2) + 2 * ag(32 * 16 * 2)
    top = ar(32 * 1 * 2) + ar(32 * 14 * 2) + 2 * ag(32 * 14 * 2)
    assert dt.tp_comm_s[1] == pytest.approx(bottom + top)


def test_step_assembly_overlaps_by_hand() -> None:
    """Forward: Lf + max(Cin + Cout, Bf) + Tf; backward: Tb + max(Cout, Bb) + Lb; DDP sync behind the rest."""
    one = np.ones(1)
    dense = DenseTerms(bottom_fwd_s=3.0 * one, bottom_bwd_s=6.0 * one, top_fwd_s=2.0 * one, top_bwd_s=4.0 * one,
                       tp_comm_s=0 * one, moe_a2a_s=0 * one, sync_s=20.0 * one, fsdp_fwd_s=0 * one,
                       optimizer_s=1.0 * one, memory={"weights": one}, invalid=np.zeros(1, dtype=np.int64),
                       fwd_flops_per_gpu=one)
    emb = EmbeddingTimes(lookup_fwd_s=1.0, lookup_bwd_s=2.0, input_s=1.0, output_s=5.0, dp_allreduce_s=0.5,
                         per_collective_s={c: 0.0 for c in COLLECTIVE_LANES}, memory_bytes=one, totals=one)
    t, hidden = step_terms(dense, emb, DLRMStack(), DLRMTask(global_batch=8))
    assert t["a2a_fwd"][0] == 1.0 + 5.0 - 3.0  # id + pooled all-to-all beyond the bottom MLP forward
    assert t["a2a_bwd"][0] == 5.0 - 6.0 + 1.0 == 0.0  # the gradient all-to-all hides behind the bottom backward
    # sync 20 + 0.5 against the comm-free backward time: Tb 4 + (Bb 6 - Cgrad 5) + Lb 2 = 7
    assert t["grad_sync"][0] == pytest.approx(20.5 - 7.0)
    assert step_time_s(t)[0] == pytest.approx(1 + 3 + 3 + 2 + 4 + 6 + 0 + 2 + 13.5 + 1)
    assert hidden["a2a_bwd"][0] == 5.0
    piped = step_terms(dense, emb, DLRMStack(pipeline_input_dist=True), DLRMTask(global_batch=8))[0]
    assert piped["a2a_fwd"][0] == 5.0 - 3.0  # the id all-to-all ran during the previous step's top MLP
    inference = step_terms(dense, emb, DLRMStack(), DLRMTask(global_batch=8, kind="inference"))[0]
    assert inference["lookup_bwd"][0] == inference["a2a_bwd"][0] == inference["grad_sync"][0] == 0.0


# ============================================================================================ problem files


def test_detection_and_loading() -> None:
    assert is_dlrm_data({"model": "dlrm-a"}) and is_dlrm_data({"model": {"family": "dlrm"}})
    assert not is_dlrm_data({"model": "llama2-70b"}) and not is_dlrm_data([])
    p = dlrm_problem_from_dict({"model": "dlrm-i", "hardware": {"system": "zionex", "gpus": [64, 128]},
                                "task": {"global_batch": 65536}})
    assert [o.gpus for o in p.hardware] == [64, 128]
    lay = layout_of(p.hardware[1], p.stack)
    assert (lay.gpus, lay.node, lay.nodes) == (128, 8, 16)
    assert lay.capacity_bytes == pytest.approx(40 * 2**30 * 0.95)


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        ({"model": "dlrm-z", "hardware": {"system": "zionex", "gpus": 8}, "task": {"global_batch": 8}},
         ["model: unknown DLRM model 'dlrm-z'; allowed: dlrm-a"]),
        ({"model": "dlrm-a", "hardware": {"system": "zionex", "gpus": 12}, "task": {"global_batch": 8}},
         ["hardware.gpus: 12 GPUs is not a whole number of 8-GPU nodes; allowed: multiples of 8 or at most 8"]),
        ({"model": "dlrm-a", "hardware": {"system": "zionex", "gpus": 8}, "task": {"global_batch": 8},
          "objective": "time_to_train"}, ["task.train_samples", "needs task.train_samples"]),
        ({"model": "dlrm-a", "hardware": {"system": "zionex", "gpus": 8}, "task": {"global_batch": 8},
          "space": {"shardings": ["diagonal"]}}, ["space.shardings[0]", "allowed: one of {table_wise"]),
        ({"model": "dlrm-a", "hardware": {"system": "zionex", "gpus": 8}, "task": {"global_batch": 8},
          "baseline": {"placement": [{"group": "dense", "sharding": "row_wise"}]}},
         ["baseline.placement[0].group: unknown table group 'dense'; allowed: sparse"]),
    ],
)
def test_bad_input_is_one_line(data: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(ProblemError) as err:
        dlrm_problem_from_dict(data, source="p.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("p.yaml: ")
    for f in fragments:
        assert f in msg, msg


# ===================================================================================================== CLI




def test_cli_solve_and_evaluate(tmp_path: Path) -> None:
    problem = tmp_path / "p.yaml"
    problem.write_text(yaml.safe_dump({
        "model": "dlrm-a-small", "hardware": {"system": "zionex", "gpus": 16},
        "task": {"global_batch": 4096}, "space": {"dense": "ddp", "tp": 1},
    }))
    res = run_main("solve", problem, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    best = out["best"]
    assert best["feasible"] and best["plan"]["dense"] == {"strategy": "ddp", "tp": 1, "ep": 1}
    assert best["memory_bytes_per_gpu"]["total"] <= best["memory_bytes_per_gpu"]["capacity"]
    assert sum(e["count"] for e in best["plan"]["placement"]) >= 1
    # the solver's plan, evaluated back through `evaluate`, gives the same step time
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(best["plan"]))
    ev = run_main("evaluate", problem, "--plan", plan, "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-12)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**best["plan"], "placement": [{"group": "sparse", "count": 1,
                                                                  "sharding": "table_wise", "gpus": [99]}]}))
    res = run_main("evaluate", problem, "--plan", bad)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "bad.yaml: placement[0].gpus: GPU 99 does not exist" in res.stderr


def test_shipped_dlrm_problems_load_and_the_plan_evaluates() -> None:
    from madmax_opt.io.dlrm_problem import load_dlrm_plans, load_dlrm_problem
    from madmax_opt.search.dlrm_search import evaluate_dlrm

    folder = ROOT / "problems" / "dlrm"
    problems = sorted(p for p in folder.glob("dlrm-*.yaml"))
    assert len(problems) >= 3
    for path in problems:
        assert load_dlrm_problem(path).model.name.startswith("dlrm-")
    zionex = load_dlrm_problem(folder / "dlrm-a-zionex.yaml")
    rec = evaluate_dlrm(zionex, load_dlrm_plans(folder / "plan-dlrm-a-mixed.yaml"))[0]
    # 4064 tables x 2.08 M rows / 8 GPUs x (188 B + 4 B state) = 203 GB of rows per GPU of node 0: infeasible
    assert not rec["feasible"] and "exceeds usable capacity" in rec["infeasible_reason"]
    assert rec["memory_bytes_per_gpu"]["embedding_max"] > 4064 * 2.08e6 / 8 * 192


def test_dense_terms_of_one_plan_equal_its_row() -> None:
    """DenseTerms.take(i), the row search_option evaluates, equals dense_terms of plan i alone to the bit (every
    catalog model, training and inference, 8-512 GPUs, every dense plan of the default space)."""
    from madmax_opt.model.dlrm_dense import enumerate_dense
    from madmax_opt.model.dlrm_spec import DLRMSpace

    checked = 0
    for name in dlrm_models():
        for gpus, kind in ((8, "train"), (96, "inference"), (512, "train")):
            p = dlrm_problem_from_dict({"model": name, "hardware": {"system": "zionex", "gpus": gpus},
                                        "task": {"global_batch": 61440 * 4, "kind": kind}})
            lay = layout_of(p.hardware[0], p.stack)
            plans = enumerate_dense(DLRMSpace(), p.model, lay)
            every = dense_terms(lower(p.model), p.task, p.stack, lay, plans)
            for i in range(len(plans)):
                one = DensePlans(plans.strategy[i:i + 1], plans.tp[i:i + 1], plans.ep[i:i + 1])
                alone, row = dense_terms(lower(p.model), p.task, p.stack, lay, one), every.take(i)
                for field in DenseTerms.__dataclass_fields__:
                    a, b = getattr(alone, field), getattr(row, field)
                    pairs = [(a[k], b[k]) for k in a] if field == "memory" else [(a, b)]
                    for x, y in pairs:
                        assert x.tobytes() == y.tobytes(), (name, gpus, i, field)
                checked += 1
    assert checked >= 100


def test_step_time_of_one_plan_is_bitwise_its_value_in_a_batch() -> None:
    """The 13 step terms are added left to right, so a plan priced alone (the baseline, evaluate) rounds exactly as
    the same plan inside the search's batch (np.sum over 13 terms rounded them pairwise for one plan)."""
    rng = np.random.default_rng(0)
    time = {k: rng.uniform(0.0, 0.1, 200) * 10.0 ** rng.integers(-3, 1, 200) for k in STEP_TERMS}
    batch = step_time_s(time)
    alone = np.array([step_time_s({k: v[i:i + 1] for k, v in time.items()})[0] for i in range(200)])
    assert np.array_equal(alone, batch)
