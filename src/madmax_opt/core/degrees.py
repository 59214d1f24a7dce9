"""The parallel degrees of a plan, part of the plan-settings registry (model/plan_settings.py re-exports them).

In core and free of imports so that io/limits.py, loaded when the command line starts, bounds every degree
without loading the plan models (`madmax-opt --help` loads no model module, tests/test_layers.py).
"""

from __future__ import annotations

# The parallel degrees: each sizes a process group (input files bound them like a GPU count).
PARALLEL_DEGREES: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep")
# The degrees base training and serving plans share (a serving plan has no context parallelism); a serving plan adds
# its own settings (search/serving_space.ServingPlan) and refuses every other training setting.
SHARED_DEGREES: tuple[str, ...] = tuple(d for d in PARALLEL_DEGREES if d != "cp")

__all__ = ["PARALLEL_DEGREES", "SHARED_DEGREES"]
