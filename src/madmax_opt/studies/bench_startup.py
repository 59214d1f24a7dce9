"""Start-up benchmark: wall time of whole commands as a user runs them (``madmax-opt bench-startup``).

Each command runs as a fresh process (the console script's interpreter, ``-m madmax_opt.cli.main``) several times;
the minimum wall time is reported (the machine may be shared; the load average is recorded beside it). The bar of
issue 16: ``--help`` and ``schema`` under 0.5 s. The modules each command imports are listed from ``-X importtime``
so a regression names its cause. Timed with bytecode cached (Python's default; the catalogs' parse cache,
io/data_cache.py, follows the same rule; a sandbox that forbids writing them makes every process compile the project
and parse the catalogs, reported beside).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from madmax_opt.studies.bench import machine_info

BAR_S = 0.5  # issue 16: `--help` and `schema` start in under half a second; issue 26: any example solve too
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("--version",),
    ("schema",),
    ("catalog", "gpus", "--json"),
    # issue 26: every example problem (plans excluded); the first two kept first, as timed before
    *(("solve", f"problems/{name}.yaml", "--json") for name in (
        "llama2-70b-h100", "serve-llama3-70b-arrival",  # uniform training; online serving (Poisson arrivals)
        "mixtral-8x7b-h100", "gpt3-175b-mixed-pipeline",  # MoE training; mixed-GPU stages (CP-SAT)
        "serve-llama2-70b-dgx-h100", "serve-llama2-70b-disaggregated", "serve-llama2-70b-mix", "serve-llama3-70b",
        "serve-deepseek-v3",  # steady-state serving; serve-llama3-70b: 4 GPU types x 1-64 GPUs
        "dlrm/dlrm-a-zionex", "dlrm/dlrm-i-zionex", "dlrm/dlrm-a-cloud",  # recommenders (CP-SAT placement)
    )),
)
BARRED: frozenset[tuple[str, ...]] = frozenset({("--help",), ("schema",), *(c for c in COMMANDS if c[0] == "solve")})
# issue 26: solves timed inside one process, after the imports (problem file, bar in s)
IN_PROCESS: tuple[tuple[str, float], ...] = (("problems/serve-llama3-70b-arrival.yaml", 0.3),)
_IN_PROCESS_SCRIPT = """
import sys, time
from pathlib import Path
from madmax_opt.io.problem import load_problem
from madmax_opt.search.cpsat import CpSatOptions
from madmax_opt.search.result import solve_result
path = Path(sys.argv[1])
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    solve_result(load_problem(path), 1, 60.0, 1, cpsat=CpSatOptions(60.0, 1))  # solve's defaults
    times.append(time.perf_counter() - t0)
print(" ".join(repr(t) for t in times))
"""


@dataclass(frozen=True)
class StartupTiming:
    command: tuple[str, ...]
    best_s: float  # bytecode cached (as every run after an installed tool's first)
    median_s: float
    heavy_modules: tuple[str, ...]  # numpy / ortools / matplotlib when the command imported them
    uncached_best_s: float | None = None  # the environment as given, when it forbids writing bytecode


BARE: tuple[str, ...] = ("-c", "pass")  # the baseline of every row: a bare interpreter start, timed in the same run


def _run(args: tuple[str, ...], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    argv = [sys.executable, *args] if args == BARE else [sys.executable, "-m", "madmax_opt.cli.main", *args]
    subprocess.run(argv, capture_output=True, check=True, env=env)
    return time.perf_counter() - t0


def _cached_env(prefix: str) -> dict[str, str]:
    """The environment with bytecode caching on, the cache under ``prefix`` (not beside the sources): Python's
    default, which a sandbox may turn off (PYTHONDONTWRITEBYTECODE); then every process compiles the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = prefix
    return env


def _heavy(args: tuple[str, ...]) -> tuple[str, ...]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "madmax_opt.cli.main", *args],
                         capture_output=True, text=True, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    return tuple(m for m in ("numpy", "ortools", "matplotlib", "pydantic") if m in loaded)


def time_in_process(repeats: int = 5) -> list[tuple[str, float, float, float]]:
    """(problem, best s, median s, bar s) of each ``IN_PROCESS`` solve, ``repeats`` times in one fresh process
    after its imports (the first solve included: nothing is cached between solves but what the code caches)."""
    rows = []
    for problem, bar_s in IN_PROCESS:
        out = subprocess.run([sys.executable, "-c", _IN_PROCESS_SCRIPT, problem, str(repeats)], capture_output=True,
                             text=True, check=True)
        times = sorted(float(t) for t in out.stdout.split())
        rows.append((problem, times[0], times[len(times) // 2], bar_s))
    return rows


def time_commands(repeats: int = 5) -> list[StartupTiming]:
    """Minimum and median wall time of each command over ``repeats`` fresh processes, bytecode cached (one
    untimed run first compiles it); the bare interpreter (``BARE``) first, as the baseline. Where the environment
    forbids writing bytecode (PYTHONDONTWRITEBYTECODE), the best of ``repeats`` runs in it too."""
    uncached = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="madmax-pyc-") as prefix:
        env = _cached_env(prefix)
        for args in (BARE, *COMMANDS):
            _run(args, env)  # compiles into the cache
            times = sorted(_run(args, env) for _ in range(repeats))
            raw = min(_run(args) for _ in range(repeats)) if uncached else None
            rows.append(StartupTiming(args, times[0], times[len(times) // 2], () if args == BARE else _heavy(args),
                                      raw))
    return rows


def render(rows: list[StartupTiming], info: dict[str, str], date: str,
           in_process: list[tuple[str, float, float, float]] | None = None) -> str:
    lines = [
        "# Start-up benchmark",
        "",
        f"Generated by `madmax-opt bench-startup` on {date}; do not edit by hand. Each command runs as a fresh",
        "process (`python -m madmax_opt.cli.main ...`), 5 times; best and median wall time. The CLI imports the",
        "domain layers (numpy, OR-Tools, pydantic models, matplotlib) only inside the command that needs them.",
        "",
        "The baseline, timed in the same run: a bare interpreter start (`python -c pass`); the ratio column",
        f"divides each best time by it (steadier than seconds on a shared machine). Load average at the end: {_load()}.",
        "",
        "Bytecode cached (Python's default: each module compiled once, an untimed first run here; the cache in a",
        "temporary PYTHONPYCACHEPREFIX, where the catalogs' parse cache, io/data_cache.py, is kept too). This sandbox",
        "sets PYTHONDONTWRITEBYTECODE, under which every process compiles the project's modules and parses the",
        "catalogs again: the last column, the environment as given (bar not applied).",
        "",
        "| command | best (s) | median (s) | best / bare Python | bar | heavy modules imported | best, not cached (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    bare = next(r.best_s for r in rows if r.command == BARE)
    for r in rows:
        bar = _verdict(r.best_s, BAR_S) if r.command in BARRED else "-"
        name = "python -c pass (baseline)" if r.command == BARE else f"madmax-opt {' '.join(r.command)}"
        raw = "-" if r.uncached_best_s is None else f"{r.uncached_best_s:.3f}"
        lines.append(f"| `{name}` | {r.best_s:.3f} | {r.median_s:.3f} | {r.best_s / bare:.1f} | {bar} | "
                     f"{', '.join(r.heavy_modules) or 'none'} | {raw} |")
    if in_process:
        lines += ["", "## Solves in process", "",
                  "The solve alone (`solve --json`'s search and records, no imports, no printing), 5 times in one fresh",
                  "process; issue 26's bar for the online serving example: under 0.3 s.", "",
                  "| problem | best (s) | median (s) | bar |", "|---|---|---|---|"]
        lines += [f"| `{problem}` | {best:.3f} | {median:.3f} | {_verdict(best, bar)} |"
                  for problem, best, median, bar in in_process]
    lines += ["", "## Machine", "", *(f"- {k}: {v}" for k, v in info.items()), ""]
    return "\n".join(lines)


def _verdict(best_s: float, bar_s: float) -> str:
    return f"< {bar_s} s: {'pass' if best_s < bar_s else '**FAIL**'}"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def write_startup_bench(out_dir: Path, repeats: int = 5) -> Path:
    rows = time_commands(repeats)
    in_process = time_in_process(repeats)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "startup.md"
    path.write_text(render(rows, machine_info(), date, in_process))
    return path
