"""Bottleneck attribution: shares sum to 1, and the splits match hand calculations on the toy system.

Toy hardware (conftest): HBM 2e12 B/s x 0.5 = 1e12 B/s achieved; scale-up tier of 8 GPUs at 200e9 x 0.5 = 100e9 B/s
with 10 us latency; scale-out at 25e9 x 0.8 = 20e9 B/s with 20 us latency. Toy model: h = 1024, f = 4h (GELU),
vocab 1000, 8 layers, 8 heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import (
    TOY_HBM_BW,
    TOY_HBM_EFF,
    TOY_NET_BW,
    TOY_NET_EFF,
    TOY_NET_LAT,
    TOY_NVLINK_BW,
    TOY_NVLINK_EFF,
    TOY_NVLINK_LAT,
    ProblemFactory,
    toy_model,
)
from madmax_opt.analysis.attribution import (
    CATEGORIES,
    COMM_TERMS,
    EPS,
    WHOLE_TERMS,
    WORK_TERMS,
    main_bottleneck,
)
from madmax_opt.analysis.evaluator import Model, evaluate, to_records
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.model.spec import Plan
from madmax_opt.model.training import STEP_TERMS
from madmax_opt.search.space import enumerate_plans

SMALL = "tests/data/small.yaml"
B0, A0 = TOY_NVLINK_BW * TOY_NVLINK_EFF, TOY_NVLINK_LAT
B1, A1 = TOY_NET_BW * TOY_NET_EFF, TOY_NET_LAT
HBM = TOY_HBM_BW * TOY_HBM_EFF
# central differences with a relative step EPS lose ~ulp/EPS of relative precision: 1e-16 / 1e-6 ~ 1e-10
DIFF_REL = 100 * 1e-16 / EPS


def seconds(rec: dict[str, Any], category: str) -> float:
    return float(rec["bottleneck_shares"][category] * rec["step_time_s"])


def test_every_step_term_has_a_category() -> None:
    for term in STEP_TERMS:
        assert term in WHOLE_TERMS or term in WORK_TERMS or term in COMM_TERMS or term.endswith("_comm"), term
    assert set(WHOLE_TERMS.values()) <= set(CATEGORIES)


def test_shares_sum_to_one_and_lie_in_0_1_for_every_plan_of_a_space() -> None:
    problem = load_problem(SMALL)
    model = Model(problem)
    records = to_records(model, enumerate_plans(problem))
    assert len(records) > 100
    for rec in records:
        shares = rec["bottleneck_shares"]
        assert list(shares) == list(CATEGORIES)
        assert abs(sum(shares.values()) - 1.0) <= 1e-12, rec["plan"]
        assert all(0.0 <= s <= 1.0 for s in shares.values()), (rec["plan"], shares)


def test_seventy_b_records_sum_to_one_on_two_systems() -> None:
    for system in ("dgx-h100", "dc-a"):
        problem = problem_from_dict({"model": "llama2-70b", "hardware": {"system": system, "gpus": 512},
                                     "task": {"seq_len": 4096, "global_batch": 512}})
        plans = enumerate_plans(problem)
        records = to_records(Model(problem), plans.take(np.arange(0, len(plans), 37)))
        for rec in records:
            assert abs(sum(rec["bottleneck_shares"].values()) - 1.0) <= 1e-12


def test_single_gpu_memory_bound_part_by_hand(make_problem: ProblemFactory) -> None:
    """One GPU, no communication: compute + hbm_bandwidth = compute + optimizer terms; the HBM part by hand."""
    problem = make_problem(gpus=1, global_batch=4, seq_len=1024)
    rec = evaluate(problem, [Plan(dp=1, mbs=2)])[0]
    h, f, vocab, layers, tokens, n_micro = 1024, 4096, 1000, 8, 2 * 1024, 2
    # per token per layer, forward (workload.lower): 2 norms (read + write 2h B each) + 2 residual adds (read 2h,
    # write h) = 2 B x (4h + 6h) = 20h B; GELU reads and writes f: 2 B x 2f = 4f B. Backward moves twice that.
    layer_bytes = 3 * tokens * (20 * h + 4 * f)
    embedding_bytes = tokens * h * 2 * 3  # fwd write, bwd read + accumulate, bf16
    head_bytes = tokens * vocab * 4 * 3  # fp32 logits: write, softmax read, gradient write
    memory_bound_s = n_micro * (layers * layer_bytes + embedding_bytes + head_bytes) / HBM
    t = rec["time_breakdown_s"]
    assert seconds(rec, "hbm_bandwidth") == pytest.approx(memory_bound_s + t["optimizer"], rel=DIFF_REL)
    assert seconds(rec, "compute") == pytest.approx(t["compute"] - memory_bound_s, rel=DIFF_REL)
    for c in ("intra_node_comm", "inter_node_comm", "pipeline_bubble", "memory_capacity", "overhead"):
        assert rec["bottleneck_shares"][c] == 0.0, c
    larger = "hbm_bandwidth" if memory_bound_s + t["optimizer"] > t["compute"] - memory_bound_s else "compute"
    assert main_bottleneck(rec["bottleneck_shares"]) == larger


def test_a_data_parallel_all_reduce_over_two_nodes_splits_by_tier_by_hand(make_problem: ProblemFactory) -> None:
    """dp = 16 over two 8-GPU nodes, nothing overlapped: the hierarchical ring all-reduce of S bytes costs
    2 (7/8) S / B0 + a0 inside the nodes and 2 (1/2) (S/8) / B1 + a1 between them (collectives module docstring)."""
    problem = make_problem(gpus=16, global_batch=16, seq_len=1024, dp_overlap=False)
    rec = evaluate(problem, [Plan(dp=16, mbs=1)])[0]
    d = rec["time_breakdown_s"]["dp_comm"]
    assert d > 0
    s_bytes = (d - A0 - A1) / (2 * 7 / 8 / B0 + 2 * 1 / 2 / 8 / B1)  # the gradient bytes this all-reduce moved
    intra = 2 * 7 / 8 * s_bytes / B0 + A0
    inter = 2 * 1 / 2 * (s_bytes / 8) / B1 + A1
    assert seconds(rec, "intra_node_comm") == pytest.approx(intra, rel=DIFF_REL)
    assert seconds(rec, "inter_node_comm") == pytest.approx(inter, rel=DIFF_REL)


def test_group_placement_decides_intra_or_inter(make_problem: ProblemFactory) -> None:
    """tp = 8 fills a node (all intra-node); its dp = 2 peers sit 8 ranks apart, in the other node (all inter)."""
    problem = make_problem(gpus=16, global_batch=16, seq_len=1024, dp_overlap=False)
    rec = evaluate(problem, [Plan(dp=2, tp=8, mbs=1)])[0]
    t = rec["time_breakdown_s"]
    assert t["tp_comm"] > 0 and t["dp_comm"] > 0
    assert seconds(rec, "intra_node_comm") == pytest.approx(t["tp_comm"], rel=1e-12)
    assert seconds(rec, "inter_node_comm") == pytest.approx(t["dp_comm"], rel=1e-12)


def test_recompute_and_zero3_are_memory_capacity_and_the_bubble_is_its_own(make_problem: ProblemFactory) -> None:
    problem = make_problem(gpus=16, global_batch=16, seq_len=1024)
    zero3, piped = evaluate(problem, [Plan(dp=16, mbs=1, zero=3, recompute="full"), Plan(dp=4, tp=2, pp=2, mbs=1)])
    t = zero3["time_breakdown_s"]
    assert t["recompute"] > 0 and t["zero3_comm"] > 0
    assert seconds(zero3, "memory_capacity") == pytest.approx(t["recompute"] + t["zero3_comm"], rel=1e-12)
    assert seconds(piped, "pipeline_bubble") == pytest.approx(piped["time_breakdown_s"]["bubble"], rel=1e-12)
    assert piped["time_breakdown_s"]["bubble"] > 0


def test_a_big_scale_up_domain_turns_inter_node_traffic_intra(make_problem: ProblemFactory) -> None:
    """The same dp = 16 plan on a 16-GPU NVLink domain (derive nvlink_domain = 16) has no inter-node share."""
    from madmax_opt.studies.sensitivity import variant_problem

    problem = variant_problem(make_problem(gpus=16, global_batch=16, seq_len=1024, dp_overlap=False),
                              values={"nvlink_domain": 16})
    rec = evaluate(problem, [Plan(dp=16, mbs=1)])[0]
    assert rec["bottleneck_shares"]["inter_node_comm"] == 0.0
    assert seconds(rec, "intra_node_comm") == pytest.approx(rec["time_breakdown_s"]["dp_comm"], rel=1e-12)


def test_uneven_pipeline_records_are_attributed_on_their_own_stages() -> None:
    problem = load_problem(SMALL)
    even = Plan(dp=2, tp=2, pp=2, mbs=1, zero=1, recompute="full")
    staged = even.model_copy(update={"stage_layers": [16, 16], "stage_recompute": ["full", "full"]})
    uneven = even.model_copy(update={"stage_layers": [15, 17], "stage_recompute": ["full", "none"]})
    r_even, r_staged, r_uneven = evaluate(problem, [even, staged, uneven])
    assert r_staged["bottleneck_shares"] == r_even["bottleneck_shares"]  # same plan, same numbers
    assert abs(sum(r_uneven["bottleneck_shares"].values()) - 1.0) <= 1e-12
    t = r_uneven["time_breakdown_s"]
    assert seconds(r_uneven, "memory_capacity") == pytest.approx(t["recompute"] + t["zero3_comm"], rel=1e-12)


def test_toy_model_is_the_one_described() -> None:
    m = toy_model()
    assert (m.hidden, m.ffn, m.vocab, m.layers, m.heads) == (1024, 4096, 1000, 8, 8)
