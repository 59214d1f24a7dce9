"""Launch conformance: the examples' top plans emitted in every format of their kind, for the frameworks' own checks.

``emitted_configurations(paths, top_k)`` solves each problem, emits its top ``top_k`` plans in every format of its
kind and returns one record per (problem, rank, format): the :class:`Emitted` or the one-line refusal.
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
from madmax_opt.search.result import solve_result


def emitted_configurations(paths: list[Path], top_k: int = 5, time_limit_s: float = 3.0) -> list[dict[str, Any]]:
    """One record per (problem, rank, format): ``emitted`` (the configuration's JSON) or ``refused`` (one line)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        problem = load_problem(path)
        for rank, record in enumerate(solve_result(problem, top_k, time_limit_s, 1)["top"][:top_k]):
            plan = plan_of_record(problem, record["plan"])
            for fmt in formats_for(problem):
                row: dict[str, Any] = {"problem": path.stem, "rank": rank, "format": fmt, "plan": record["plan"]}
                try:
                    row["emitted"] = emit_plan(problem, plan, fmt).model_dump(mode="json")
                except ProblemError as exc:
                    row["refused"] = str(exc)
                rows.append(row)
    return rows


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
