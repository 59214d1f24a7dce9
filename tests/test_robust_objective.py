"""``objective: {robust: true}`` in problem files: the same choice as ``solve --robust`` (search/robust.py),
validated like every other field (a bad value: one line naming the field, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_helpers import run_main
from madmax_opt.io.problem import problem_from_dict
from madmax_opt.search.robust import with_robust

BASE: dict[str, Any] = {"model": "llama3-8b", "hardware": {"gpu": "h100-sxm", "gpus": [8]},
                        "task": {"seq_len": 4096, "global_batch": 64}}


def _rec(tokens_per_s: float, lo: float, hi: float) -> dict[str, object]:
    step = 1000.0 / tokens_per_s  # 1000 tokens per step
    return {"plan": {"system": "dgx-h100"}, "hardware": {"system": "dgx-h100", "gpus": 8}, "feasible": True,
            "step_time_s": step, "tokens_per_s": tokens_per_s, "cost_per_hour_usd": 40.0,
            "interval": {"coverage": 0.8, "level": "x", "step_time_s": [step * lo, step * hi]}}


def test_mapping_form_reads_name_and_robust() -> None:
    assert problem_from_dict(BASE).objective == "throughput" and not problem_from_dict(BASE).robust
    p = problem_from_dict({**BASE, "objective": {"robust": True}})
    assert (p.objective, p.robust) == ("throughput", True)
    p = problem_from_dict({**BASE, "objective": {"name": "cost", "robust": True}})
    assert (p.objective, p.robust) == ("cost", True)
    p = problem_from_dict({**BASE, "objective": {"name": "energy"}})
    assert (p.objective, p.robust) == ("energy", False)


def test_robust_problem_picks_the_best_worst_case_by_hand() -> None:
    """Worst cases 1.5/1000, 1.05/980, 1.1/700 s per token: the second plan has the least (1.071e-3)."""
    recs = [_rec(1000.0, 0.8, 1.5), _rec(980.0, 0.95, 1.05), _rec(700.0, 0.9, 1.1)]
    result = {"top": recs, "best": recs[0], "baseline": None}
    robust = problem_from_dict({**BASE, "objective": {"robust": True}})
    out = with_robust(robust, result, robust=False)  # no --robust flag: the problem file asks for it
    assert out["best"] is recs[1] and out["robust"]["best_chosen_by"] == "robust worst case"
    plain = problem_from_dict(BASE)
    assert with_robust(plain, result, robust=False)["best"] is recs[0]
    assert with_robust(plain, result, robust=True)["best"] is recs[1]  # the flag, the same choice


def test_problem_file_gives_the_same_solve_as_the_flag(tmp_path: Path) -> None:
    robust, plain = tmp_path / "robust.yaml", tmp_path / "plain.yaml"
    robust.write_text(yaml.safe_dump({**BASE, "objective": {"robust": True}}))
    plain.write_text(yaml.safe_dump(BASE))
    a = run_main("solve", robust, "--json", "--top-k", "3", "--time-limit", "20")
    b = run_main("solve", plain, "--json", "--top-k", "3", "--time-limit", "20", "--robust")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["best"] == rb["best"] and ra["top"] == rb["top"] and ra["robust"] == rb["robust"]
    assert ra["robust"]["best_chosen_by"] == "robust worst case"


@pytest.mark.parametrize(("objective", "task", "field"), [
    ({"robust": "maybe"}, None, "objective"),
    ({"name": "fastest"}, None, "objective"),
    ({"robust": True, "worst": 1}, None, "objective"),
    ({"robust": True}, {"kind": "inference", "prompt_len": 1024, "output_len": 128}, "objective.robust"),
])
def test_bad_objective_is_one_line_exit_2(tmp_path: Path, objective: Any, task: Any, field: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({**BASE, "objective": objective, **({"task": task} if task else {})}))
    r = run_main("solve", f)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and field in lines[0], r.stderr
