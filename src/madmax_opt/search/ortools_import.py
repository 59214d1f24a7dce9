"""OR-Tools' CP-SAT module without pandas at import time (issue 26).

``ortools.sat.python.cp_model`` imports pandas at its top (0.4-0.5 s of a 0.6 s import on the 2-core machine) for
its ``*_series`` helpers and ``Values`` / ``BooleanValues``: at import it only reads ``pd.Index`` and ``pd.Series``
(in annotations and one type alias), and every other use is inside those helpers, at call time. No search of this
package calls them. :func:`load_cp_model` imports the module with a stand-in for pandas that holds two placeholder
classes for those annotations, takes the stand-in out of ``sys.modules`` at once (a later ``import pandas`` anywhere
gets the real package), and points the module's ``pd`` at a proxy that imports the real pandas on first use, so the
series helpers still work, only later. Where pandas is already imported, or the stand-in is not enough for this
OR-Tools version (anything but ``Index`` / ``Series`` read at import), the ordinary import runs.

:func:`prefetch` lets a search that will build a model start mapping CP-SAT's shared libraries in a background
thread while it does its own numpy work (issue 26); :func:`load_cp_model` waits for it, then imports as above.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any

HELPER = "ortools.sat.python.cp_model_helper"  # CP-SAT's extension module: ~36 ms of dlopen (OR-Tools, abseil, protobuf)
# every extension module cp_model imports, mapped in this order (sorted_interval_list: ~3 ms more of the import)
EXTENSIONS = (HELPER, "ortools.util.python.sorted_interval_list")
_prefetch: threading.Thread | None = None


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


def _helper_path(module: str = HELPER) -> Path | None:
    """The file Python's import would load for the extension ``module`` of ortools (found without importing the
    ortools packages)."""
    spec = importlib.util.find_spec("ortools")
    *folders, name = module.split(".")[1:]
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(root, *folders, name + suffix)
            if path.is_file():
                return path
    return None


def prefetch() -> None:
    """Start mapping CP-SAT's shared libraries in a background thread, for a search that will build a model after
    some numpy work of its own: libc's ``dlopen`` called through ctypes runs without the GIL (Python's own import
    holds it), so on a machine with a free core the ~36 ms of loading overlap that work, and the import later finds
    the libraries loaded (only the module's initialisation, ~11 ms, is left). Nothing is imported here and no
    result depends on it: where the library or ``dlopen`` cannot be found this does nothing. The other extension
    modules of ``EXTENSIONS`` are mapped after it, in the same thread."""
    global _prefetch
    if _prefetch is not None or HELPER in sys.modules:
        return
    try:
        paths = [path for path in map(_helper_path, EXTENSIONS) if path is not None]
        dlopen = ctypes.CDLL(None).dlopen
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return
    if not paths or paths[0].name.split(".")[0] != HELPER.rsplit(".", 1)[1]:
        return
    dlopen.restype, dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    flags = sys.getdlopenflags()  # those of Python's own import, so that its dlopen finds these very mappings

    def load() -> None:
        for path in paths:
            dlopen(bytes(path), flags)

    _prefetch = threading.Thread(target=load, name="cp-sat-prefetch", daemon=True)
    _prefetch.start()


def load_cp_model() -> types.ModuleType:
    """``ortools.sat.python.cp_model``, imported without pandas when that is possible (see the module docstring)."""
    name = "ortools.sat.python.cp_model"
    if name in sys.modules:
        return sys.modules[name]
    if _prefetch is not None:
        _prefetch.join()  # the libraries are mapped (or the attempt is over): the import below is the usual one
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
