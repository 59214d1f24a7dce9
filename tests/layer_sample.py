"""A seeded sample of plans for layer-cost tests: the example training problems (dense Llama-2 70B, MoE Mixtral
8x7B, the mixed A100/H100 GPT-3 fleet) under bf16 / fp8 / mxfp8, flash and unfused attention, TP-comm and EP-comm
overlap, torchtitan, dropout, LoRA and frozen layers, and random plans over every plan column and hardware option.
Plans need not be valid: ``layer_costs`` is elementwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from madmax_opt.io.problem import problem_from_dict
from madmax_opt.model.hardware import HardwareTable
from madmax_opt.model.plan import PlanArrays
from madmax_opt.model.problem import Problem
from madmax_opt.model.training import LayerCosts, layer_costs
from madmax_opt.model.workload import lower

ROOT = Path(__file__).resolve().parents[1]
PLANS_PER_CASE = 160
PROBLEMS = ("llama2-70b-h100", "mixtral-8x7b-h100", "gpt3-175b-mixed-pipeline")
# (name, task overrides, stack overrides)
VARIANTS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("bf16", {"precision": "bf16"}, {}),
    ("fp8", {"precision": "fp8"}, {}),
    ("mxfp8-torchtitan", {"precision": "mxfp8"}, {"framework": "torchtitan"}),
    ("fp8-overlap", {"precision": "fp8"}, {"tp_comm_overlap": True, "ep_comm_overlap": True}),
    ("unfused-dropout", {}, {"flash_attention": False, "dropout": True, "pp_scatter_gather": False}),
    ("lora-bf16grad", {"kind": "finetune", "lora_rank": 16}, {"grad_reduce_dtype": "bf16"}),
    ("frozen", {"kind": "finetune", "frozen_layers": 8}, {"ep_comm_overlap": False}),
)


def case_problem(name: str, task: dict[str, Any], stack: dict[str, Any], blackwell: bool = False) -> Problem:
    """An example problem with task and stack overrides; ``blackwell`` moves it to DGX B200 nodes (same sizes)."""
    path = ROOT / "problems" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    if blackwell:
        data["hardware"] = {**data["hardware"], "system": "dgx-b200"}
    data["task"] = {**data["task"], **task}
    data["stack"] = {**data.get("stack", {}), **stack}
    data.pop("baseline", None)
    return problem_from_dict(data, source=str(path))


def random_plans(rng: np.random.Generator, n: int, options: int) -> PlanArrays:
    def pick(values: tuple[int, ...]) -> Any:
        return rng.choice(np.array(values, dtype=np.int64), size=n)

    return PlanArrays(
        dp=pick((1, 2, 4, 8, 16, 64)), tp=pick((1, 2, 4, 8, 16)), pp=pick((1, 2, 4, 8)), cp=pick((1, 2, 4)),
        vpp=pick((1, 2, 5)), mbs=pick((1, 2, 4)), zero=pick((0, 1, 2, 3)), recompute=pick((0, 1, 2)),
        sp=pick((0, 1)), hw=rng.integers(0, options, size=n, dtype=np.int64), ep=pick((1, 2, 4, 8)),
    )


def cases() -> list[tuple[str, Problem, PlanArrays]]:
    out = []
    rng = np.random.default_rng(20261203)
    for name in PROBLEMS:
        for variant, task, stack in VARIANTS:
            if "fp8" in variant and name.startswith("gpt3"):  # the A100s of that fleet have no FP8 GEMMs
                continue
            if "mxfp8" in variant and not name.startswith("llama2"):  # MXFP8 needs Blackwell: the dense example
                continue
            problem = case_problem(name, task, stack, blackwell="mxfp8" in variant)
            out.append((f"{name}/{variant}", problem, random_plans(rng, PLANS_PER_CASE, len(problem.hardware))))
    return out


def costs(problem: Problem, plans: PlanArrays) -> LayerCosts:
    wl = lower(problem.model, problem.training_task, problem.stack)
    return layer_costs(wl, problem.training_task, problem.stack, HardwareTable(problem.hardware), plans)
