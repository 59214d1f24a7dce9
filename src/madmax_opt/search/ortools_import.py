"""OR-Tools' CP-SAT module without pandas at import time (issue 26).

``ortools.sat.python.cp_model`` imports pandas at its top (0.4-0.5 s of a 0.6 s import on the 2-core machine) for
its ``*_series`` helpers and ``Values`` / ``BooleanValues``: at import it only reads ``pd.Index`` and ``pd.Series``
(in annotations and one type alias), and every other use is inside those helpers, at call time. No search of this
package calls them. :func:`load_cp_model` imports the module with a stand-in for pandas that holds two placeholder
classes for those annotations, takes the stand-in out of ``sys.modules`` at once (a later ``import pandas`` anywhere
gets the real package), and points the module's ``pd`` at a proxy that imports the real pandas on first use, so the
series helpers still work, only later. Where pandas is already imported, or the stand-in is not enough for this
OR-Tools version (anything but ``Index`` / ``Series`` read at import), the ordinary import runs.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _LazyPandas:
    """The real pandas, imported on first attribute access (cp_model's series helpers)."""

    def __getattr__(self, name: str) -> Any:
        import pandas

        return getattr(pandas, name)


def _stand_in() -> types.ModuleType:
    mod = types.ModuleType("pandas", "placeholder while ortools.sat.python.cp_model is imported")
    mod.Index = type("Index", (), {})  # type: ignore[attr-defined]
    mod.Series = type("Series", (), {})  # type: ignore[attr-defined]
    return mod


def load_cp_model() -> types.ModuleType:
    """``ortools.sat.python.cp_model``, imported without pandas when that is possible (see the module docstring)."""
    name = "ortools.sat.python.cp_model"
    if name in sys.modules:
        return sys.modules[name]
    if "pandas" not in sys.modules:
        stand_in = sys.modules["pandas"] = _stand_in()
        try:
            from ortools.sat.python import cp_model

            cp_model.pd = _LazyPandas()
            return cp_model
        except (AttributeError, ImportError):  # a newer OR-Tools reads more of pandas at import: the ordinary way
            sys.modules.pop(name, None)
        finally:
            if sys.modules.get("pandas") is stand_in:
                del sys.modules["pandas"]
    from ortools.sat.python import cp_model

    return cp_model
