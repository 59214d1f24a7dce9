"""What-if hardware: a variant of a catalog system by ``scale`` / ``set`` of named parameters, validated.

``derive: {from: dgx-h100, scale: {nic_bandwidth: 2.0, hbm_capacity: 1.5}, set: {nvlink_domain: 72}}`` in a
problem file stands for a DGX H100 with twice the NIC bandwidth, 1.5x the HBM and a 72-GPU NVLink domain. The
names users write (``PARAMETERS``) map onto System / GPU fields in SI units:

    nic_*      the outermost network tier (scale-out), nvlink_* the innermost tier (scale-up domain, tier 0)
    hbm_*      the GPU's HBM; peak_flops scales every precision alike; power and price are per GPU

A derived system and GPU are renamed after the changes that take effect (``dgx-h100+nic_bandwidth*2``), so a
variant whose every factor is 1.0 is the catalog entry itself, name included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, create_model

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog
from madmax_opt.model.spec import GPU, Strict, System, Tier

Hardware = tuple[System, GPU]


@dataclass(frozen=True)
class Parameter:
    """One hardware parameter users may scale or set: where it lives and which values are possible."""

    name: str
    what: str
    unit: str  # SI unit of the value
    human: tuple[str, float]  # (unit, divisor) for reports: ("GB/s", 1e9)
    kind: str  # positive | non_negative | fraction | domain
    better: int  # +1: larger helps throughput, -1: smaller helps, 0: no effect on step time
    get: Callable[[System, GPU], float]
    put: Callable[[System, GPU, float], Hardware]


def _tier(system: System, index: int, **update: Any) -> System:
    tiers = list(system.tiers)
    tiers[index] = tiers[index].model_copy(update=update)
    return system.model_copy(update={"tiers": tiers})


def _scale_up(system: System) -> Tier:
    """Tier 0, the scale-up domain (NVLink); a one-tier system (a flat network) has none."""
    if system.tiers[0].size is None:
        raise _NoScaleUp(system.name)
    return system.tiers[0]


class _NoScaleUp(Exception):
    pass


def _peak(gpu: GPU) -> float:
    """Reference peak: bf16 when the GPU has it (the training precision), else its largest dense peak."""
    return float(gpu.peak_flops.get("bf16", max(gpu.peak_flops.values())))


def _with_peak(system: System, gpu: GPU, value: float) -> Hardware:
    ratio = value / _peak(gpu)  # every precision scales alike: a faster clock or more tensor cores
    peaks = {k: v * ratio for k, v in gpu.peak_flops.items()}
    return system, gpu.model_copy(update={"peak_flops": peaks})


def _with_calibration(gpu: GPU, **update: Any) -> GPU:
    return gpu.model_copy(update={"calibration": gpu.calibration.model_copy(update=update)})


PARAMETERS: dict[str, Parameter] = {
    p.name: p
    for p in (
        Parameter("nic_bandwidth", "scale-out (outermost tier) bandwidth per GPU, one direction", "B/s",
                  ("GB/s", 1e9), "positive", +1,
                  lambda s, g: s.tiers[-1].bw, lambda s, g, v: (_tier(s, -1, bw=v), g)),
        Parameter("nic_latency", "scale-out per-collective latency", "s", ("us", 1e-6), "non_negative", -1,
                  lambda s, g: s.tiers[-1].latency_s, lambda s, g, v: (_tier(s, -1, latency_s=v), g)),
        Parameter("nvlink_bandwidth", "scale-up (NVLink, tier 0) bandwidth per GPU, one direction", "B/s",
                  ("GB/s", 1e9), "positive", +1,
                  lambda s, g: _scale_up(s).bw, lambda s, g, v: (_tier(s, 0, bw=v), g)),
        Parameter("nvlink_latency", "scale-up per-collective latency", "s", ("us", 1e-6), "non_negative", -1,
                  lambda s, g: _scale_up(s).latency_s, lambda s, g, v: (_tier(s, 0, latency_s=v), g)),
        Parameter("nvlink_domain", "GPUs in one scale-up (NVLink) domain", "GPUs", ("GPUs", 1.0), "domain", +1,
                  lambda s, g: float(_scale_up(s).size or 0), lambda s, g, v: (_tier(s, 0, size=round(v)), g)),
        Parameter("hbm_capacity", "HBM capacity per GPU", "B", ("GB", 1e9), "positive", +1,
                  lambda s, g: g.hbm_bytes, lambda s, g, v: (s, g.model_copy(update={"hbm_bytes": v}))),
        Parameter("hbm_bandwidth", "HBM bandwidth per GPU", "B/s", ("TB/s", 1e12), "positive", +1,
                  lambda s, g: g.hbm_bw, lambda s, g, v: (s, g.model_copy(update={"hbm_bw": v}))),
        Parameter("peak_flops", "dense peak FLOP/s per GPU (bf16; every precision scales alike)", "FLOP/s",
                  ("TFLOP/s", 1e12), "positive", +1, lambda s, g: _peak(g), _with_peak),
        Parameter("power", "wall power per GPU incl. host share", "W", ("W", 1.0), "positive", 0,
                  lambda s, g: s.power_w_per_gpu,
                  lambda s, g, v: (s.model_copy(update={"power_w_per_gpu": v}), g)),
        Parameter("price", "price per GPU-hour", "USD/GPU-h", ("$/GPU-h", 1.0), "non_negative", 0,
                  lambda s, g: s.price_per_gpu_hour,
                  lambda s, g, v: (s.model_copy(update={"price_per_gpu_hour": v}), g)),
        # efficiencies: what-if software/firmware (NCCL, kernels); <= 1 by definition
        Parameter("nic_efficiency", "achieved fraction of the scale-out bandwidth", "1", ("", 1.0), "fraction", +1,
                  lambda s, g: s.tiers[-1].efficiency, lambda s, g, v: (_tier(s, -1, efficiency=v), g)),
        Parameter("nvlink_efficiency", "achieved fraction of the scale-up bandwidth", "1", ("", 1.0), "fraction",
                  +1, lambda s, g: _scale_up(s).efficiency, lambda s, g, v: (_tier(s, 0, efficiency=v), g)),
        Parameter("gemm_efficiency", "fraction of peak reached by large GEMMs", "1", ("", 1.0), "fraction", +1,
                  lambda s, g: g.calibration.gemm_eff, lambda s, g, v: (s, _with_calibration(g, gemm_eff=v))),
        Parameter("hbm_efficiency", "fraction of HBM bandwidth reached by memory-bound kernels", "1", ("", 1.0),
                  "fraction", +1,
                  lambda s, g: g.calibration.hbm_eff, lambda s, g, v: (s, _with_calibration(g, hbm_eff=v))),
    )
}
# the hardware parameters of a sensitivity study (efficiencies are software, not hardware)
HARDWARE_PARAMETERS: tuple[str, ...] = (
    "nic_bandwidth", "nic_latency", "nvlink_bandwidth", "nvlink_latency", "nvlink_domain",
    "hbm_capacity", "hbm_bandwidth", "peak_flops", "power", "price",
)
GPU_PARAMETERS = frozenset({"hbm_capacity", "hbm_bandwidth", "peak_flops", "gemm_efficiency", "hbm_efficiency"})

_ALLOWED = ", ".join(PARAMETERS)

_FROM_FIELD: dict[str, Any] = {"from": (str, Field(description="catalog system to start from"))}
_DeriveFrom: Any = create_model("_DeriveFrom", __base__=Strict, **_FROM_FIELD)  # "from" is a Python keyword


class Derive(_DeriveFrom):
    """A hardware variant: a catalog system with parameters scaled (factors) and/or set (SI values)."""

    scale: dict[str, float] = Field(
        default_factory=dict,
        description=f"parameter -> factor > 0 (parameters: {_ALLOWED})",
        json_schema_extra={"propertyNames": {"enum": list(PARAMETERS)}},
    )
    set: dict[str, float] = Field(
        default_factory=dict,
        description="parameter -> new value in SI units (B/s, s, B, FLOP/s, W, USD/GPU-h; nvlink_domain in GPUs)",
        json_schema_extra={"propertyNames": {"enum": list(PARAMETERS)}},
    )
    name: str | None = Field(None, description="name of the variant (default: from + the changes)")

    @property
    def source(self) -> str:
        return str(getattr(self, "from"))


def derive_hardware(d: Derive, *, file: str | None, field: str) -> Hardware:
    """The (system, GPU) a ``derive`` mapping describes; one-line ProblemErrors naming the field."""
    system: System = catalog.lookup("system", d.source, file=file, field=f"{field}.from")
    gpu: GPU = catalog.lookup("gpu", system.gpu, file=file, field=f"{field}.from")
    system, gpu = derive_variant(system, gpu, scale=d.scale, values=d.set, file=file, field=field)
    if d.name is not None:
        system = system.model_copy(update={"name": d.name})
    return system, gpu


def derive_variant(
    system: System,
    gpu: GPU,
    *,
    scale: Mapping[str, float] | None = None,
    values: Mapping[str, float] | None = None,
    file: str | None = None,
    field: str = "derive",
) -> Hardware:
    """Apply ``scale`` (new = old x factor) then ``values`` (new = value) and validate the result."""
    scale, values = dict(scale or {}), dict(values or {})
    for key, given in (("scale", scale), ("set", values)):
        for name in given:
            if name not in PARAMETERS:
                raise ProblemError(f"unknown parameter {name!r}; allowed: {_ALLOWED}", file=file,
                                   field=f"{field}.{key}.{name}")
    for name in scale.keys() & values.keys():
        raise ProblemError("given in both scale and set; allowed: one of them", file=file, field=f"{field}.set.{name}")
    changes: list[str] = []
    gpu_changes: list[str] = []
    for key, given in (("scale", scale), ("set", values)):
        for name, number in given.items():
            where = f"{field}.{key}.{name}"
            p = PARAMETERS[name]
            if not math.isfinite(number) or (key == "scale" and number <= 0.0):
                raise ProblemError(f"factor {number:g} is not possible; allowed: a number > 0", file=file, field=where)
            try:
                old = p.get(system, gpu)
            except _NoScaleUp:
                raise ProblemError(
                    f"{system.name} has one network tier (no scale-up domain); allowed: the parameters "
                    f"{', '.join(n for n in PARAMETERS if not n.startswith('nvlink'))}",
                    file=file, field=where,
                ) from None
            new = old * number if key == "scale" else number
            _check(p, old, new, number if key == "scale" else None, system, where, file)
            if new == old:
                continue  # a factor of 1.0 (or the current value) changes nothing, not even the name
            system, gpu = p.put(system, gpu, new)
            label = f"{name}*{number:g}" if key == "scale" else f"{name}={number:g}"
            changes.append(label)
            if name in GPU_PARAMETERS:
                gpu_changes.append(label)
    if gpu_changes:
        gpu = gpu.model_copy(update={"name": "+".join([gpu.name, *gpu_changes])})
    if changes:
        system = system.model_copy(update={"name": "+".join([system.name, *changes]), "gpu": gpu.name})
    return _validated(system, gpu, file=file, field=field)


def _check(p: Parameter, old: float, new: float, factor: float | None, system: System, where: str,
           file: str | None) -> None:
    """Reject impossible values: non-positive sizes and rates, efficiencies above 1, domains the tiers cannot nest."""
    got = f"{old:g} x {factor:g} = {new:g}" if factor is not None else f"got {new:g}"
    if p.kind == "positive" and new <= 0.0:
        raise ProblemError(f"{p.name} must be > 0 ({got}); allowed: a number > 0", file=file, field=where)
    if p.kind == "non_negative" and new < 0.0:
        raise ProblemError(f"{p.name} must be >= 0 ({got}); allowed: a number >= 0", file=file, field=where)
    if p.kind == "fraction" and not 0.0 < new <= 1.0:
        limit = f"a factor <= {1.0 / old:.4g}" if factor is not None else "a number in (0, 1]"
        raise ProblemError(f"an efficiency must be in (0, 1] ({got}); allowed: {limit}", file=file, field=where)
    if p.kind == "domain":
        fits, allowed = _domain_rule(system)
        if new != round(new) or not fits(round(new)):
            raise ProblemError(
                f"an NVLink domain of {new:g} GPUs does not nest with the tiers"
                + (f" ({got})" if factor is not None else "") + f"; allowed: {allowed}",
                file=file, field=where,
            )


def _domain_rule(system: System) -> tuple[Callable[[int], bool], str]:
    """Scale-up domain sizes the tiers can nest: >= 2 GPUs, a divisor or a multiple of the GPUs per node, and
    (with a middle tier) a proper divisor of the next tier's size (spec.System: each tier a multiple of the last)."""
    node = system.gpus_per_node
    nxt = system.tiers[1].size if len(system.tiers) > 2 else None

    def fits(d: int) -> bool:
        return d >= 2 and (node % d == 0 or d % node == 0) and (nxt is None or (d < nxt and nxt % d == 0))

    if nxt is not None:
        return fits, f"one of {', '.join(str(d) for d in range(2, nxt) if fits(d))} (nests in the next tier of {nxt})"
    divisors = [str(d) for d in range(2, node) if fits(d)]
    return fits, f"a multiple of gpus_per_node {node}" + (f" or one of {', '.join(divisors)}" if divisors else "")


def _validated(system: System, gpu: GPU, *, file: str | None, field: str) -> Hardware:
    """Re-validate the derived entries against the catalog schema (tier nesting, bounds)."""
    try:
        return System.model_validate(system.model_dump()), GPU.model_validate(gpu.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ProblemError(f"the derived hardware is not possible: {first['msg']}", file=file, field=field) from None


def parameter_value(name: str, system: System, gpu: GPU) -> float | None:
    """The current value of a parameter (SI), or None where the system has no such part."""
    try:
        return PARAMETERS[name].get(system, gpu)
    except _NoScaleUp:
        return None
