"""The package's layers, read from the import graph: no module imports a higher layer, no import cycles between
modules, typer and rich only in the command-line and report layers, and `--help` does not import the model."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "madmax_opt"
# Lowest first: a module may import its own layer or lower ones (README, "Architecture").
LAYERS = ("core", "model", "io", "analysis", "search", "launch", "fleet", "studies", "report", "cli")
UI_LAYERS = {"cli", "report"}
UI_LIBRARIES = ("typer", "rich")
# studies/sweep.py draws the sweep's progress bar with rich while it runs (no callback interface yet).
UI_EXCEPTIONS = {"madmax_opt.studies.sweep"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "madmax_opt" and parts[1] in LAYERS else None


def test_every_module_sits_in_a_known_layer() -> None:
    stray = [m for m in modules() if m != "madmax_opt" and layer(m) is None]
    assert stray == []


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for name, path in modules().items():
        mine = layer(name)
        if mine is None:
            continue
        for dep in imports(path):
            theirs = layer(dep)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{name} -> {dep}")
    assert upward == []


def test_no_import_cycles_between_modules() -> None:
    mods = modules()
    graph = {name: {d for d in imports(path) if d in mods and d != name} for name, path in mods.items()}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # package __init__ files import nothing, so a cycle here is a real module cycle
    assert cycles == []


def test_typer_and_rich_only_in_cli_and_report() -> None:
    offenders = []
    for name, path in modules().items():
        if layer(name) in UI_LAYERS or name in UI_EXCEPTIONS:
            continue
        for dep in imports(path):
            if dep.split(".")[0] in UI_LIBRARIES:
                offenders.append(f"{name} -> {dep}")
    assert offenders == []


def test_help_imports_no_domain_layer() -> None:
    """`madmax-opt --help` loads the command line only: no numpy, OR-Tools, pydantic models or matplotlib."""
    code = (
        "import sys\n"
        "from madmax_opt.cli.main import app\n"
        "try:\n    app(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('numpy', 'ortools', 'matplotlib', 'madmax_opt.model', 'madmax_opt.search')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "HEAVY []" in out.stdout
