"""Collective times against hand-computed alpha-beta values on the toy system (conftest.py).

Toy tiers: scale-up domain of 8 GPUs, B0 = 200e9 x 0.5 = 100e9 B/s, alpha0 = 10 us; scale-out B1 = 25e9 x 0.8 =
20e9 B/s, alpha1 = 20 us. Ring all-reduce of S bytes over n ranks in one tier: 2 (n-1)/n * S/B + alpha
(Thakur et al. 2005); hierarchical: reduce-scatter inside the node, all-reduce of S/8 across nodes, all-gather.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import toy_gpu, toy_system
from madmax_opt.model.collectives import (
    Tiers,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    members_per_domain,
    p2p_s,
    reduce_scatter_s,
)
from madmax_opt.model.hardware import HardwareOption, HardwareTable
from madmax_opt.model.spec import Tier

B0, A0 = 100.0e9, 10.0e-6  # 200e9 B/s x 0.5
B1, A1 = 20.0e9, 20.0e-6  # 25e9 B/s x 0.8
S = 1.0e9
REL = 1e-12


def one(x: object) -> float:
    arr = np.asarray(x, dtype=np.float64)
    assert arr.size == 1
    return float(arr.reshape(-1)[0])


def ar(n: int, stride: int, tiers: Tiers, size: float = S) -> float:
    return one(all_reduce_s(np.array([size]), np.array([float(n)]), np.array([float(stride)]), tiers))


def ag(n: int, stride: int, tiers: Tiers, size: float = S) -> float:
    return one(all_gather_s(np.array([size]), np.array([float(n)]), np.array([float(stride)]), tiers))


@pytest.mark.parametrize(
    ("n", "expected_s"),
    [
        (2, 2 * 1 / 2 * 1e9 / 100e9 + 10e-6),  # 0.01 + 10 us
        (4, 2 * 3 / 4 * 1e9 / 100e9 + 10e-6),  # 0.015 + 10 us
        (8, 2 * 7 / 8 * 1e9 / 100e9 + 10e-6),  # 0.0175 + 10 us
    ],
)
def test_ring_all_reduce_within_one_tier(toy_tiers: Tiers, n: int, expected_s: float) -> None:
    assert ar(n, 1, toy_tiers) == pytest.approx(expected_s, rel=REL)


def test_tp8_inside_a_node_has_no_inter_node_term(toy_tiers: Tiers) -> None:
    expected = 0.0175 + 10e-6  # 2 * 7/8 * 1e9 / 100e9 + alpha0, nothing from the NIC tier
    assert ar(8, 1, toy_tiers) == pytest.approx(expected, rel=REL)
    slow_nic = Tiers(toy_tiers.size, np.array([[B0], [B1 * 1e-3]]), np.array([[A0], [1.0]]))
    assert ar(8, 1, slow_nic) == pytest.approx(expected, rel=REL)


def test_dp_group_of_stride_8_over_4_nodes_uses_only_the_nic(toy_tiers: Tiers) -> None:
    # one member per node: a flat ring over the NIC, 2 * 3/4 * 1e9 / 20e9 + 20 us = 0.075 + 20 us
    assert ar(4, 8, toy_tiers) == pytest.approx(0.075 + 20e-6, rel=REL)
    slow_nvlink = Tiers(toy_tiers.size, np.array([[B0 * 1e-3], [B1]]), np.array([[1.0], [A1]]))
    assert ar(4, 8, slow_nvlink) == pytest.approx(0.075 + 20e-6, rel=REL)


def test_group_of_16_on_8_gpu_nodes_has_both_phases_with_s_over_8_outside(toy_tiers: Tiers) -> None:
    inner = 2 * 7 / 8 * 1e9 / 100e9 + 10e-6  # 0.0175 s + 10 us
    outer = 2 * 1 / 2 * (1e9 / 8) / 20e9 + 20e-6  # 0.00625 s + 20 us, on the S/8 shard
    assert ar(16, 1, toy_tiers) == pytest.approx(inner + outer, rel=REL)
    assert inner + outer == pytest.approx(0.02378, rel=REL)


def test_group_of_8_with_stride_2_has_4_members_per_node(toy_tiers: Tiers) -> None:
    k = members_per_domain(np.array([8.0]), np.array([2.0]), toy_tiers)
    assert [one(x) for x in k] == [4.0, 8.0]
    inner = 2 * 3 / 4 * 1e9 / 100e9 + 10e-6  # 0.015 s + 10 us
    outer = 2 * 1 / 2 * (1e9 / 4) / 20e9 + 20e-6  # 0.0125 s + 20 us on S/4
    assert ar(8, 2, toy_tiers) == pytest.approx(inner + outer, rel=REL)


@pytest.mark.parametrize(
    ("n", "stride", "latency"),  # one alpha per tier the group spans
    [(2, 1, A0), (8, 1, A0), (4, 8, A1), (16, 1, A0 + A1), (8, 2, A0 + A1), (64, 1, A0 + A1)],
)
def test_all_gather_is_half_the_bandwidth_part_of_all_reduce(
    toy_tiers: Tiers, n: int, stride: int, latency: float
) -> None:
    assert ag(n, stride, toy_tiers) - latency == pytest.approx((ar(n, stride, toy_tiers) - latency) / 2, rel=1e-9)


def test_all_gather_and_reduce_scatter_by_hand(toy_tiers: Tiers) -> None:
    # 16 ranks on 2 nodes: 7/8 * 1e9/100e9 + 10 us inside, 1/2 * (1e9/8)/20e9 + 20 us outside
    expected = 0.00875 + 10e-6 + 0.003125 + 20e-6
    assert ag(16, 1, toy_tiers) == pytest.approx(expected, rel=REL)
    rs = reduce_scatter_s(np.array([S]), np.array([16.0]), np.array([1.0]), toy_tiers)
    assert one(rs) == pytest.approx(expected, rel=REL)


def test_single_rank_groups_cost_nothing(toy_tiers: Tiers) -> None:
    assert ar(1, 1, toy_tiers) == 0.0
    assert ag(1, 8, toy_tiers) == 0.0


@pytest.mark.parametrize(
    ("stride", "chain", "expected_s"),
    [
        (1, 2, 1e9 / 100e9 + 10e-6),  # neighbours on one node: NVLink
        (4, 2, 1e9 / 100e9 + 10e-6),  # ranks 0 and 4: same node
        (8, 2, 1e9 / 20e9 + 20e-6),  # ranks 0 and 8: different nodes
        (2, 4, 1e9 / 100e9 + 10e-6),  # chain 0-2-4-6 inside one node
        (4, 4, 1e9 / 20e9 + 20e-6),  # chain 0-4-8-12: the hop 4 -> 8 leaves the node and sets the pace
    ],
)
def test_p2p_uses_the_innermost_tier_holding_the_whole_chain(
    toy_tiers: Tiers, stride: int, chain: int, expected_s: float
) -> None:
    t = p2p_s(np.array([S]), np.array([float(stride)]), toy_tiers, np.array([float(chain)]))
    assert one(t) == pytest.approx(expected_s, rel=REL)
    if chain == 2:  # the default chain is a single pair
        assert one(p2p_s(np.array([S]), np.array([float(stride)]), toy_tiers)) == pytest.approx(expected_s, rel=REL)


def test_all_to_all_by_hand(toy_tiers: Tiers) -> None:
    size = 1.6e9  # each rank sends 1.6e9 B in total, 1.6e9/n to every rank (itself included)
    # n = 8 in one node: 7/8 of it over NVLink, 1.4e9 / 100e9 + 10 us
    t8 = all_to_all_s(np.array([size]), np.array([8.0]), np.array([1.0]), toy_tiers)
    assert one(t8) == pytest.approx(0.014 + 10e-6, rel=REL)
    # n = 16 on 2 nodes: 7/16 over NVLink (0.7e9 / 100e9 = 7 ms), 8/16 over the NIC (0.8e9 / 20e9 = 40 ms);
    # the tiers run in parallel, so the slower one counts: 40 ms + both latencies
    t16 = all_to_all_s(np.array([size]), np.array([16.0]), np.array([1.0]), toy_tiers)
    assert one(t16) == pytest.approx(0.04 + 30e-6, rel=REL)


def test_arrays_and_scalars_agree(toy_tiers: Tiers) -> None:
    ns, strides = [8.0, 4.0, 16.0, 8.0], [1.0, 8.0, 1.0, 2.0]
    expected = [0.0175 + 10e-6, 0.075 + 20e-6, 0.02378 + 0.0, 0.0275 + 30e-6]
    k = len(ns)
    wide = Tiers(np.repeat(toy_tiers.size, k, axis=1), np.repeat(toy_tiers.bw, k, axis=1),
                 np.repeat(toy_tiers.latency_s, k, axis=1))
    vec = all_reduce_s(np.full(k, S), np.array(ns), np.array(strides), wide)
    assert vec.shape == (k,)
    assert vec == pytest.approx(expected, rel=REL)
    flat = Tiers(toy_tiers.size[:, 0], toy_tiers.bw[:, 0], toy_tiers.latency_s[:, 0])  # one plan, 1-D columns
    for n, stride, e, v in zip(ns, strides, expected, vec, strict=True):
        scalar = all_reduce_s(S, n, stride, flat)  # python floats in, a 0-d array out
        assert np.ndim(scalar) == 0
        assert float(scalar) == pytest.approx(e, rel=REL)
        assert float(scalar) == v  # bitwise: the same arithmetic
        assert float(all_gather_s(S, n, stride, flat)) == ag(int(n), int(stride), toy_tiers)
        assert float(all_to_all_s(S, n, stride, flat)) == pytest.approx(
            one(all_to_all_s(np.array([S]), np.array([n]), np.array([stride]), toy_tiers)), rel=REL
        )
    assert float(p2p_s(S, 8.0, flat)) == pytest.approx(1e9 / 20e9 + 20e-6, rel=REL)


def test_one_tier_system() -> None:
    flat = Tiers(size=np.array([[np.inf]]), bw=np.array([[20e9]]), latency_s=np.array([[20e-6]]))
    # every rank behind one switch: 2 * 15/16 * 1e9 / 20e9 + 20 us = 0.09375 + 20 us
    assert ar(16, 1, flat) == pytest.approx(0.09375 + 20e-6, rel=REL)
    assert ag(16, 1, flat) == pytest.approx(0.046875 + 20e-6, rel=REL)
    assert one(p2p_s(np.array([S]), np.array([64.0]), flat)) == pytest.approx(0.05 + 20e-6, rel=REL)
    # the same system through the hardware table (its padded copies are left out) gives the same times
    system = toy_system([Tier(name="eth", size=None, bw=25e9, latency_s=20e-6, efficiency=0.8)])
    table = HardwareTable((HardwareOption(system, toy_gpu(), 16),))
    from_table = table.tiers(np.array([0]))
    assert from_table.size.shape == (1, 1)
    assert ar(16, 1, from_table) == pytest.approx(0.09375 + 20e-6, rel=REL)
    assert one(p2p_s(np.array([S]), np.array([8.0]), from_table)) == pytest.approx(0.05 + 20e-6, rel=REL)


def test_hardware_table_padding_adds_no_phase(toy_tiers: Tiers) -> None:
    # a 3-tier system (8-GPU nodes, 32-GPU racks at 50e9 x 0.8 = 40e9 B/s, 40 us) next to the 2-tier toy system:
    # the table pads the toy system to three rows with a copy of its NVLink tier
    racks = toy_system([
        Tier(name="nvl", size=8, bw=200e9, latency_s=10e-6, efficiency=0.5),
        Tier(name="rack", size=32, bw=50e9, latency_s=40e-6, efficiency=0.8),
        Tier(name="net", size=None, bw=25e9, latency_s=20e-6, efficiency=0.8),
    ])
    table = HardwareTable((HardwareOption(toy_system(), toy_gpu(), 64), HardwareOption(racks, toy_gpu(), 64)))
    both = table.tiers(np.array([0, 1]))
    assert both.size.shape == (3, 2)
    padded = Tiers(both.size[:, :1], both.bw[:, :1], both.latency_s[:, :1])
    for n, stride in [(8, 1), (4, 8), (16, 1), (8, 2), (64, 1)]:
        assert ar(n, stride, padded) == pytest.approx(ar(n, stride, toy_tiers), rel=REL)
    assert ar(64, 1, padded) == pytest.approx(
        2 * 7 / 8 * 1e9 / 100e9 + 10e-6 + 2 * 7 / 8 * (1e9 / 8) / 20e9 + 20e-6, rel=REL
    )
    # 64 ranks on the rack system: 8 per node, 4 nodes per rack, 2 racks
    rack_tiers = Tiers(both.size[:, 1:], both.bw[:, 1:], both.latency_s[:, 1:])
    expected = (2 * 7 / 8 * 1e9 / 100e9 + 10e-6) + (2 * 3 / 4 * (1e9 / 8) / 40e9 + 40e-6) + (
        2 * 1 / 2 * (1e9 / 32) / 20e9 + 20e-6
    )
    assert ar(64, 1, rack_tiers) == pytest.approx(expected, rel=REL)
    # a table of 2-tier systems only hands out two rows: the padded copy is left out
    alone = HardwareTable((HardwareOption(toy_system(), toy_gpu(), 64),)).tiers(np.array([0]))
    assert alone.size.shape == (2, 1)
    assert ar(64, 1, alone) == ar(64, 1, padded)
