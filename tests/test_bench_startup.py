"""bench-startup's in-process rows (studies/bench_startup.py): the online serving solve is timed in a fresh
process after its imports, and the table marks each row against its bar."""

from __future__ import annotations

from madmax_opt.studies import bench_startup


def test_in_process_solve_is_timed_and_barred() -> None:
    rows = bench_startup.time_in_process(repeats=1)
    assert [r[0] for r in rows] == [p for p, _ in bench_startup.IN_PROCESS]
    (problem, best, median, bar), = rows
    assert 0.0 < best <= median < 30.0 and bar == 0.3
    text = bench_startup.render([bench_startup.StartupTiming(bench_startup.BARE, 0.01, 0.01, ())], {}, "now",
                                [(problem, best, median, best / 2), (problem, best, median, best * 2)])
    table = text.split("## Solves in process")[1]
    assert table.count("**FAIL**") == 1 and table.count(": pass") == 1


def test_commands_are_timed_with_bytecode_cached() -> None:
    import os

    env = bench_startup._cached_env("/tmp/pyc-prefix")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == "/tmp/pyc-prefix"
    assert all(env[k] == v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"
               and k != "PYTHONPYCACHEPREFIX")


def test_every_example_solve_is_timed_against_the_bar() -> None:
    """Issue 26's bar is for any example solve: every problem file under problems/ and problems/dlrm/ (plans,
    plan-*.yaml, are not problems) is a timed and barred command."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    examples = {str(p.relative_to(root)) for d in ("problems", "problems/dlrm") for p in (root / d).glob("*.yaml")
                if not p.name.startswith("plan-")}
    solves = {c[1] for c in bench_startup.COMMANDS if c[0] == "solve"}
    assert len(examples) >= 12 and solves == examples
    assert all(c in bench_startup.BARRED for c in bench_startup.COMMANDS if c[0] == "solve")
