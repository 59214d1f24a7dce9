"""Physical invariants of the serving, online serving and DLRM families (hypothesis; issue 24): decode never beats its HBM floor (every dense
weight read once per step at the datasheet bandwidth) nor its per-step host floor (the pair's fixed time per layer
pass, every layer once per token); longer prompts / outputs and deeper models never make a plan faster; more GPU
options never worsen the optimum of any objective; a GPU at least as good on every datasheet figure never serves a
plan slower, at any calibration level (model/serving_calibration.ordered).

Floors are computed here from the catalog model's dimensions and the GPU datasheet (data/models.yaml, gpus.yaml),
not from the serving model's own byte counts. Training's invariants: test_invariants.py, _dominance.py."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madmax_opt.io import catalog
from madmax_opt.io.dlrm_problem import dlrm_problem_from_dict
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.io.serving_catalog import serving_catalog
from madmax_opt.model.hardware_spec import System, dominates
from madmax_opt.model.queueing import max_rate, service_table
from madmax_opt.model.serving_calibration import SERVING_PEAKS
from madmax_opt.search.dlrm_search import dlrm_solve_result, objective_value
from madmax_opt.search.online import online_plans, solve_online
from madmax_opt.search.serving_space import ServingCandidates, ServingModel, candidates, enumerate_serving

PROPERTY = settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-9
FRAMEWORKS = ["vllm", "tensorrt-llm", "sglang", "atom"]
DENSE = ["llama3-8b", "llama3-70b", "llama2-70b", "mistral-7b"]
GPUS = ["h100-sxm", "h200-sxm", "b200", "a100-80gb", "mi300x"]
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0}


def serving(model: str | dict[str, Any], gpu: str, framework: str, precision: str, gpus: list[int] | None = None,
            system: dict[str, Any] | None = None, **task: Any) -> ServingModel:
    hardware = {"gpu": gpu} if system is None else {"system": system}
    return ServingModel(problem_from_dict({
        "model": model, "hardware": {**hardware, "gpus": gpus or [8]},
        "task": {"kind": "inference", "prompt_len": 1024, "output_len": 256, "precision": precision, **task},
        "stack": {"framework": framework}}))


def dense_params(name: str) -> float:
    """Weights of a dense catalog model from its dimensions: attention (Q, K, V, O), the MLP, embedding and head."""
    m = catalog.models()[name]
    dh = m.hidden // m.heads
    attention = m.hidden * (m.heads + 2 * m.kv_heads) * dh + m.heads * dh * m.hidden
    mlp = (3 if m.ffn_kind == "swiglu" else 2) * m.hidden * m.ffn
    return float(m.layers * (attention + mlp) + (1 if m.tied_embeddings else 2) * m.vocab * m.hidden)


def precision_for(gpu: str, precision: str) -> str:
    return precision if precision in catalog.gpus()[gpu].peak_flops else "bf16"


@PROPERTY
@given(model=st.sampled_from(DENSE), gpu=st.sampled_from(GPUS), framework=st.sampled_from(FRAMEWORKS),
       precision=st.sampled_from(["bf16", "fp8"]))
def test_decode_never_beats_its_hbm_and_host_floors(model: str, gpu: str, framework: str, precision: str) -> None:
    precision = precision_for(gpu, precision)
    sm = serving(model, gpu, framework, precision)
    c = candidates(sm)
    ok = c.valid
    # every decode step reads each GPU's weight shard once (the head's vocab shard included): params / tp / pp per
    # stage, the stages one after another for a token; the embedding table is a lookup, not a read (lower bound)
    m = catalog.models()[model]
    streamed = dense_params(model) - m.vocab * m.hidden
    hbm_floor_s = streamed * WEIGHT_BYTES[precision] / c.plans.tp / catalog.gpus()[gpu].hbm_bw
    params, _, _ = serving_catalog().resolve(gpu, framework)
    host_floor_s = m.layers * params.layer_overhead_s
    assert np.all(c.terms.tpot_s[ok] >= hbm_floor_s[ok] * (1 - TOL))
    assert np.all(c.terms.tpot_s[ok] >= host_floor_s * (1 - TOL))


@PROPERTY
@given(model=st.sampled_from(["mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"]),
       gpu=st.sampled_from(["h100-sxm", "h200-sxm", "b200", "mi300x"]), framework=st.sampled_from(FRAMEWORKS),
       gpus=st.sampled_from([8, 16]))
def test_moe_decode_never_beats_streaming_its_active_weights(model: str, gpu: str, framework: str, gpus: int) -> None:
    """Per step each GPU reads its shard of attention, shared experts and head, and the k experts a token is routed
    to are read somewhere: at least k / max(tp, ep) of one expert per GPU on average (the step waits for the slowest)."""
    m = catalog.models()[model]
    assert m.moe is not None
    precision = "fp8" if "fp8" in catalog.gpus()[gpu].peak_flops else "bf16"
    c = candidates(serving(model, gpu, framework, precision, [gpus]))
    ok = c.valid
    dh = m.head_dim or m.hidden // m.heads
    attention = m.hidden * (m.heads + 2 * m.kv_heads) * dh + m.heads * dh * m.hidden
    expert = 3 * m.hidden * m.moe.expert_ffn
    per_gpu = (m.layers * (attention + m.moe.shared_experts * expert) + m.vocab * m.hidden) / c.plans.tp \
        + m.layers * m.moe.top_k * expert / np.maximum(c.plans.tp, c.plans.ep)
    floor_s = per_gpu * WEIGHT_BYTES[precision] / catalog.gpus()[gpu].hbm_bw
    assert np.all(c.terms.tpot_s[ok] >= floor_s[ok] * (1 - TOL))
    host_floor_s = m.layers * serving_catalog().resolve(gpu, framework)[0].layer_overhead_s
    assert np.all(c.terms.tpot_s[ok] >= host_floor_s * (1 - TOL))


def _same_plans(small: ServingModel, big: ServingModel) -> tuple[ServingCandidates, ServingCandidates]:
    plans = enumerate_serving(small)
    return candidates(small, plans), candidates(big, plans)


def _never_faster(small: ServingCandidates, big: ServingCandidates) -> None:
    """Throughput never higher; at the same running batch, TPOT and TTFT never lower. (A bigger problem may leave
    less KV cache: the server then runs fewer sequences at once, each of them faster, the rest queued.)"""
    both = small.valid & big.valid
    assert np.all(big.terms.output_tokens_per_s[both] <= small.terms.output_tokens_per_s[both] * (1 + TOL))
    same = both & (big.terms.running_batch == small.terms.running_batch)
    assert np.all(big.terms.tpot_s[same] >= small.terms.tpot_s[same] * (1 - TOL))
    assert np.all(big.terms.ttft_s[same] >= small.terms.ttft_s[same] * (1 - TOL))


@PROPERTY
@given(model=st.sampled_from([*DENSE, "mixtral-8x7b"]), gpu=st.sampled_from(GPUS),
       framework=st.sampled_from(FRAMEWORKS), which=st.sampled_from(["prompt_len", "output_len"]))
def test_longer_requests_never_make_a_plan_faster(model: str, gpu: str, framework: str, which: str) -> None:
    base: dict[str, Any] = {"prompt_len": 1024, "output_len": 256}
    small, big = _same_plans(serving(model, gpu, framework, "bf16", **base),
                             serving(model, gpu, framework, "bf16", **{**base, which: 2 * base[which]}))
    assert np.all(big.valid <= small.valid)  # what fits the longer requests fits the shorter ones
    if which == "prompt_len":
        _never_faster(small, big)
    else:  # longer outputs amortise each prefill over more tokens: TPOT (prefill included) and tokens/s may gain
        both = small.valid & big.valid & (big.terms.running_batch == small.terms.running_batch)
        assert np.all(big.terms.decode_step_s[both] >= small.terms.decode_step_s[both] * (1 - TOL))
        e2e_small = small.terms.ttft_s + 256 * small.terms.tpot_s
        e2e_big = big.terms.ttft_s + 512 * big.terms.tpot_s
        assert np.all(e2e_big[both] >= e2e_small[both] * (1 - TOL))


@PROPERTY
@given(model=st.sampled_from(DENSE), gpu=st.sampled_from(GPUS), framework=st.sampled_from(FRAMEWORKS))
def test_deeper_models_are_never_faster(model: str, gpu: str, framework: str) -> None:
    d = catalog.models()[model].model_dump(exclude_none=True)
    deeper = {**d, "name": f"{model}-deeper", "layers": d["layers"] + 8}
    small, big = _same_plans(serving(model, gpu, framework, "bf16"), serving(deeper, gpu, framework, "bf16"))
    assert np.all(big.valid <= small.valid)
    _never_faster(small, big)


@PROPERTY
@given(model=st.sampled_from([*DENSE, "mixtral-8x7b"]), gpu=st.sampled_from(GPUS),
       framework=st.sampled_from(FRAMEWORKS), objective=st.sampled_from(["throughput", "cost", "energy"]))
def test_more_gpu_options_never_worsen_the_optimum(model: str, gpu: str, framework: str, objective: str) -> None:
    """Every objective, through its integer form (what CP-SAT minimises), under a TPOT target."""
    def best(gpus: list[int]) -> int:
        c = candidates(serving(model, gpu, framework, "bf16", gpus, tpot_s=0.05))
        ok = c.valid & (c.terms.tpot_s <= 0.05)
        return int(c.objective(objective)[ok].min()) if ok.any() else 2**62

    assert best([4, 8]) <= best([8])
    assert best([2, 4, 8]) <= best([4, 8])


# (better, worse) on every datasheet figure a serving plan is priced with, on one software platform (the one
# dominance of training and serving: an MI300X is not compared with an H200, their frameworks' builds run other
# kernels; docs/serving.md)
SERVING_PAIRS = [("h200-sxm", "h100-sxm"), ("b200", "h200-sxm"), ("gb200", "b200"), ("b300", "b200"),
                 ("h200-sxm", "h100-hbm2e-96gb"), ("mi325x", "mi300x"), ("mi355x", "mi300x")]


def interconnect_dominates(x: System, y: System) -> bool:
    """Every network tier of ``x`` at least as good as ``y``'s: a domain at least as large, achieved bandwidth
    (bw x efficiency) at least, latency at most (the figures the serving model's collectives are priced with)."""
    return len(x.tiers) == len(y.tiers) and all(
        (a.size is None or (b.size is not None and a.size >= b.size)) and a.bw * a.efficiency >= b.bw * b.efficiency
        and a.latency_s <= b.latency_s for a, b in zip(x.tiers, y.tiers, strict=True))


@PROPERTY
@given(pair=st.sampled_from(SERVING_PAIRS), framework=st.sampled_from(FRAMEWORKS),
       model=st.sampled_from([*DENSE, "mixtral-8x7b"]), own_nodes=st.booleans())
def test_a_dominating_gpu_never_serves_a_plan_slower(pair: tuple[str, str], framework: str, model: str,
                                                     own_nodes: bool) -> None:
    """Each GPU on its standard node where the better node's network is at least as good too (h200 / h100: the same
    NVLink4 tiers), else the better GPU swapped into the worse GPU's node (dgx-b200's NVLink5 all-reduce carries a
    measured 22 us fixed cost against NVLink4's 10 us, so a B200 node is not better than an H200 node on every
    figure at batch 1). Every calibration level the frameworks give these GPUs: pair fits, composed / family
    fits (atom on NVIDIA, vllm on gb200 / b300)."""
    better, worse = pair
    gpus, systems = catalog.gpus(), catalog.systems()
    assert dominates(gpus[better], gpus[worse], SERVING_PEAKS)
    worse_node = systems[str(gpus[worse].standard_system)]
    better_node = systems[str(gpus[better].standard_system)]
    if own_nodes and interconnect_dominates(better_node, worse_node):
        b_sys, w_sys = None, None
    else:
        b_sys, w_sys = {**worse_node.model_dump(), "name": f"{worse_node.name}-{better}", "gpu": better}, None
    w, b = _same_plans(serving(model, worse, framework, "bf16", system=w_sys),
                       serving(model, better, framework, "bf16", system=b_sys))
    assert np.all(b.valid >= w.valid)
    both = b.valid & w.valid
    assert np.all(b.terms.tpot_s[both] <= w.terms.tpot_s[both] * (1 + TOL))
    assert np.all(b.terms.ttft_s[both] <= w.terms.ttft_s[both] * (1 + TOL))
    assert np.all(b.terms.output_tokens_per_s[both] >= w.terms.output_tokens_per_s[both] * (1 - TOL))


# ------------------------------------------------------------------------------------------------- DLRM

DLRM_PAIRS = [("a100-80gb", "a100-40gb"), ("h100-sxm", "a100-80gb"), ("h200-sxm", "h100-sxm"), ("b200", "h200-sxm")]
DLRM_MODELS = ["dlrm-a-small", "dlrm-a-small-moe", "dlrm-a-small-transformer"]


def dlrm_best(hardware: dict[str, Any], model: str, objective: str) -> float:
    """The optimum's objective value; the comparison needs CP-SAT to have proven it."""
    problem = dlrm_problem_from_dict({"model": model, "hardware": hardware, "task": {"global_batch": 4096},
                                      "objective": objective})
    out = dlrm_solve_result(problem, 30.0, 1)
    assert out["status"] == "optimal"
    return float(objective_value(problem, out["best"]))


def zionex_with(gpu: str) -> dict[str, Any]:
    return {**catalog.systems()["zionex"].model_dump(), "name": f"zionex-{gpu}", "gpu": gpu}


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(DLRM_PAIRS), model=st.sampled_from(DLRM_MODELS),
       objective=st.sampled_from(["throughput", "cost", "energy"]), gpus=st.sampled_from([8, 16]))
def test_dlrm_dominating_gpu_more_resources_and_gpus_never_worsen_the_optimum(
        pair: tuple[str, str], model: str, objective: str, gpus: int) -> None:
    """Same system (network, price, power), the GPU swapped for one at least as good on every datasheet figure;
    the ZionEX system with twice the HBM, NVLink or NIC bandwidth or HBM capacity; a larger GPU count allowed."""
    better, worse = pair
    assert dominates(catalog.gpus()[better], catalog.gpus()[worse])
    base = dlrm_best({"system": zionex_with(worse), "gpus": gpus}, model, objective)
    assert dlrm_best({"system": zionex_with(better), "gpus": gpus}, model, objective) <= base * (1 + TOL)
    zionex = dlrm_best({"system": "zionex", "gpus": gpus}, model, objective)
    for name in ("hbm_bandwidth", "nvlink_bandwidth", "nic_bandwidth", "hbm_capacity"):
        more = dlrm_best({"derive": {"from": "zionex", "scale": {name: 2.0}}, "gpus": gpus}, model, objective)
        assert more <= zionex * (1 + TOL), name
    assert dlrm_best({"system": "zionex", "gpus": [gpus, 2 * gpus]}, model, objective) <= zionex * (1 + TOL)


# ---------------------------------------------------------------------------------- online serving (arrivals)

def online(gpus: list[int], prompt_len: int = 1024, gpu: str = "h100-sxm") -> ServingModel:
    return ServingModel(problem_from_dict({
        "model": "llama3-8b", "hardware": {"gpu": gpu, "gpus": gpus},
        "task": {"kind": "inference", "prompt_len": prompt_len, "output_len": 256, "arrival_rate": 2.0,
                 "ttft_p99_s": 0.5, "tpot_p90_s": 0.05},
        "space": {"tp": [1, 2], "pp": 1}}))


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.sampled_from([[1], [2], [1, 2]]), factor=st.sampled_from([2, 4]))
def test_online_longer_prompts_never_carry_more_and_more_gpus_never_worsen(gpus: list[int], factor: int) -> None:
    """Under the same percentile targets, a plan never sustains a higher arrival rate for longer prompts; allowing
    more GPU counts never lowers the optimum's requests per second per GPU."""
    small = online(gpus)
    plans = online_plans(small)
    targets = small.task.latency_targets()
    rate_small = max_rate(service_table(small.terms, plans, small.workload), targets)
    big = online(gpus, prompt_len=factor * 1024)
    rate_big = max_rate(service_table(big.terms, plans, big.workload), targets)
    assert np.all(np.nan_to_num(rate_big) <= np.nan_to_num(rate_small) * (1 + TOL))
    best = solve_online(small.problem)["best"]["max_rate_per_gpu"]
    assert solve_online(online(sorted({*gpus, 4})).problem)["best"]["max_rate_per_gpu"] >= best * (1 - TOL)
