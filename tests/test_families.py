"""Every command on the example problem of every family (training, MoE, serving, recommender): it works, or it
refuses in one line saying that it does not apply to that family (issue 12). Dispatch lives in one registry
(madmax_opt.report.families); this test runs the real command line on the shipped examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli_helpers import run_main
from madmax_opt.report.families import FAMILIES, family_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "training": ROOT / "problems" / "llama2-70b-h100.yaml",
    "moe": ROOT / "problems" / "mixtral-8x7b-h100.yaml",
    "serving": ROOT / "problems" / "serve-llama2-70b-dgx-h100.yaml",
    "recommender": ROOT / "problems" / "dlrm" / "dlrm-a-zionex.yaml",
}
FAMILY_OF_EXAMPLE = {"training": "training", "moe": "training", "serving": "serving", "recommender": "recommender"}


@pytest.fixture(scope="module")
def best_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each example's optimum from `solve --json`, written as a plan file (the input of evaluate / timeline)."""
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for name, problem in EXAMPLES.items():
        r = run_main("solve", problem, "--json")
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)
        assert result["status"] in ("optimal", "feasible")  # every family's JSON carries a status
        plan = dict(result["best"]["plan"])
        out[name] = d / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(plan))
    return out


def test_family_of_each_example() -> None:
    for name, path in EXAMPLES.items():
        assert family_of(path).name == FAMILY_OF_EXAMPLE[name]


def _works_or_refuses(result: object, family: str, verb: str) -> None:
    code, err = result.returncode, result.stderr  # type: ignore[attr-defined]
    if getattr(FAMILIES[family], verb):
        assert code in (0, 1), err  # verify exits 1 only if the solver lost to brute force
        assert "Traceback" not in err
    else:
        assert code == 2 and err.count("\n") == 1, err
        assert f"`{verb}` does not apply to {family} problems" in err


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_evaluate_the_optimum_of_each_family(name: str, best_plans: dict[str, Path]) -> None:
    r = run_main("evaluate", EXAMPLES[name], "--plan", best_plans[name], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)  # one record


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_verify_each_family(name: str) -> None:
    _works_or_refuses(run_main("verify", EXAMPLES[name], "--json"), FAMILY_OF_EXAMPLE[name], "verify")


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_timeline_each_family(name: str, best_plans: dict[str, Path], tmp_path: Path) -> None:
    r = run_main("timeline", EXAMPLES[name], "--plan", best_plans[name], "--out", tmp_path, "--json")
    _works_or_refuses(r, FAMILY_OF_EXAMPLE[name], "timeline")


@pytest.mark.parametrize("name", ["training", "serving", "recommender"])
def test_sensitivity_each_family(name: str, tmp_path: Path) -> None:
    r = run_main("sensitivity", EXAMPLES[name], "--params", "nic_bandwidth", "--factors", "2", "--out", tmp_path,
                 "--json")
    _works_or_refuses(r, FAMILY_OF_EXAMPLE[name], "sensitivity")


@pytest.mark.parametrize("name", ["training", "serving", "recommender"])
def test_pareto_each_family(name: str, tmp_path: Path) -> None:
    _works_or_refuses(run_main("pareto", EXAMPLES[name], "--out", tmp_path / "front"), FAMILY_OF_EXAMPLE[name],
                      "pareto")


def test_pareto_writes_by_default_per_problem_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No --out: results/pareto/<problem stem>.md and .png, so two problems do not overwrite each other."""
    monkeypatch.chdir(tmp_path)
    r = run_main("pareto", EXAMPLES["serving"])
    assert r.returncode == 0, r.stderr
    md = Path("results/pareto") / f"{EXAMPLES['serving'].stem}.md"
    assert md.exists() and md.with_suffix(".png").exists()
    assert f"wrote {md} and {md.with_suffix('.png')}" in r.stdout


def test_a_recommender_in_a_sweep_file_is_refused_by_name(tmp_path: Path) -> None:
    sweep = yaml.safe_load((ROOT / "problems" / "sweeps" / "example.yaml").read_text())
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**sweep, "models": ["dlrm-a"]}))
    r = run_main("sweep", path, "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "'dlrm-a' is a recommender; sweep files cover transformer training problems" in r.stderr
