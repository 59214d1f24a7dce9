"""``madmax-opt evaluate`` at 80 columns: the plans table wraps its text columns and cuts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_helpers import run_main

ROOT = Path(__file__).resolve().parents[1]


def test_evaluate_plans_table_is_whole_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans = tmp_path / "plans.yaml"
    plans.write_text("- {dp: 1024, tp: 1, pp: 1, mbs: 8, zero: 0, recompute: none, system: dgx-h100}\n"
                     "- {dp: 128, tp: 2, pp: 4, vpp: 4, mbs: 1, zero: 2, recompute: none, sp: true, system: dgx-h100}\n")
    monkeypatch.setenv("COLUMNS", "80")
    r = run_main("evaluate", ROOT / "problems/llama2-70b-h100.yaml", "--plan", plans)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("plan 1:")[0]
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80, table
    # tokens/s 1,137,448 before the refit that keeps runs with inferred recompute out of the fits (issue 24)
    for text in ("dgx-h100", "x1024", "1,137,361", "49.9%", "71.9", "1.230", "yes",
                 "plan 1 infeasible: dp*mbs must divide global_batch"):
        assert text in table, text
