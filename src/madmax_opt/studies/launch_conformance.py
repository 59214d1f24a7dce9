"""Launch conformance: the examples' top plans emitted in every format of their kind, for the frameworks' own checks.

``emitted_configurations(paths, top_k)`` solves each problem, emits its top ``top_k`` plans in every format of its
kind and returns one record per (problem, rank, format): the :class:`Emitted` or the one-line refusal; serving
records also carry ``priced`` (the model and plan fields the cost model priced) and ``hf_config`` (the catalog
model's config.json, :func:`madmax_opt.launch.hf_config.hf_config`, or why it cannot be written) for the
framework's own model config to be built and compared (``framework_checks.vllm_engine``).
``write_configurations`` stores them as JSON lines; ``tools/framework_check.py``, run with an interpreter where the
frameworks are installed (torch, Megatron-LM, torchtitan, SGLang, vLLM at the versions of ``data/flags/``), feeds
each configuration to the framework's own parser and start-up validation and counts what passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.problem import load_problem
from madmax_opt.launch.emit import emit_plan, formats_for, plan_of_record
from madmax_opt.launch.hf_config import hf_config
from madmax_opt.launch.startup import positions_of
from madmax_opt.model.family_name import serving_task, training_task
from madmax_opt.model.problem import Problem
from madmax_opt.model.spec import TransformerModel
from madmax_opt.search.result import solve_result


def emitted_configurations(paths: list[Path], top_k: int = 5, time_limit_s: float = 3.0) -> list[dict[str, Any]]:
    """One record per (problem, rank, format): ``emitted`` (the configuration's JSON) or ``refused`` (one line)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        problem = load_problem(path)
        for rank, record in enumerate(solve_result(problem, top_k, time_limit_s, 1)["top"][:top_k]):
            plan = plan_of_record(problem, record["plan"])
            for fmt in formats_for(problem):
                row: dict[str, Any] = {"problem": path.stem, "rank": rank, "format": fmt, "plan": record["plan"],
                                       **priced(problem, record["plan"])}
                try:
                    row["emitted"] = emit_plan(problem, plan, fmt).model_dump(mode="json")
                except ProblemError as exc:
                    row["refused"] = str(exc)
                rows.append(row)
    return rows


def shape(m: TransformerModel) -> dict[str, int]:
    """The model shape every priced record holds (serving and training): layers, hidden, heads, KV heads, vocab."""
    return {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads or m.heads,
            "vocab": m.vocab}


def priced(problem: Problem, plan: dict[str, Any]) -> dict[str, Any]:
    """What the cost model priced for a serving plan (the model's shape, the longest request, the weight precision,
    the parallel sizes) and the model's config.json; for a training plan the model's shape, RoPE base, precision
    and the plan's parallel layout (:func:`priced_training`)."""
    task = serving_task(problem.task)
    if task is None:
        return priced_training(problem, plan)
    m = problem.model
    cfg = hf_config(m)
    return {"priced": {**shape(m), "mla_kv_dim": m.mla_kv_dim,
                       "max_model_len": max(r.prompt_len + r.output_len for r in task.requests()),
                       "precision": str(plan.get("precision") or task.precisions()[0]),
                       "tp": plan.get("tp", 1), "pp": plan.get("pp", 1), "dp": plan.get("dp", 1)},
            "hf_config": cfg if isinstance(cfg, dict) else None, "hf_config_refused": None if isinstance(cfg, dict)
            else cfg}


def priced_training(problem: Problem, plan: dict[str, Any]) -> dict[str, Any]:
    """The training model and plan the cost model priced (``framework_checks.bridge`` compares the framework's
    built config with it); {} for an inference task."""
    task, m = training_task(problem.task), problem.model
    if task is None:
        return {}
    pos = positions_of(m)
    return {"priced": {**shape(m), "ffn": m.ffn, "rope_base": pos.rope_theta if pos.kind == "rope" else None,
                       "experts": m.moe.num_experts if m.moe else None, "top_k": m.moe.top_k if m.moe else None,
                       "precision": str(task.precision), "seq_len": task.seq_len,
                       **{k: plan.get(k, d) for k, d in (("tp", 1), ("pp", 1), ("vpp", 1), ("cp", 1), ("ep", 1),
                                                         ("sp", False), ("recompute", "none"), ("mbs", 1))}}}


def write_configurations(rows: list[dict[str, Any]], out: Path) -> Path:
    """JSON lines, one configuration (or refusal) a line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return out


if __name__ == "__main__":  # python -m madmax_opt.studies.launch_conformance OUT.jsonl [PROBLEM.yaml ...]
    import sys

    root = Path(__file__).resolve().parents[3]
    problems = [Path(p) for p in sys.argv[2:]] or sorted((root / "problems").glob("*.yaml"))
    print(f"wrote {write_configurations(emitted_configurations(problems), Path(sys.argv[1]))}")
