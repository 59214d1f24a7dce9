"""Checks of a calibration overlay against the problem that names it: every entry must be able to apply.

An overlay (``calibration: cluster.yaml``, written by ``madmax-opt calibrate``) replaces the catalog's fit of each
(GPU, framework) it lists: its ``calibrations`` (training fits) in a training problem, its ``serving`` entries
(serving fits, replacing data/serving_calibration.yaml's) in an inference problem. Refused in one line (exit 2): a
GPU the catalog does not know, the same pair listed twice (which would win?), a fitted value beyond its bound, an
overlay none of whose entries of the problem's kind prices the problem.
Warned in one line (``InputWarning``, printed by the CLI): an entry for a GPU or framework the problem does not use
(one overlay file may serve several problems of a cluster)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from madmax_opt.core.errors import InputWarning, ProblemError
from madmax_opt.io import catalog
from madmax_opt.io.calibration import Overlay, OverlayEntry, ServingOverlayEntry
from madmax_opt.model.hardware import HardwareOption

# Bounds on fitted values, ~100x beyond the largest fit in the catalog (data/gpus.yaml: layer_overhead_s at most
# 4e-4 s, gemm_half_dim at most 320): a typo such as ``layer_overhead_s: 1e9`` is named here, not later as a plan
# that cannot meet some other field of the problem.
MAX_LAYER_OVERHEAD_S = 0.1
MAX_GEMM_HALF_DIM = 100_000.0


def check_overlay(overlay: Overlay, *, options: Sequence[HardwareOption], framework: str, training: bool,
                  file: str, overlay_file: str, field: str = "calibration") -> None:
    """Raise a one-line ProblemError for an overlay that cannot mean what it says; warn on entries that do not
    apply to this problem."""
    known = catalog.gpus()
    seen: dict[tuple[str, str], int] = {}
    section = "calibrations" if training else "serving"
    entries: Sequence[OverlayEntry | ServingOverlayEntry] = overlay.calibrations if training else overlay.serving
    for i, e in enumerate(entries):
        where = f"{section}[{i}]"
        if e.gpu not in known:
            raise ProblemError(f"unknown gpu {e.gpu!r}; allowed: a catalog GPU ({', '.join(sorted(known))})",
                               file=overlay_file, field=f"{where}.gpu")
        pair = (e.gpu, e.framework)
        if pair in seen:
            raise ProblemError(f"({e.gpu}, {e.framework}) is listed twice, in calibrations[{seen[pair]}] and here; "
                               "allowed: one entry per (gpu, framework)", file=overlay_file, field=where)
        seen[pair] = i
        if not isinstance(e, OverlayEntry):  # a serving entry: ServingParams bounds every value
            continue
        if e.layer_overhead_s is not None and e.layer_overhead_s > MAX_LAYER_OVERHEAD_S:
            raise ProblemError(f"{e.layer_overhead_s:g} s per layer is beyond the supported range; allowed: 0 to "
                               f"{MAX_LAYER_OVERHEAD_S:g} s (the catalog's fits: at most 4e-4 s)", file=overlay_file,
                               field=f"{where}.layer_overhead_s")
        if e.gemm_half_dim is not None and e.gemm_half_dim > MAX_GEMM_HALF_DIM:
            raise ProblemError(f"{e.gemm_half_dim:g} is beyond the supported range; allowed: 0 to "
                               f"{MAX_GEMM_HALF_DIM:g} (the catalog's fits: at most 320)", file=overlay_file,
                               field=f"{where}.gemm_half_dim")
    used = sorted({o.gpu.name.split("+", 1)[0] for o in options})  # a derived GPU (io/derive.py) is base+change
    applies = [pair for pair in seen if pair[0] in used and pair[1] == framework]
    if not applies:
        listed = ", ".join(f"({g}, {f})" for g, f in seen) or "none"
        raise ProblemError(f"no entry applies: its {section} lists {listed}, the problem runs {framework} on "
                           f"{', '.join(used)}; allowed: an overlay with an entry for one of "
                           f"{', '.join(f'({g}, {framework})' for g in used)}", file=file, field=field)
    unused = [f"({g}, {f})" for g, f in seen if (g, f) not in applies]
    if unused:
        warnings.warn(f"{overlay_file}: {len(unused)} overlay entr{'y' if len(unused) == 1 else 'ies'} not used by "
                      f"{file} ({framework} on {', '.join(used)}): {', '.join(unused)}", InputWarning, stacklevel=2)
