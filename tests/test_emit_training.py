"""Training launches: the launched model is the priced model, and every emitted configuration passes the pinned
frameworks' start-up rules (data/flags/startup-training.yaml).

Each emitted configuration is read back with a reader per format (launch/readback.py) and compared, field by field,
with what the cost model priced: the problem's model, its catalog position encoding, the task's precision and
sequence length, the stack's flash attention and dropout. Which models and plans a format refuses is stated here
from the frameworks' limits, independently of the emitters.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.launch.common import Context, Emitted
from madmax_opt.launch.emit import allowed_names, emitted_names, get_format, parse_emitted
from madmax_opt.launch.flagsets import flagset
from madmax_opt.launch.readback import LaunchedModel, launched_model
from madmax_opt.launch.rules import find_rule, rule_book
from madmax_opt.launch.startup import CHECKS, position_table, positions_of, violations
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import Plan, TransformerModel

TRAINING_FORMATS = ["megatron", "nemo", "torchtitan", "deepspeed"]
LLMS = sorted(name for name, m in catalog.models().items() if m.family == "llm")


def problem_of(model: str | dict[str, Any], *, seq_len: int = 4096, global_batch: int = 64, precision: str = "bf16",
               stack: dict[str, Any] | None = None) -> Problem:
    return problem_from_dict({
        "model": model, "hardware": {"system": "dgx-h100", "gpus": [8, 16, 32, 64, 128]},
        "task": {"kind": "pretrain", "seq_len": seq_len, "global_batch": global_batch, "precision": precision},
        **({"stack": stack} if stack else {}),
    })


def emit(problem: Problem, plan: Plan, fmt: str) -> Emitted:
    """The format's emitter on its own (the plan checks of emit_plan are another helper's), names checked."""
    e = get_format(fmt).emit(Context(problem=problem, plan=plan, option=problem.hardware[problem.hw_index(plan)]))
    assert emitted_names(e) <= allowed_names(fmt)
    return e


def model_limits(fmt: str, m: TransformerModel) -> list[str]:
    """Why ``fmt`` cannot run ``m`` as priced (the frameworks' model code), stated independently of the emitters."""
    pos = position_table().get(m.name)
    yarn = pos is not None and pos.scaling is not None and pos.scaling.type == "yarn"
    out = ["position scheme"] if pos is not None and pos.unsupported else []  # iRoPE, two RoPE bases
    if fmt in ("megatron", "nemo") and yarn:
        out.append("YaRN scaling is Megatron's multi-latent attention path; the priced attention is MHA/GQA")
    if fmt == "torchtitan":  # torchtitan v0.2.2 llama3: dense SwiGLU, RMSNorm, no bias, untied, full RoPE
        out += [w for bad, w in [(m.ffn_kind != "swiglu", "gelu"), (m.norm != "rmsnorm", "layernorm"),
                                 (m.bias, "bias"), (m.tied_embeddings, "tied"), (m.moe is not None, "moe"),
                                 (pos is not None and pos.kind != "rope", "learned"),
                                 (pos is not None and pos.rotary_percent != 1, "partial rope"), (yarn, "yarn")] if bad]
    if fmt == "deepspeed":  # Megatron-DeepSpeed: experts ffn_hidden_size wide, no shared experts, no RoPE scaling
        out += [w for bad, w in [
            (m.moe is not None and (m.moe.shared_experts > 0 or m.moe.expert_ffn != m.ffn), "moe layout"),
            (pos is not None and pos.scaling is not None, "rope scaling")] if bad]
    return out


def priced(problem: Problem, fmt: str, tp: int = 1) -> LaunchedModel:
    """What the cost model priced, as a launch must run it (experts sharded by the plan's ``tp``)."""
    m, task, stack = problem.model, problem.training_task, problem.stack
    pos = positions_of(m)
    moe = m.moe
    assert task.seq_len is not None
    return LaunchedModel(
        layers=m.layers, hidden=m.hidden, heads=m.heads, head_dim=m.hidden // m.heads, kv_heads=m.n_kv_heads, ffn=m.ffn, ffn_kind=m.ffn_kind,
        vocab=m.vocab, norm=m.norm, bias=m.bias, tied_embeddings=m.tied_embeddings,
        num_experts=moe.num_experts if moe else None, top_k=moe.top_k if moe else None,
        expert_ffn=moe.expert_ffn if moe else None, shared_experts=moe.shared_experts if moe else 0,
        expert_tp=tp if moe else None,
        positions=pos.kind, rope_theta=pos.rope_theta if pos.kind == "rope" else None,
        rotary_percent=pos.rotary_percent, rope_scaling_factor=pos.scaling.factor if pos.scaling else None,
        precision=task.precision, flash_attention=stack.flash_attention,
        fp8_params=stack.fp8_params and task.precision in ("fp8", "mxfp8"),  # priced only for FP8 tasks
        optimizer_dtype=stack.optimizer_dtype,
        dropout=stack.dropout,
        # the price assumes grouped expert GEMMs; DeepSpeed-MoE has no such option (one GEMM per expert, not priced)
        grouped_gemm=True if moe and fmt != "deepspeed" else None,
        alltoall_dispatch=True if moe else None,
        seq_len=task.seq_len, global_batch=task.global_batch,
    )


def check_round_trip(problem: Problem, plan: Plan, fmt: str) -> Emitted:
    e = emit(problem, plan, fmt)
    assert launched_model(e) == priced(problem, fmt, plan.tp), (fmt, problem.model.name)
    carried = {"system", "stage_systems", "sp"}  # node counts carry the system; sp: below
    assert parse_emitted(e).model_dump(exclude=carried) == plan.model_dump(exclude=carried)
    assert parse_emitted(e).sp == (plan.sp and (plan.tp > 1 or fmt not in ("nemo", "torchtitan")))
    assert violations(e) == [], (fmt, plan)
    return e


# ------------------------------------------------------------------------------ every catalog training model


@pytest.mark.parametrize("fmt", TRAINING_FORMATS)
def test_every_catalog_llm_launches_as_priced_or_is_refused(fmt: str) -> None:
    plan = Plan(dp=8, mbs=1, zero=1 if fmt != "torchtitan" else 3)
    ran = 0
    for name in LLMS:
        problem = problem_of(name)
        limits = model_limits(fmt, problem.model)
        if limits:
            with pytest.raises(ProblemError, match=f"{fmt} cannot express"):
                emit(problem, plan, fmt)
            continue
        check_round_trip(problem, plan, fmt)
        ran += 1
    assert ran >= {"megatron": 20, "nemo": 20, "torchtitan": 10, "deepspeed": 15}[fmt]


def test_every_catalog_llm_has_its_position_encoding() -> None:
    assert set(LLMS) <= set(position_table())
    # spot values from the checkpoints' config.json: Llama-2 10000, Llama-3 500000, Llama-3.1 scaling 8
    assert positions_of(catalog.models()["llama2-70b"]).rope_theta == 10000
    assert positions_of(catalog.models()["llama3-70b"]).rope_theta == 500_000
    scaling = positions_of(catalog.models()["llama3-405b"]).scaling
    assert scaling is not None and scaling.factor == 8.0


# ------------------------------------------------------------------------------ random models and plans


@st.composite
def models(draw: Any) -> dict[str, Any]:
    heads = draw(st.sampled_from([8, 16, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    swiglu = draw(st.booleans())
    m: dict[str, Any] = {
        "layers": draw(st.sampled_from([8, 12, 16])), "hidden": heads * draw(st.sampled_from([64, 128])),
        "heads": heads, "kv_heads": kv, "ffn": draw(st.integers(256, 4096)),
        "ffn_kind": "swiglu" if swiglu else "gelu", "norm": "rmsnorm" if swiglu else "layernorm",
        "vocab": draw(st.integers(1000, 64000)), "bias": not swiglu, "tied_embeddings": not swiglu,
    }
    if draw(st.booleans()):
        m["moe"] = {"num_experts": 8, "top_k": draw(st.sampled_from([1, 2])),
                    "expert_ffn": draw(st.sampled_from([m["ffn"], 512]))}
    return m


@settings(max_examples=15, deadline=None)
@given(models(), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.sampled_from(["bf16", "fp8"]), st.booleans(), st.booleans())
def test_random_models_and_plans_launch_as_priced(model: dict[str, Any], tp: int, pp: int, cp: int, precision: str,
                                                  dropout: bool, fp8_params: bool) -> None:
    problem = problem_of(model, precision=precision, stack={"dropout": dropout, "fp8_params": fp8_params})
    m = problem.model
    dp = 8 // (tp * pp * cp) if tp * pp * cp <= 8 else 1
    ep = 2 if m.moe is not None and dp % 2 == 0 else 1
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, mbs=1, zero=1, sp=tp > 1)
    for fmt in TRAINING_FORMATS:
        why = model_limits(fmt, m)
        if fmt == "torchtitan":
            why += ["zero 1"]  # FSDP2 has no optimizer-only sharding
            why += ["dropout"] if dropout else []  # torchtitan's llama3 has no dropout layers
        if fmt == "deepspeed":
            why += [w for bad, w in [(cp > 1, "cp"), (precision == "fp8", "fp8"),
                                     (m.heads % tp != 0 or m.n_kv_heads % tp != 0, "heads")] if bad]
        if fmt == "torchtitan":
            why += ["heads"] if m.heads % tp or m.n_kv_heads % tp else []
            why += ["fp8 params"] if precision == "fp8" and fp8_params else []  # Float8Linear keeps bf16 weights
        if fmt == "nemo" and precision == "fp8" and not fp8_params:
            why += ["bf16 primary weights"]  # Bridge's FP8 recipes set fp8_param_gather
        if fmt in ("megatron", "nemo"):
            why += [w for bad, w in [(m.heads % tp != 0, "heads"),
                                     (m.n_kv_heads % tp != 0 and tp % m.n_kv_heads != 0, "groups"),
                                     (m.moe is not None and m.bias and tp > 1, "MoE biases need expert tp 1")] if bad]
        if why:
            with pytest.raises(ProblemError):
                emit(problem, plan, fmt)
            continue
        check_round_trip(problem, plan, fmt)


# ------------------------------------------------------------------------------ the start-up rules themselves


def test_every_rule_has_a_checker_and_a_source() -> None:
    for fmt, fw in rule_book("training").items():
        assert {r.id for r in fw.rules} == set(CHECKS[fmt]), fmt
        assert len(fw.commit) == 40 and fw.framework
        for r in fw.rules:
            assert r.id.startswith(f"{fmt}.") and r.line > 0 and r.file and r.requires
    # the pins agree with the flag files' pins
    for fmt in ("megatron", "nemo", "torchtitan", "deepspeed"):
        assert flagset(fmt).commit == rule_book("training")[fmt].commit, fmt


# a plan (and problem) breaking each `refuse` rule: emit refuses it, naming the rule
REFUSED_BY_RULE: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "megatron.heads-tp": ("megatron", {"dp": 1, "tp": 8, "sp": True}, {"heads": 12, "kv_heads": 12, "hidden": 768}),
    "megatron.query-groups-tp": ("megatron", {"dp": 2, "tp": 4, "sp": True}, {"kv_heads": 3, "heads": 12,
                                                                               "hidden": 768}),
    "megatron.global-batch": ("megatron", {"dp": 8, "mbs": 3}, {}),
    "megatron.cp-seq-length": ("megatron", {"dp": 1, "cp": 8}, {"seq_len": 4100}),
    "megatron.ep-needs-experts": ("megatron", {"dp": 8, "ep": 2}, {}),
    "megatron.layers-per-stage": ("megatron", {"dp": 1, "pp": 8}, {"layers": 12}),
    "megatron.layers-per-chunk": ("megatron", {"dp": 2, "pp": 4, "vpp": 2}, {"layers": 12}),
    "megatron.experts-ep": ("megatron", {"dp": 8, "ep": 8}, {"moe": {"num_experts": 6, "top_k": 2,
                                                                     "expert_ffn": 2048}}),
    "megatron.expert-grid": ("megatron", {"dp": 4, "tp": 2, "ep": 8, "sp": True},
                             {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 2048}}),
    "megatron.moe-bias-etp": ("megatron", {"dp": 4, "tp": 2, "ep": 2, "sp": True},
                              {"bias": True, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 2048}}),
    "nemo.moe-bias-etp": ("nemo", {"dp": 4, "tp": 2, "ep": 2, "sp": True},
                          {"bias": True, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 2048}}),
    "nemo.experts-ep": ("nemo", {"dp": 8, "ep": 8}, {"moe": {"num_experts": 6, "top_k": 2, "expert_ffn": 2048}}),
    "nemo.expert-grid": ("nemo", {"dp": 4, "tp": 2, "ep": 8, "sp": True},
                         {"moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 2048}}),
    "deepspeed.experts-ep": ("deepspeed", {"dp": 8, "ep": 8}, {"moe": {"num_experts": 6, "top_k": 2,
                                                                       "expert_ffn": 2048}}),
    "nemo.heads-tp": ("nemo", {"dp": 1, "tp": 8, "sp": True}, {"heads": 12, "kv_heads": 12, "hidden": 768}),
    "nemo.query-groups-tp": ("nemo", {"dp": 2, "tp": 4, "sp": True}, {"kv_heads": 3, "heads": 12, "hidden": 768}),
    "nemo.global-batch": ("nemo", {"dp": 8, "mbs": 3}, {}),
    "torchtitan.global-batch": ("torchtitan", {"dp": 8, "mbs": 3, "zero": 3}, {}),
    "torchtitan.ddp-1d": ("torchtitan", {"dp": 4, "tp": 2, "sp": True, "zero": 0}, {}),
    "torchtitan.seq-divisor": ("torchtitan", {"dp": 2, "tp": 4, "sp": True, "zero": 3}, {"seq_len": 4100}),
    "torchtitan.heads-tp": ("torchtitan", {"dp": 1, "tp": 8, "sp": True, "zero": 3}, {"kv_heads": 4}),
    "deepspeed.heads-tp": ("deepspeed", {"dp": 1, "tp": 8, "sp": True}, {"kv_heads": 4}),
    "deepspeed.pipe-zero": ("deepspeed", {"dp": 4, "pp": 2, "zero": 2}, {}),
    "deepspeed.moe-zero3": ("deepspeed", {"dp": 8, "zero": 3}, {"moe": {"num_experts": 8, "top_k": 2,
                                                                          "expert_ffn": 2048}}),
    "deepspeed.batch": ("deepspeed", {"dp": 8, "mbs": 3}, {}),
    "megatron.fp8-param-gather": ("megatron", {"dp": 8, "zero": 0}, {"precision": "fp8",
                                                                      "stack": {"fp8_params": True}}),
    "megatron.precision-aware-optimizer": ("megatron", {"dp": 8, "zero": 0}, {"stack": {"optimizer_dtype":
                                                                                        "bf16-moments"}}),
    "nemo.precision-aware-optimizer": ("nemo", {"dp": 8, "zero": 1}, {"stack": {"optimizer_dtype": "bf16"}}),
}
BASE = {"layers": 16, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn": 2048, "ffn_kind": "swiglu",
        "norm": "rmsnorm", "vocab": 32000}


@pytest.mark.parametrize("rule_id", sorted(REFUSED_BY_RULE))
def test_each_refuse_rule_refuses_in_one_line_naming_the_rule(rule_id: str) -> None:
    fmt, plan, change = REFUSED_BY_RULE[rule_id]
    change = dict(change)
    seq_len, precision, stack = change.pop("seq_len", 4096), change.pop("precision", "bf16"), change.pop("stack", None)
    problem = problem_of({**BASE, **change}, seq_len=seq_len, precision=precision, stack=stack)
    with pytest.raises(ProblemError) as err:
        emit(problem, Plan(**plan), fmt)
    _, rule = find_rule(rule_id)
    assert f"rule {rule_id}" in str(err.value) and f"line {rule.line}" in str(err.value) and "\n" not in str(err.value)
    assert rule.emit == "refuse"


def test_every_refuse_rule_is_exercised() -> None:
    refuse_rules = {r.id for fw in rule_book("training").values() for r in fw.rules if r.emit == "refuse"}
    assert refuse_rules == set(REFUSED_BY_RULE)


def test_the_checkers_catch_what_the_old_emitters_wrote() -> None:
    """Configurations as emitted before the rules were applied (issue 21) fail the checkers."""
    problem = problem_of(dict(BASE, layers=40))
    fsdp = emit(problem, Plan(dp=4, tp=2, sp=True, zero=3), "megatron")
    args = [a for a in fsdp.commands[0].args]
    i = args.index("--ckpt-format")
    old = fsdp.model_copy(update={"commands": [fsdp.commands[0].model_copy(update={"args": args[:i] + args[i + 2:]})]})
    assert violations(old) == ["megatron.fsdp-ckpt-format"]
    tp = emit(problem, Plan(dp=4, tp=2, sp=True, zero=1), "megatron")
    assert tp.commands[0].env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    no_env = tp.model_copy(update={"commands": [tp.commands[0].model_copy(update={"env": {}})]})
    assert violations(no_env) == ["megatron.tp-cp-max-connections"]
    fp8 = emit(problem_of(dict(BASE, layers=40), precision="fp8", stack={"fp8_params": True}), Plan(dp=8, zero=1),
               "megatron")
    args = [a for a in fp8.commands[0].args if a not in ("--use-distributed-optimizer", "--overlap-param-gather")]
    no_dist = fp8.model_copy(update={"commands": [fp8.commands[0].model_copy(update={"args": args})]})
    assert "--fp8-param-gather" in args and violations(no_dist) == ["megatron.fp8-param-gather"]
    # torchtitan: 40 layers, pp 4, 10 per stage; with the default less_layers (1 + 1): ceil(42 / 10) = 5 stages
    titan = emit(problem, Plan(dp=2, pp=4, zero=3), "torchtitan")
    toml = titan.files["job.toml"].replace("pipeline_parallel_first_stage_less_layers = 0\n", "").replace(
        "pipeline_parallel_last_stage_less_layers = 0\n", "")
    assert violations(titan) == []
    assert "torchtitan.virtual-stages" in violations(titan.model_copy(update={"files": {**titan.files,
                                                                                         "job.toml": toml}}))
    # Megatron-Bridge: a builder-backed (llama3) recipe with flat TransformerConfig keys
    nemo = emit(problem, Plan(dp=8), "nemo")
    flat = [a.replace("model.transformer.", "model.") for a in nemo.commands[0].args]
    assert violations(nemo) == []
    assert "nemo.builder-nesting" in violations(nemo.model_copy(update={"commands": [
        nemo.commands[0].model_copy(update={"args": flat})]}))
    # Megatron-DeepSpeed: sequence parallelism without CUDA_DEVICE_MAX_CONNECTIONS=1 (its validate_args raises)
    ds = emit(problem, Plan(dp=4, tp=2, sp=True, zero=1), "deepspeed")
    assert ds.commands[0].env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} and violations(ds) == []
    assert violations(ds.model_copy(update={"commands": [ds.commands[0].model_copy(update={"env": {}})]})) == [
        "deepspeed.sp-max-connections"]


# ------------------------------------------------------------------------------ launchers people run


def shim(bin_dir: Any, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)


def run_sbatch(e: Emitted, tmp_path: Any) -> list[str]:
    """Run launch.sbatch as Slurm would on two hosts (node-a, node-b), with scontrol / srun / the launchers replaced
    by shims that log what each node would start; returns the log lines."""
    import os
    import subprocess

    from madmax_opt.launch.emit import write_emitted

    write_emitted(e, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim(bin_dir, "scontrol", 'printf "node-a\\nnode-b\\n"')
    # srun: one task per node, SLURM_NODEID = 0..N-1 (options before the command are srun's own)
    shim(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done\n'
         'for i in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do SLURM_NODEID=$i "$@"; done')
    for launcher in ("torchrun", "deepspeed"):
        shim(bin_dir, launcher, f'echo "{launcher} CDMC=${{CUDA_DEVICE_MAX_CONNECTIONS:-unset}} $*" >> "$LOG"')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
           "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": str(e.nodes), "SLURM_SUBMIT_DIR": str(tmp_path),
           "LOG": str(tmp_path / "log")}
    subprocess.run(["bash", "launch.sbatch"], cwd=tmp_path, env=env, check=True, timeout=20)
    return (tmp_path / "log").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("fmt", ["megatron", "nemo", "torchtitan"])
def test_multi_node_torchrun_rendezvous_under_slurm(fmt: str, tmp_path: Any) -> None:
    problem = problem_of(BASE)
    e = emit(problem, Plan(dp=8, tp=2, sp=True, zero=3 if fmt == "torchtitan" else 1), fmt)  # 16 GPUs: 2 nodes
    assert (e.nodes, e.gpus_per_node) == (2, 8)
    sbatch = e.files["launch.sbatch"]
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --gpus-per-node=8" in sbatch
    log = run_sbatch(e, tmp_path)
    assert len(log) == 2  # one torchrun per node, each with its node rank, all meeting at the first host
    for rank, line in enumerate(log):
        words = line.split()
        assert words[0] == "torchrun"
        after = dict(itertools.pairwise(words))
        assert (after["--nnodes"], after["--nproc-per-node"], after["--node-rank"]) == ("2", "8", str(rank))
        assert (after["--rdzv-backend"], after["--rdzv-endpoint"], after["--rdzv-id"]) == ("c10d", "node-a:29500",
                                                                                            "77")
        # Megatron-LM: TP without FSDP needs CUDA_DEVICE_MAX_CONNECTIONS=1 (megatron.tp-cp-max-connections)
        assert words[1] == ("CDMC=1" if fmt == "megatron" else "CDMC=unset")
    assert parse_emitted(e).dp == 8


def test_deepspeed_multi_node_hostfile_under_slurm(tmp_path: Any) -> None:
    e = emit(problem_of(BASE), Plan(dp=8, tp=2, sp=True, zero=1), "deepspeed")
    log = run_sbatch(e, tmp_path)
    assert (tmp_path / "hostfile").read_text(encoding="utf-8").split("\n")[:2] == ["node-a slots=8", "node-b slots=8"]
    assert len(log) == 1  # the runner starts the nodes itself
    words = log[0].split()
    after = dict(itertools.pairwise(words))
    assert (after["--num_nodes"], after["--num_gpus"], after["--hostfile"], after["--master_addr"]) == (
        "2", "8", "hostfile", "node-a")
    assert "--use-flash-attn-v2" in words


def test_single_node_needs_no_rendezvous() -> None:
    e = emit(problem_of(BASE), Plan(dp=8, zero=1), "megatron")
    assert e.commands[0].launcher == ["torchrun", "--nnodes", "1", "--nproc-per-node", "8"]
    assert "#SBATCH --nodes=1" in e.files["launch.sbatch"]


@pytest.mark.parametrize("fmt", TRAINING_FORMATS)
def test_unfused_attention_is_launched_or_refused(fmt: str) -> None:
    """flash_attention false (the price keeps s^2 activations): Megatron --attention-backend unfused, Megatron-DeepSpeed
    without --use-flash-attn-v2; Bridge recipes and torchtitan's SDPA have no unfused switch: refused."""
    problem = problem_of(BASE, stack={"flash_attention": False})
    plan = Plan(dp=8, zero=3 if fmt == "torchtitan" else 1)
    if fmt in ("nemo", "torchtitan"):
        with pytest.raises(ProblemError, match="flash_attention"):
            emit(problem, plan, fmt)
        return
    check_round_trip(problem, plan, fmt)


@pytest.mark.parametrize("fmt", TRAINING_FORMATS)
@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_primary_weights_are_launched_or_refused(fmt: str, precision: str) -> None:
    """stack.fp8_params (FP8 primary weights): Megatron-LM --fp8-param-gather (arguments.py line 1935 @5be9626) with
    the distributed optimizer or FSDP; Bridge's FP8 recipes always set fp8_param_gather (mixed_precision.py lines 264,
    302 @067f987), so they launch only a plan priced with it; torchtitan's Float8Linear keeps high-precision weights
    and Megatron-DeepSpeed has no FP8 path: refused."""
    hardware_b200 = precision == "mxfp8"
    for fp8_params in (True, False):
        problem = problem_from_dict({
            "model": BASE, "hardware": {"system": "dgx-b200" if hardware_b200 else "dgx-h100", "gpus": [8, 16]},
            "task": {"kind": "pretrain", "seq_len": 4096, "global_batch": 64, "precision": precision},
            "stack": {"fp8_params": fp8_params}})
        for zero in (0, 1, 3):
            plan = Plan(dp=8, zero=zero)
            refused = {"megatron": fp8_params and zero == 0, "nemo": not fp8_params,
                       "torchtitan": fp8_params or zero == 1,  # FSDP2: no ZeRO-1
                       "deepspeed": True}[fmt]
            if refused:
                with pytest.raises(ProblemError) as err:
                    emit(problem, plan, fmt)
                assert "\n" not in str(err.value)
                continue
            e = check_round_trip(problem, plan, fmt)
            assert launched_model(e).fp8_params is fp8_params
    # a bf16 task is priced with bf16 weights whatever the knob says: no FP8 flag is launched
    bf16 = problem_of(BASE, stack={"fp8_params": True})
    if fmt != "torchtitan":
        assert not launched_model(emit(bf16, Plan(dp=8, zero=1), fmt)).fp8_params


# ------------------------------------------------------------------------------ the framework's own parser (optional)


def test_bridge_overrides_parse_with_hydra_as_bridge_applies_them() -> None:
    """Megatron-Bridge applies KEY=VALUE overrides with Hydra 1.3 on the recipe's config in struct mode
    (training/utils/omegaconf_utils.py lines 180-183). Runs when hydra-core is installed (pip install
    'hydra-core>1.3,<=1.3.2', Bridge's pin): every emitted override parses, lands on an existing key of the
    builder-backed recipe's tree with the intended value, and the flat key of a TransformerConfig field does not."""
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from madmax_opt.launch.startup import GPT_MODEL_CONFIG_FIELDS

    problem = problem_of(dict(BASE, layers=16))
    plan = Plan(dp=2, tp=2, pp=4, sp=True, zero=2, stage_layers=[3, 5, 6, 2], stage_recompute=["full"] * 4)
    e = emit(problem, plan, "nemo")
    overrides = [a for a in e.commands[0].args if "=" in a and not a.startswith("-")]

    def tree(keys: list[str]) -> Any:  # the recipe's config: every key present (value None), model fields nested
        root: dict[str, Any] = {}
        for key in keys:
            *parents, leaf = key.split(".")
            node = root
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = None
        cfg = OmegaConf.create(root)
        OmegaConf.set_struct(cfg, True)
        return cfg

    keys = [o.split("=", 1)[0] for o in overrides]
    assert all(k.split(".")[1] in GPT_MODEL_CONFIG_FIELDS or k.startswith("model.transformer.")
               for k in keys if k.startswith("model."))
    cfg = tree(keys)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(overrides), cfg=cfg)
    assert cfg.model.transformer.pipeline_model_parallel_layout == "Et*3|t*5|t*6|t*2L"  # | and * parse unquoted
    assert cfg.model.transformer.virtual_pipeline_model_parallel_size is None  # "null" clears the recipe's vpp
    assert cfg.model.transformer.tensor_model_parallel_size == 2 and cfg.model.rotary_base == 10000
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor" and cfg.comm_overlap.tp_comm_overlap is False
    flat = OverridesParser.create().parse_overrides(["model.tensor_model_parallel_size=2"])
    with pytest.raises(Exception, match="tensor_model_parallel_size"):
        ConfigLoaderImpl._apply_overrides_to_config(overrides=flat, cfg=tree(keys))


@pytest.mark.parametrize("fmt", TRAINING_FORMATS)
def test_optimizer_state_precision_is_launched_or_refused(fmt: str) -> None:
    """stack.optimizer_dtype: bf16 moments launch as Megatron-Core's precision-aware optimizer, which runs only with
    the distributed optimizer (optimizer_config.py line 434 @5be9626); its master weights are fp32 or fp16
    (--main-params-dtype, arguments.py line 3506), so all-bf16 states are refused; torchtitan and Megatron-DeepSpeed
    keep fp32 Adam states, so only fp32 launches there."""
    for dtype in ("fp32", "bf16-moments", "bf16"):
        problem = problem_of(BASE, stack={"optimizer_dtype": dtype})
        for zero in (0, 1, 3):
            plan = Plan(dp=8, zero=zero)
            megatron_core = fmt in ("megatron", "nemo")
            refused_for_dtype = (dtype == "bf16" or (dtype == "bf16-moments" and zero == 0)) if megatron_core \
                else dtype != "fp32"
            refused_for_plan = (fmt == "torchtitan" and zero == 1)  # FSDP2: no ZeRO-1
            if refused_for_dtype or refused_for_plan:
                with pytest.raises(ProblemError) as err:
                    emit(problem, plan, fmt)
                assert "\n" not in str(err.value)
                if refused_for_dtype and not refused_for_plan:
                    assert "optimizer_dtype" in str(err.value)
                continue
            e = check_round_trip(problem, plan, fmt)
            assert launched_model(e).optimizer_dtype == dtype


def test_the_checkers_catch_bf16_moments_without_the_distributed_optimizer() -> None:
    """megatron / nemo .precision-aware-optimizer: dropping the distributed optimizer from an emitted bf16-moments
    configuration is caught by the checker (optimizer_config.py asserts use_distributed_optimizer)."""
    problem = problem_of(BASE, stack={"optimizer_dtype": "bf16-moments"})
    mg = emit(problem, Plan(dp=8, zero=1), "megatron")
    args = [a for a in mg.commands[0].args if a not in ("--use-distributed-optimizer", "--overlap-param-gather")]
    assert "--use-precision-aware-optimizer" in args
    no_dist = mg.model_copy(update={"commands": [mg.commands[0].model_copy(update={"args": args})]})
    assert violations(no_dist) == ["megatron.precision-aware-optimizer"]
    nemo = emit(problem, Plan(dp=8, zero=1), "nemo")
    args = [a.replace("ddp.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=false")
            for a in nemo.commands[0].args]
    assert "optimizer.use_precision_aware_optimizer=true" in args
    no_dist = nemo.model_copy(update={"commands": [nemo.commands[0].model_copy(update={"args": args})]})
    assert "nemo.precision-aware-optimizer" in violations(no_dist)


def test_deepspeed_moe_experts_are_sharded_by_tp_as_priced() -> None:
    """Megatron-DeepSpeed slices experts by tp only with --enable-expert-tensor-parallelism (layers.py @4efb479);
    the cost model shards them by tp, so a tp > 1 MoE launch must set it, and a tp 1 launch need not."""
    problem = problem_of({"layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn": 4096, "ffn_kind": "swiglu",
                          "norm": "rmsnorm", "vocab": 32000, "bias": False, "tied_embeddings": False,
                          "moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 4096}})
    for tp, flag in ((2, True), (1, False)):
        e = emit(problem, Plan(dp=8 // tp, tp=tp, ep=2, zero=1), "deepspeed")
        assert ("--enable-expert-tensor-parallelism" in e.commands[0].args) is flag
        assert launched_model(e).expert_tp == tp
