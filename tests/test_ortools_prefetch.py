"""Issue 26: ``ortools_import.prefetch`` maps CP-SAT's shared library in a background thread and imports nothing;
``load_cp_model`` then imports and solves as before (fresh interpreters: the library must not be loaded yet)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_prefetch_imports_nothing_then_cp_model_solves() -> None:
    lines = _run(
        "import sys\n"
        "from madmax_opt.search import ortools_import as oi\n"
        "path = oi._helper_path()\n"
        "oi.prefetch(); oi.prefetch()  # the second call starts nothing more\n"
        "print(path is not None and path.name.startswith('cp_model_helper'))\n"
        "print(oi._prefetch is not None, any(m.startswith('ortools') for m in sys.modules))\n"
        "cp_model = oi.load_cp_model()\n"
        "print(oi._prefetch.is_alive(), 'pandas' in sys.modules)\n"
        "m = cp_model.CpModel(); x = m.new_int_var(0, 10, 'x'); y = m.new_int_var(0, 10, 'y')\n"
        "m.add(2 * x + 3 * y <= 12); m.maximize(x + y)\n"
        "s = cp_model.CpSolver(); st = s.solve(m)\n"
        "print(st == cp_model.OPTIMAL, int(s.objective_value))\n"
    )
    # by hand: 2x + 3y <= 12 over integers, x + y largest at x = 6, y = 0 (6)
    assert lines == ["True", "True False", "False False", "True 6"]


def test_prefetch_after_the_import_does_nothing() -> None:
    lines = _run(
        "from madmax_opt.search import ortools_import as oi\n"
        "oi.load_cp_model(); oi.prefetch()\n"
        "print(oi._prefetch is None)\n"
    )
    assert lines == ["True"]
