"""Family dispatch lives in one registry (issue 22): model/family_name.py classifies a task, io/file_family.py
a problem file before it is resolved, search/family.py says what each family does. No other module
asks a task which family it is; and each family's solve / evaluate through the registry gives what the search
entry points it wraps give when called directly (and what brute force over the space gives)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from madmax_opt.io.dlrm_problem import load_dlrm_problem
from madmax_opt.io.file_family import file_family
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.model.family_name import FamilyName
from madmax_opt.search.family import FAMILIES, SearchOptions, family_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "madmax_opt"
SMALL = ROOT / "tests" / "data" / "small.yaml"

# The registry files: the only places that classify a family.
REGISTRY = {"model/family_name.py", "io/file_family.py", "io/dlrm_problem.py", "search/family.py"}
# What classifying a family looks like in source: an isinstance test on a task or problem type, a task kind compared
# with the inference kind, probing for an arrival rate, the DLRM file test, a solve result's task tag compared.
PATTERNS = {
    "isinstance on a task/problem type": re.compile(
        r"isinstance\([^()]*,\s*\(?[\w., ]*\b(InferenceTask|Task|DLRMTask|DLRMProblem)\b"),
    "task kind compared": re.compile(r"kind\"?\)?\s*[!=]=\s*[\"']inference[\"']"),
    "arrival rate probed": re.compile(r"getattr\([^)]*[\"']arrival_rate[\"']"),
    "DLRM file test": re.compile(r"\bis_dlrm_(data|file)\s*\("),
    "result's task tag compared": re.compile(r"(get\(|\[)[\"']task[\"']\)?\]?\s*[!=]=\s*[\"']inference"),
}
# Sites allowed outside the registry: none (a guard narrows with problem.serving_task / training_task, the problem
# file's task union is parsed by family_name.task_model_tag); a new site fails the test.
KNOWN: dict[str, int] = {}


def _sites() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in REGISTRY:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in PATTERNS.items():
                if pattern.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{n}: {what}: {line.strip()}")
    return found


def test_only_the_registry_classifies_a_family() -> None:
    sites = _sites()
    extra = [s for rel, lines in sites.items() if len(lines) > KNOWN.get(rel, 0) for s in lines]
    assert not extra, "family dispatch outside the registry (use problem.family / family_of):\n" + "\n".join(extra)


def test_the_patterns_catch_what_they_are_for() -> None:
    """Each pattern matches the dispatch it stands for (the lines this refactor removed), and not its neighbours."""
    removed = {
        "isinstance on a task/problem type": "    if isinstance(problem.task, InferenceTask):",
        "task kind compared": '    if problem.task.kind == "inference":  # serving plans',
        "arrival rate probed": '    if getattr(problem.task, "arrival_rate", None) is not None:',
        "DLRM file test": "    if is_dlrm_file(problem):",
        "result's task tag compared": '    if result.get("task") == "inference-online":',
    }
    for what, line in removed.items():
        assert PATTERNS[what].search(line), what
    assert PATTERNS["result's task tag compared"].search('    if result.get("task") == "inference" or "top" not in result:')
    kept = ['    train = task.kind == "train"', "    if isinstance(plan, ServingPlan):", "    task.arrival_rate * 2"]
    assert not any(p.search(line) for p in PATTERNS.values() for line in kept)


# ---------------------------------------------------------------------------------------------- classification

EXAMPLES = sorted(ROOT.glob("problems/*.yaml")) + sorted(ROOT.glob("problems/dlrm/dlrm-*.yaml"))


def _expected(data: dict[str, Any]) -> FamilyName:
    """The family of a problem mapping, read off by hand: a DLRM model name, else the task's kind and rate."""
    if isinstance(data["model"], str) and data["model"].startswith("dlrm"):
        return FamilyName.RECOMMENDER
    if data["task"].get("kind") != "inference":
        return FamilyName.TRAINING
    return FamilyName.ONLINE if "arrival_rate" in data["task"] else FamilyName.SERVING


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_file_and_resolved_problem_agree_on_the_family(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert file_family(data) is _expected(data)
    problem = load_dlrm_problem(path) if _expected(data) is FamilyName.RECOMMENDER else load_problem(path)
    assert problem.family is _expected(data)
    assert family_of(problem) is FAMILIES[problem.family]


def test_every_family_has_an_entry_and_its_plan_and_launch_kind() -> None:
    assert set(FAMILIES) == set(FamilyName)
    assert [FAMILIES[n].launch_kind for n in FamilyName] == ["training", "serving", "serving", None]
    assert [FAMILIES[n].plan_type.__name__ for n in FamilyName] == ["Plan", "ServingPlan", "ServingPlan", "DLRMPlan"]
    assert [FAMILIES[n].verify is None for n in FamilyName] == [False, False, False, True]


# ------------------------------------------------------------------------------- the registry = the entry points


def _no_wall(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _no_wall(v) for k, v in x.items() if "wall" not in k}
    if isinstance(x, list):
        return [_no_wall(v) for v in x]
    return x


def test_training_solve_and_evaluate_through_the_registry() -> None:
    """Training: the registry's solve is solver.solve_records' optimum, whose objective brute force over every
    plan of the space also reaches; its evaluate is the evaluator's."""
    from madmax_opt.analysis.evaluator import Model, evaluate
    from madmax_opt.search.solver import brute_force_order, candidates, solve_records
    from madmax_opt.search.space import enumerate_plans

    problem = load_problem(SMALL)
    fam = family_of(problem)
    assert fam.name is FamilyName.TRAINING
    got = fam.solve(problem, SearchOptions(top_k=2, time_limit_s=20.0))
    _, direct = solve_records(problem, top_k=2, time_limit_s=20.0, workers=1)
    assert _no_wall(got["top"]) == _no_wall(direct)
    model = Model(problem)
    c = candidates(model, enumerate_plans(problem))
    best = int(brute_force_order(model, c, problem.objective)[0])
    assert got["best"]["tokens_per_s"] == pytest.approx(float(c.met.tokens_per_s[best]), rel=1e-9)
    plans = [problem.baseline] if problem.baseline else []
    assert fam.evaluate(problem, plans, "plans.yaml") == evaluate(problem, plans)


SERVING = {"model": "llama2-7b", "hardware": {"system": "dgx-h100", "gpus": 8},
           "task": {"kind": "inference", "prompt_len": 512, "output_len": 128, "precision": "bf16"},
           "space": {"tp": [1, 2, 4, 8], "pp": [1]}, "objective": "throughput"}


def test_serving_solve_and_evaluate_through_the_registry() -> None:
    """Steady serving: the registry's solve is search/serving.py's solve_result and its best is the first plan of
    the brute-force order over every candidate; its evaluate is evaluate_serving."""
    from madmax_opt.search import serving

    problem = problem_from_dict(SERVING)
    fam = family_of(problem)
    assert fam.name is FamilyName.SERVING and fam.serving
    got = fam.solve(problem, SearchOptions(time_limit_s=20.0))
    assert _no_wall(got) == _no_wall(serving.solve_result(problem, 1, 20.0, 1))
    model = serving.ServingModel(problem)
    c = serving.candidates(model)
    first = int(serving.brute_force_order(model, c, problem.objective)[0])
    assert got["best"]["plan"] == serving.plan_dict(model, c, first)
    plan = serving.ServingPlan(tp=8, batch=16)
    assert fam.evaluate(problem, [plan], "p.yaml") == serving.evaluate_serving(problem, [plan])


def test_online_solve_and_evaluate_through_the_registry() -> None:
    """Online serving (an arrival rate): the registry's solve and evaluate are search/online.py's."""
    from madmax_opt.search.online import evaluate_online, solve_online
    from madmax_opt.search.serving_space import ServingPlan

    data = {**SERVING, "task": {**SERVING["task"], "arrival_rate": 2.0}, "space": {"tp": [4, 8], "pp": [1]}}
    problem = problem_from_dict(data)
    fam = family_of(problem)
    assert fam.name is FamilyName.ONLINE and fam.label == "serving"
    assert _no_wall(fam.solve(problem, SearchOptions())) == _no_wall(solve_online(problem, 1))
    plan = ServingPlan(tp=8, max_num_seqs=64)
    assert fam.evaluate(problem, [plan], "p.yaml") == evaluate_online(problem, [plan])


def test_recommender_solve_through_the_registry() -> None:
    """Recommenders: the registry's solve returns dlrm_search.solve_dlrm's best plan; no top-k, no verify."""
    from madmax_opt.search.dlrm_search import evaluate_dlrm, solve_dlrm

    problem = load_dlrm_problem(ROOT / "problems" / "dlrm" / "dlrm-a-zionex.yaml")
    fam = family_of(problem)
    assert fam.name is FamilyName.RECOMMENDER and not fam.top_k and fam.launch_kind is None
    got = fam.solve(problem, SearchOptions(time_limit_s=30.0))
    best, _ = solve_dlrm(problem, time_limit_s=30.0)
    assert _no_wall(got["best"]) == _no_wall(best)
    from madmax_opt.model.dlrm_spec import DLRMPlan

    plan = DLRMPlan.model_validate(got["best"]["plan"])
    assert _no_wall(fam.evaluate(problem, [plan], "p.yaml")) == _no_wall(evaluate_dlrm(problem, [plan], "p.yaml"))


def test_rerank_refuses_every_serving_family_in_one_line(tmp_path: Path) -> None:
    """solve --rerank re-ranks training plans only (Family.rerank); online serving results were a KeyError (exit 4)
    when the check read the result's task tag, which is "inference" for steady serving only."""
    from cli_helpers import run_main

    data = {**SERVING, "task": {**SERVING["task"], "arrival_rate": 2.0}, "space": {"tp": [8], "pp": [1]}}
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_main("solve", path, "--rerank")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--rerank: needs a training problem" in r.stderr
    assert [n for n, f in FAMILIES.items() if f.rerank] == [FamilyName.TRAINING]
