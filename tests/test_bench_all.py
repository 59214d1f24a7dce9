"""bench-all: one command regenerates results/bench; an unknown benchmark name is refused in one line (exit 2)."""

from __future__ import annotations

from cli_helpers import run_main
from madmax_opt.cli.app import DEVELOPMENT_COMMANDS
from madmax_opt.cli.studies import BENCHES


def test_unknown_benchmark_is_refused_naming_the_allowed() -> None:
    r = run_main("bench-all", "--only", "solver", "--only", "nope")
    assert r.returncode == 2
    text = (r.stdout + r.stderr).strip()
    assert "--only" in text and "nope" in text and all(b in text for b in BENCHES)
    assert "Traceback" not in text


def test_every_bench_command_is_run_by_bench_all() -> None:
    """Every bench-* command but bench-all itself is one of bench-all's benchmarks, and it is a development
    command (its own --help panel)."""
    bench = {c.removeprefix("bench-") for c in DEVELOPMENT_COMMANDS if c.startswith("bench-")} - {"all"}
    assert bench == set(BENCHES)
    assert "bench-all" in DEVELOPMENT_COMMANDS
