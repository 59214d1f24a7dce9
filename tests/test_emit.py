"""Launch formats: every emitted flag is in the recorded flag set, every plan field maps to flags or is refused,
random plans round-trip (emit, parse back with the format's rules, same plan), and refusals are one-line errors.

Which plans a format can express is stated here independently (the frameworks' documented limits), so a format
that refuses an expressible plan, or emits an inexpressible one, fails.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import tomllib
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.launch.common import layout_layers, layout_string, parse_flags
from madmax_opt.launch.emit import (
    allowed_names,
    emit_plan,
    emitted_names,
    formats,
    formats_for,
    parse_emitted,
)
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.registry import format_names
from madmax_opt.launch.startup import CHECKS, positions_of, violations
from madmax_opt.launch.titan import llama_ffn
from madmax_opt.model.family_name import serving_task
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan
from madmax_opt.search.serving_space import ServingPlan

LAYERS, GLOBAL_BATCH = 8, 64
LLAMA = {"layers": LAYERS, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn": 2816, "ffn_kind": "swiglu",
         "norm": "rmsnorm", "vocab": 32000}
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def training_problem(model: dict[str, Any] | None = None, hardware: Any = None, precision: str = "bf16") -> Problem:
    return problem_from_dict({
        "model": model or LLAMA,
        "hardware": hardware or {"system": "dgx-h100", "gpus": SIZES},
        "task": {"kind": "pretrain", "seq_len": 1024, "global_batch": GLOBAL_BATCH, "precision": precision},
    })


SERVING = problem_from_dict({
    "model": LLAMA, "hardware": {"gpu": "h100-sxm", "gpus": {"start": 1, "stop": 128}},
    "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "precision": ["bf16", "fp8"],
             "disaggregated": True},
})
TRAINING = training_problem()
TRAINING_FORMATS = ["megatron", "nemo", "torchtitan", "deepspeed"]
SERVING_FORMATS = ["vllm", "sglang", "trtllm"]


# ------------------------------------------------------------------------------- what each format can express


def training_limits(fmt: str, p: Plan, problem: Problem) -> list[str]:
    """Why ``fmt`` cannot express ``p`` (empty: it can), from the frameworks' documented limits."""
    m, task = problem.model, problem.training_task
    uneven = p.stage_layers is not None
    out = []
    if p.stage_systems is not None and len(set(p.stage_systems)) > 1:
        out.append("mixed GPU types")
    if p.gpus > 8 and p.gpus % 8:
        out.append("partial nodes")
    if fmt in ("megatron", "nemo", "torchtitan"):
        if uneven and len(set(p.stage_recompute or [])) > 1:
            out.append("per-stage recompute")
        if not uneven and m.layers % (p.pp * p.vpp):
            out.append("layers per chunk")
    if fmt in ("megatron", "nemo", "torchtitan") and uneven and p.vpp > 1:
        out.append("uneven stages with interleaving")  # first/last-stage flags and the layout do not split chunks
    if fmt == "nemo" and task.precision in ("fp8", "mxfp8") and not problem.stack.fp8_params:
        out.append("Bridge's FP8 recipes hold FP8 primary weights")  # mixed_precision.py lines 264, 302 @067f987
    if fmt in ("megatron", "nemo"):  # Megatron-Core start-up checks (data/flags/startup-training.yaml)
        out += [why for bad, why in [
            (m.heads % p.tp != 0, "heads"), (m.n_kv_heads % p.tp != 0 and p.tp % m.n_kv_heads != 0, "groups"),
            (task.global_batch % (p.dp * p.mbs) != 0, "batch"), (p.ep > 1 and m.moe is None, "ep"),
            (p.cp > 1 and (task.seq_len or 0) % (2 * p.cp) != 0, "cp seq")] if bad]
    if fmt == "torchtitan":
        out += [why for bad, why in [
            (p.zero == 1, "zero 1"), (p.sp != (p.tp > 1), "sp"), (task.global_batch % (p.dp * p.mbs) != 0, "batch"),
            (task.precision == "fp16", "fp16"), (m.ffn_kind != "swiglu" or m.norm != "rmsnorm" or m.moe, "model"),
            (p.zero == 0 and p.tp * p.pp * p.cp > 1, "DDP is 1-D only"),
            (m.heads % p.tp != 0 or m.n_kv_heads % p.tp != 0, "heads per TP rank"),
            ((task.seq_len or 0) % (p.tp * 2 * p.cp) != 0, "seq divisor")] if bad]
    if fmt == "deepspeed":
        out += [why for bad, why in [
            (p.cp > 1, "cp"), (p.vpp > 1, "vpp"), (uneven, "uneven"), (p.zero >= 2 and p.pp > 1, "zero with pp"),
            (m.layers % p.pp != 0, "layers"), (task.global_batch % (p.dp * p.mbs) != 0, "batch"),
            (task.precision in ("fp8", "mxfp8"), "fp8"), (p.ep > 1 and m.moe is None, "ep"),
            (m.moe is not None and p.zero == 3, "MoE with ZeRO-3"),
            (m.heads % p.tp != 0 or m.n_kv_heads % p.tp != 0, "heads per TP rank")] if bad]
    return out


def test_uneven_stages_with_interleaving_are_refused_not_flattened() -> None:
    """Megatron's emit used to drop vpp on an uneven split (a non-interleaved run, silently)."""
    plan = Plan(dp=8, pp=2, vpp=2, stage_layers=[3, 5], stage_recompute=["none", "none"])
    for fmt in ("megatron", "nemo", "torchtitan"):
        with pytest.raises(ProblemError, match=f"{fmt} cannot express uneven stages with vpp=2"):
            emit_plan(training_problem(), plan, fmt)


def serving_limits(fmt: str, p: ServingPlan, problem: Problem) -> list[str]:
    precision = p.precision or "bf16"
    kv = {"int8": "int8", "int4": "bf16"}.get(precision, precision)
    roles = [p.prefill_replicas, p.dp - p.prefill_replicas] if p.prefill_replicas else [p.dp]
    group = p.ep // p.tp  # replicas per expert-parallel group (one server each)
    out = []
    if fmt in ("vllm", "sglang") and kv == "int8":
        out.append("int8 KV cache")
    if fmt == "vllm" and p.prefill_replicas and p.tp * p.pp > 8:
        out.append("disaggregation with replicas over nodes (NIXL side-channel host under Ray)")
    m = problem.model  # a catalog checkpoint loads at its own quantization, or unquantized ones also at fp8
    loads = {"fp8": {"vllm": {"fp8"}, "sglang": {"fp8", "fp4"}}, "mxfp4": {"vllm": {"fp4"}, "sglang": {"fp4"}}}
    if fmt in ("vllm", "sglang") and m.hf_id is not None and precision not in loads.get(
            m.native_precision or "", {}).get(fmt, {"bf16", "fp16", "fp8"}):
        out.append("checkpoint quantization")
    if p.ep > 1 and (p.ep % p.tp or any(n % group for n in roles)):
        out.append("expert-parallel groups")
    context = positions_of(m).context if m.hf_id is not None else None  # the checkpoint's max_position_embeddings
    task = serving_task(problem.task)
    assert task is not None
    longest = max(r.prompt_len + r.output_len for r in task.requests())
    if fmt in ("vllm", "sglang") and context is not None and longest > context:
        out.append("requests longer than the checkpoint's context (rules vllm.max-model-len, sglang.context-length)")
    if fmt == "trtllm" and (p.prefill_replicas or p.ep > 1 or m.moe is not None):  # the PyTorch backend
        if kv == "int8":
            out.append("int8 KV cache (KvCacheConfig.dtype)")
        if p.ep > p.tp > 1:
            out.append("attention DP runs attention at tp 1 (rule trtllm.attention-dp)")
        if (p.max_num_seqs or p.batch or 0) % p.pp:
            out.append("--max_batch_size is a rank's cap over pp")
        ships = {"fp8": {"fp8"}, "mxfp4": {"fp4"}, "nvfp4": {"fp4"}, "int4": {"int4"}}  # else bf16 / fp16 weights
        native = m.native_precision if m.hf_id is not None else None  # weights outside the catalog: unquantized
        if precision not in ships.get(native or "", {"bf16", "fp16"}):
            out.append("the checkpoint's own quantization")
    return out


def normalised(p: Plan, fmt: str = "") -> dict[str, Any]:
    """What a launch carries: the plan less its system name (node counts carry the hardware); an uneven plan's
    recompute is its stages' mode; stage_systems naming one system are that system; a serving plan's cap on running
    sequences is one server flag, read back as batch (online plans give it as max_num_seqs). Megatron-Bridge: sp
    without tp is not set (ModelParallelConfig refuses it; Megatron-LM turns it off itself)."""
    d = p.model_dump(exclude={"system", "stage_systems"})
    if fmt == "nemo":
        d["sp"] = p.sp and p.tp > 1
    if p.stage_recompute:
        d["recompute"] = p.stage_recompute[0]
    if isinstance(p, ServingPlan):
        d["batch"], d["max_num_seqs"] = p.max_num_seqs or p.batch, None
    return d


def check_emitted(fmt: str, problem: Problem, plan: Plan) -> None:
    limits = (training_limits if formats()[fmt].kind == "training" else serving_limits)(fmt, plan, problem)
    if limits:
        with pytest.raises(ProblemError, match=f"{fmt} cannot express"):
            emit_plan(problem, plan, fmt)
        return
    e = emit_plan(problem, plan, fmt)
    assert emitted_names(e) <= allowed_names(fmt)
    assert e.gpus == plan.gpus and e.nodes * e.gpus_per_node >= e.gpus
    assert normalised(parse_emitted(e), fmt) == normalised(plan, fmt)
    if fmt in CHECKS:
        assert violations(e) == [], (fmt, plan)  # the framework's start-up rules


# ------------------------------------------------------------------------------------------------ strategies


@st.composite
def training_plans(draw: Any) -> Plan:
    tp, pp, cp, dp = (draw(st.sampled_from(v)) for v in ([1, 2, 4], [1, 2, 4], [1, 2], [1, 2, 4, 8]))
    uneven = pp > 1 and draw(st.booleans())
    stage_layers = stage_recompute = None
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    if uneven:
        cuts = sorted(draw(st.lists(st.integers(1, LAYERS - 1), min_size=pp - 1, max_size=pp - 1, unique=True)))
        stage_layers = [b - a for a, b in zip([0, *cuts], [*cuts, LAYERS], strict=True)]
        stage_recompute = draw(st.sampled_from([[recompute] * pp, [recompute] * (pp - 1) + ["full"]]))
    fits_two_chunks = uneven and min(stage_layers or [0]) >= 2  # every virtual chunk holds a layer
    vpps = [1, 2] if fits_two_chunks else [1] if uneven or pp == 1 else [1, 2, 4]
    return Plan(dp=dp, tp=tp, pp=pp, cp=cp, vpp=draw(st.sampled_from(vpps)),
                mbs=draw(st.sampled_from([1, 2, 3])), zero=draw(st.integers(0, 3)), recompute=recompute,
                sp=draw(st.booleans()), stage_layers=stage_layers, stage_recompute=stage_recompute,
                system=draw(st.sampled_from([None, "dgx-h100"])))


@st.composite
def serving_plans(draw: Any) -> ServingPlan:
    dp, tp, cap = draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(1, 512))
    caps = draw(st.sampled_from([{"batch": cap}, {"max_num_seqs": cap}, {"batch": cap, "max_num_seqs": cap}]))
    return ServingPlan(dp=dp, tp=tp, pp=draw(st.sampled_from([1, 2])), ep=draw(st.sampled_from([1, tp, 2 * tp, 3])),
                       **caps,
                       precision=draw(st.sampled_from(["bf16", "fp16", "fp8", "int8", "int4"])),
                       prefill_replicas=draw(st.integers(0, dp - 1)))


@settings(max_examples=60, deadline=None)
@given(training_plans())
def test_random_training_plans_round_trip_or_are_refused(plan: Plan) -> None:
    for fmt in TRAINING_FORMATS:
        check_emitted(fmt, TRAINING, plan)


@settings(max_examples=60, deadline=None)
@given(serving_plans())
def test_random_serving_plans_round_trip_or_are_refused(plan: ServingPlan) -> None:
    for fmt in SERVING_FORMATS:
        check_emitted(fmt, SERVING, plan)


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8", "mxfp8"])
def test_training_precisions_and_moe_round_trip(precision: str) -> None:
    moe = dict(LLAMA, moe={"num_experts": 8, "top_k": 2, "expert_ffn": LLAMA["ffn"]})
    hardware = {"system": "dgx-b200", "gpus": SIZES} if precision == "mxfp8" else None  # MXFP8 needs Blackwell
    problem = training_problem(moe, hardware=hardware, precision=precision)
    plan = Plan(dp=8, tp=2, pp=2, ep=4, mbs=1, zero=1, sp=True)
    for fmt in TRAINING_FORMATS:
        check_emitted(fmt, problem, plan)


# --------------------------------------------------------------------- recorded flag sets and field coverage


@pytest.mark.parametrize("fmt", format_names())
def test_flag_set_records_its_source(fmt: str) -> None:
    fs = flagset(fmt)
    assert fs.format == fmt and fs.version and fs.commit and fs.files
    names = [*fs.flags, *fs.config_keys]
    assert names and len(names) == len(set(names))
    assert set(fs.choices) <= set(names) | set(fs.flags)


@pytest.mark.parametrize("fmt", format_names())
def test_every_plan_field_maps_to_recorded_flags_or_is_refused(fmt: str) -> None:
    f = formats()[fmt]
    fields = set((Plan if f.kind == "training" else ServingPlan).model_fields)
    assert set(f.maps) | set(f.refuses) == fields  # no plan field dropped, no stale names
    for name, flags in f.maps.items():
        assert flags and set(flags) <= allowed_names(fmt), name


# a non-default value of every refused field, on a plan the format otherwise expresses
REFUSED: dict[str, dict[str, Any]] = {
    "batch": {"batch": 8}, "stage_recompute": {"pp": 2, "stage_layers": [4, 4], "stage_recompute": ["none", "full"]},
    "stage_systems": {"pp": 2, "stage_layers": [4, 4], "stage_recompute": ["none", "none"],
                      "stage_systems": ["dgx-h100", "dgx-a100"]},
    "zero": {"zero": 1}, "sp": {"tp": 1, "sp": True}, "cp": {"cp": 2}, "vpp": {"pp": 2, "vpp": 2},
    "stage_layers": {"pp": 2, "stage_layers": [3, 5], "stage_recompute": ["none", "none"]},
    "mbs": {"mbs": 2}, "recompute": {"recompute": "full"},
    "max_num_seqs": {"max_num_seqs": 4}, "ep": {"ep": 3}, "prefill_replicas": {"dp": 2, "prefill_replicas": 1},
}


REFUSED_IN = {("deepspeed", "zero"): {"pp": 2, "zero": 2}}  # where a format refuses other values


@pytest.mark.parametrize("fmt", format_names())
def test_every_refused_field_is_refused_in_one_line(fmt: str) -> None:
    f = formats()[fmt]
    assert set(f.refuses) <= set(REFUSED)
    two_systems = training_problem(hardware=[{"system": "dgx-h100", "gpus": SIZES}, {"system": "dgx-a100",
                                                                                      "gpus": SIZES}])
    for name in f.refuses:
        base = {"dp": 2, "tp": 2, "sp": True} if f.kind == "training" else {"dp": 2, "tp": 2, "batch": 8}
        problem = (two_systems if name == "stage_systems" else TRAINING) if f.kind == "training" else SERVING
        cls = ServingPlan if name not in Plan.model_fields else Plan  # training-only fields: not a ServingPlan
        with pytest.raises(ProblemError) as err:
            emit_plan(problem, cls.model_validate({**base, **REFUSED_IN.get((fmt, name), REFUSED[name])}), fmt)
        assert "\n" not in str(err.value), name


def test_wrong_kind_and_unknown_format_are_one_line_errors() -> None:
    with pytest.raises(ProblemError, match="allowed for this problem: vllm, sglang, trtllm"):
        emit_plan(SERVING, ServingPlan(batch=1), "megatron")
    with pytest.raises(ProblemError, match="without batch or max_num_seqs"):
        emit_plan(SERVING, ServingPlan(dp=2), "vllm")
    with pytest.raises(ProblemError, match="unknown format 'slurm'"):
        emit_plan(TRAINING, Plan(), "slurm")
    assert formats_for(TRAINING) == TRAINING_FORMATS and formats_for(SERVING) == SERVING_FORMATS


# ------------------------------------------------------------------------------------- hand-checked details


def test_megatron_uneven_layout_is_megatrons_own_syntax() -> None:
    # Megatron-Core's docstring example "Ettt|(tt|)*29,m|L": 3 layers, then 29 stages of 2, an MTP stage, the loss
    assert layout_layers("Ettt|(tt|)*29,m|L") == [3] + [2] * 29 + [0, 0]
    assert layout_string([3, 9, 1]) == "Et*3|t*9|t*1L"
    assert layout_layers(layout_string([3, 9, 1])) == [3, 9, 1]


def test_megatron_flags_of_a_3d_plan() -> None:
    plan = Plan(dp=4, tp=2, pp=2, vpp=2, mbs=1, zero=1, recompute="full", sp=True)
    f = parse_flags(emit_plan(TRAINING, plan, "megatron").commands[0].args)
    assert f["--num-layers-per-virtual-pipeline-stage"] == "2"  # 8 layers / (pp 2 x vpp 2)
    assert f["--recompute-granularity"] == "full" and f["--recompute-method"] == "uniform"
    assert "--use-distributed-optimizer" in f and "--use-megatron-fsdp" not in f
    assert f["--num-query-groups"] == "4" and f["--normalization"] == "RMSNorm"


def test_deepspeed_config_and_torchtitan_toml() -> None:
    plan = Plan(dp=4, tp=2, pp=1, mbs=2, zero=2, sp=True)
    ds = emit_plan(TRAINING, plan, "deepspeed")
    cfg = json.loads(ds.files["ds_config.json"])
    assert cfg["gradient_accumulation_steps"] == GLOBAL_BATCH // (4 * 2) and cfg["zero_optimization"]["stage"] == 2
    titan = tomllib.loads(emit_plan(TRAINING, plan, "torchtitan").files["job.toml"])
    assert titan["parallelism"]["data_parallel_shard_degree"] == 4
    assert titan["parallelism"]["fsdp_reshard_after_forward"] == "never"  # ZeRO-2: gradients sharded, not params


def test_torchtitan_flavor_reproduces_the_ffn_width() -> None:
    # torchtitan llama3 FeedForward: hidden = int(2 * 4 * dim / 3); int(multiplier * hidden); round up to multiple
    assert llama_ffn(4096, 1024, 1.3) == 14336  # torchtitan's shipped 8B flavor: Llama-3 8B's 14336
    text = emit_plan(TRAINING, Plan(dp=8, tp=1), "torchtitan").files["madmax_flavor.py"]
    multiplier = float(text.split("ffn_dim_multiplier=")[1].split(",")[0])
    assert llama_ffn(LLAMA["hidden"], 1, multiplier) == LLAMA["ffn"]


def test_serving_precisions_and_disaggregation() -> None:
    plan = ServingPlan(dp=4, tp=2, batch=64, precision="fp8", prefill_replicas=1)
    vllm = emit_plan(SERVING, plan, "vllm")
    roles = {c.role: parse_flags(c.args) for c in vllm.commands}
    assert roles["prefill"]["--data-parallel-size"] == "1" and roles["decode"]["--data-parallel-size"] == "3"
    assert roles["decode"]["--quantization"] == "fp8" and roles["decode"]["--kv-cache-dtype"] == "fp8"
    assert json.loads(str(roles["prefill"]["--kv-transfer-config"]))["kv_role"] == "kv_producer"
    sglang = {c.role: parse_flags(c.args) for c in emit_plan(SERVING, plan, "sglang").commands}
    assert sglang["decode"]["--disaggregation-mode"] == "decode"
    trt = emit_plan(SERVING, plan.model_copy(update={"prefill_replicas": 0}), "trtllm")
    assert len(trt.commands) == 4
    assert yaml.safe_load(trt.files["trtllm.yaml"])["quant_config"] == {"quant_algo": "FP8",
                                                                       "kv_cache_quant_algo": "FP8"}


def test_expert_parallel_groups_become_servers() -> None:
    # 8 replicas of tp 1 with ep 4: two expert-parallel groups of 4 replicas, one server each
    plan = ServingPlan(dp=8, tp=1, ep=4, batch=32, precision="fp8")
    vllm = [parse_flags(c.args) for c in emit_plan(SERVING, plan, "vllm").commands]
    assert [(f["--data-parallel-size"], f["--port"]) for f in vllm] == [("4", "8000"), ("4", "8001")]
    assert all("--enable-expert-parallel" in f for f in vllm)
    sglang = [parse_flags(c.args) for c in emit_plan(SERVING, plan, "sglang").commands if c.role != "router"]
    assert [(f["--tp-size"], f["--attn-dp-size"], f["--ep-size"]) for f in sglang] == [("4", "4", "4")] * 2
    trt = [parse_flags(c.args) for c in emit_plan(SERVING, plan.model_copy(update={"precision": "bf16"}),
                                                  "trtllm").commands]  # attention DP over each group's 4 ranks
    assert [(f["--tp_size"], f["--ep_size"], f["--max_batch_size"]) for f in trt] == [("4", "4", "32")] * 2
    with pytest.raises(ProblemError, match="expert-parallel groups of 3"):
        emit_plan(SERVING, plan.model_copy(update={"ep": 3}), "vllm")


def test_an_unrecorded_flag_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard in emit_plan: a flag missing from data/flags (a typo, a renamed flag) never reaches the user."""
    import madmax_opt.launch.emit as emit_module
    from madmax_opt.core.errors import InternalError

    monkeypatch.setattr(emit_module, "allowed_names", lambda fmt: set())
    with pytest.raises(InternalError, match="--tensor-model-parallel-size"):
        emit_plan(TRAINING, Plan(dp=8), "megatron")


def test_values_outside_the_recorded_choices_are_found() -> None:
    from madmax_opt.launch.emit import disallowed_values

    e = emit_plan(TRAINING, Plan(dp=8), "megatron")
    assert disallowed_values(e) == []
    args = ["ScaleNorm" if a == "RMSNorm" else a for a in e.commands[0].args]
    bad = e.model_copy(update={"commands": [e.commands[0].model_copy(update={"args": args})]})
    assert disallowed_values(bad) == [("--normalization", "ScaleNorm")]


def test_uneven_stages_use_first_and_last_counts_when_the_middle_is_even() -> None:
    plan = Plan(dp=2, pp=4, stage_layers=[1, 3, 3, 1], stage_recompute=["none"] * 4)
    f = parse_flags(emit_plan(TRAINING, plan, "megatron").commands[0].args)
    assert (f["--decoder-first-pipeline-num-layers"], f["--decoder-last-pipeline-num-layers"]) == ("1", "1")
    assert "--pipeline-model-parallel-layout" not in f
    skewed = plan.model_copy(update={"stage_layers": [1, 4, 2, 1]})
    f = parse_flags(emit_plan(TRAINING, skewed, "megatron").commands[0].args)
    assert f["--pipeline-model-parallel-layout"] == "Et*1|t*4|t*2|t*1L"
    for p in (plan, skewed):
        for fmt in ("megatron", "nemo"):
            assert parse_emitted(emit_plan(TRAINING, p, fmt)).stage_layers == p.stage_layers
