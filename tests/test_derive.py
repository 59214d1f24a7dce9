"""What-if hardware (``derive``): values by hand from the catalog YAML, identity at factor 1, one-line errors.

Expected numbers are read from the catalog data file with plain YAML (not through ``madmax_opt.io.catalog``) and
multiplied here by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_helpers import run_main
from madmax_opt.core.errors import ProblemError
from madmax_opt.io import calibration, catalog
from madmax_opt.io.derive import HARDWARE_PARAMETERS, PARAMETERS, derive_variant
from madmax_opt.io.problem import load_problem, problem_from_dict
from madmax_opt.io.problem_file import ProblemFile
from madmax_opt.model.spec import Tier
from madmax_opt.search.solver import solve_records

CATALOG = Path(__file__).resolve().parent.parent / "src" / "madmax_opt" / "data"
SYSTEMS = yaml.safe_load((CATALOG / "systems.yaml").read_text())
GPUS = yaml.safe_load((CATALOG / "gpus.yaml").read_text())
SMALL_TASK = {"seq_len": 2048, "global_batch": 16}


def problem_with(hardware: dict[str, Any], model: str = "llama2-7b") -> dict[str, Any]:
    return {"model": model, "hardware": hardware, "task": SMALL_TASK, "space": {"cp": 1, "vpp": 1}}




def test_the_issue_example_scales_and_sets_the_named_fields() -> None:
    derive = {"from": "dgx-h100", "scale": {"nic_bandwidth": 2.0, "hbm_capacity": 1.5}, "set": {"nvlink_domain": 72}}
    option = problem_from_dict(problem_with({"derive": derive, "gpus": 8})).hardware[0]
    h100, gpu = SYSTEMS["dgx-h100"], GPUS["h100-sxm"]
    assert option.system.tiers[-1].bw == 2.0 * h100["tiers"][1]["bw"] == 100e9
    assert option.system.tiers[0].size == 72
    assert option.gpu.hbm_bytes == 1.5 * gpu["hbm_bytes"] == 1.5 * 80 * 2**30
    # everything else is the catalog entry's
    assert option.system.tiers[0].bw == h100["tiers"][0]["bw"]
    assert option.system.tiers[-1].latency_s == h100["tiers"][1]["latency_s"]
    assert option.system.price_per_gpu_hour == h100["price_per_gpu_hour"]
    assert option.gpu.hbm_bw == gpu["hbm_bw"]
    assert option.gpu.peak_flops == gpu["peak_flops"]
    assert option.system.name == "dgx-h100+nic_bandwidth*2+hbm_capacity*1.5+nvlink_domain=72"
    assert option.gpu.name == "h100-sxm+hbm_capacity*1.5"


@pytest.mark.parametrize(
    ("param", "factor", "where", "expected"),
    [
        ("nic_latency", 0.5, ("system", "tiers", -1, "latency_s"), 10e-6),
        ("nvlink_bandwidth", 4.0, ("system", "tiers", 0, "bw"), 1800e9),
        ("nvlink_latency", 2.0, ("system", "tiers", 0, "latency_s"), 20e-6),
        ("nvlink_domain", 0.5, ("system", "tiers", 0, "size"), 4),
        ("hbm_bandwidth", 2.0, ("gpu", "hbm_bw"), 6.7e12),
        ("power", 0.5, ("system", "power_w_per_gpu"), 637.5),
        ("price", 2.0, ("system", "price_per_gpu_hour"), 9.84),
        ("nic_efficiency", 1.1, ("system", "tiers", -1, "efficiency"), 0.99),
        # x 1.25 on top of the megatron-core fit (frameworks block) that prices the default stack
        ("gemm_efficiency", 1.25, ("gpu", "calibration", "gemm_eff"),
         1.25 * GPUS["h100-sxm"]["frameworks"]["megatron-core"]["gemm_eff"]),
    ],
)
def test_each_parameter_lands_on_its_field(param: str, factor: float, where: tuple[Any, ...], expected: float) -> None:
    option = problem_from_dict(problem_with({"derive": {"from": "dgx-h100", "scale": {param: factor}}, "gpus": 8}))
    value: Any = option.hardware[0]
    for step in where:
        value = value[step] if isinstance(step, int) else getattr(value, step)
    assert value == pytest.approx(expected, rel=1e-12)


def test_peak_flops_scales_every_precision_and_set_keeps_their_ratios() -> None:
    gpu = GPUS["h100-sxm"]["peak_flops"]
    scaled = problem_from_dict(problem_with({"derive": {"from": "dgx-h100", "scale": {"peak_flops": 2}}, "gpus": 8}))
    assert scaled.hardware[0].gpu.peak_flops == {k: 2 * v for k, v in gpu.items()}
    fixed = problem_from_dict(problem_with({"derive": {"from": "dgx-h100", "set": {"peak_flops": 1.5e15}}, "gpus": 8}))
    peaks = fixed.hardware[0].gpu.peak_flops
    assert peaks["bf16"] == pytest.approx(1.5e15, rel=1e-12)
    assert peaks["fp8"] == pytest.approx(1.5e15 * gpu["fp8"] / gpu["bf16"], rel=1e-12)


def test_every_factor_one_is_the_catalog_entry_itself() -> None:
    ones = {p: 1.0 for p in PARAMETERS}
    option = problem_from_dict(problem_with({"derive": {"from": "dgx-h100", "scale": ones}, "gpus": 8})).hardware[0]
    assert option.system == catalog.systems()["dgx-h100"]
    assert option.gpu == calibration.with_framework(catalog.gpus()["h100-sxm"], "megatron-core")
    same = {"nvlink_domain": 8, "price": SYSTEMS["dgx-h100"]["price_per_gpu_hour"]}
    option = problem_from_dict(problem_with({"derive": {"from": "dgx-h100", "set": same}, "gpus": 8})).hardware[0]
    assert option.system == catalog.systems()["dgx-h100"]


def test_a_derived_system_solves_like_the_same_system_written_inline() -> None:
    """The derived problem and an inline system with the hand-scaled numbers give the same optimum."""
    derived = problem_from_dict(problem_with(
        {"derive": {"from": "dgx-h100", "scale": {"nic_bandwidth": 0.25, "nvlink_bandwidth": 0.5}}, "gpus": 16}
    ))
    inline_system = dict(SYSTEMS["dgx-h100"], name="handmade")
    inline_system["tiers"] = [dict(inline_system["tiers"][0], bw=225e9), dict(inline_system["tiers"][1], bw=12.5e9)]
    inline = problem_from_dict(problem_with({"system": inline_system, "gpus": 16}))
    got, want = solve_records(derived)[1][0], solve_records(inline)[1][0]
    for key in ("step_time_s", "time_breakdown_s", "memory_bytes_per_gpu", "bottleneck_shares"):
        assert got[key] == want[key], key
    assert {k: v for k, v in got["plan"].items() if k != "system"} == {
        k: v for k, v in want["plan"].items() if k != "system"
    }


def test_derived_hardware_changes_the_optimum_in_the_expected_direction() -> None:
    base = solve_records(problem_from_dict(problem_with({"system": "dgx-h100", "gpus": 16})))[1][0]
    faster = solve_records(problem_from_dict(problem_with(
        {"derive": {"from": "dgx-h100", "scale": {"peak_flops": 2.0}}, "gpus": 16}
    )))[1][0]
    assert faster["tokens_per_s"] > base["tokens_per_s"]


def test_three_tier_domain_must_nest_in_the_middle_tier() -> None:
    base = catalog.systems()["dgx-h100"]
    tiers = [
        Tier(name="nvl", size=8, bw=450e9, latency_s=1e-5, efficiency=0.8),
        Tier(name="rail", size=64, bw=100e9, latency_s=1e-5, efficiency=0.9),
        Tier(name="spine", size=None, bw=50e9, latency_s=2e-5, efficiency=0.9),
    ]
    three = base.model_copy(update={"tiers": tiers})
    gpu = catalog.gpus()["h100-sxm"]
    ok, _ = derive_variant(three, gpu, values={"nvlink_domain": 32})
    assert ok.tiers[0].size == 32 and ok.tiers[1].size == 64
    with pytest.raises(ProblemError, match=r"nvlink_domain: .*allowed: one of 2, 4, 8, 16, 32 \(nests in the next"):
        derive_variant(three, gpu, values={"nvlink_domain": 72})


def test_a_flat_network_has_no_nvlink_parameters() -> None:
    flat = catalog.systems()["dgx-h100"].model_copy(
        update={"tiers": [Tier(name="ib", size=None, bw=50e9, latency_s=2e-5, efficiency=0.9)]}
    )
    with pytest.raises(ProblemError, match="has one network tier"):
        derive_variant(flat, catalog.gpus()["h100-sxm"], scale={"nvlink_bandwidth": 2.0})
    scaled, _ = derive_variant(flat, catalog.gpus()["h100-sxm"], scale={"nic_bandwidth": 2.0})
    assert scaled.tiers[0].bw == 100e9


BAD_DERIVES: list[tuple[str, str, str]] = [
    ("{from: dgx-h100, scale: {nic_bw: 2}}", "hardware.derive.scale.nic_bw", "unknown parameter 'nic_bw'; allowed: "
     + ", ".join(PARAMETERS)),
    ("{from: dgx-h100, scale: {nic_bandwidth: 0}}", "hardware.derive.scale.nic_bandwidth", "allowed: a number > 0"),
    ("{from: dgx-h100, scale: {hbm_capacity: -1.5}}", "hardware.derive.scale.hbm_capacity", "allowed: a number > 0"),
    ("{from: dgx-h100, set: {hbm_bandwidth: 0}}", "hardware.derive.set.hbm_bandwidth", "must be > 0"),
    ("{from: dgx-h100, set: {nic_latency: -1e-6}}", "hardware.derive.set.nic_latency", "allowed: a number >= 0"),
    ("{from: dgx-h100, set: {price: -2}}", "hardware.derive.set.price", "allowed: a number >= 0"),
    ("{from: dgx-h100, scale: {nic_efficiency: 2}}", "hardware.derive.scale.nic_efficiency",
     "(0.9 x 2 = 1.8); allowed: a factor <= 1.111"),
    ("{from: dgx-h100, set: {nvlink_efficiency: 1.2}}", "hardware.derive.set.nvlink_efficiency",
     "allowed: a number in (0, 1]"),
    ("{from: dgx-h100, set: {nvlink_domain: 12}}", "hardware.derive.set.nvlink_domain",
     "allowed: a multiple of gpus_per_node 8 or one of 2, 4"),
    ("{from: dgx-h100, set: {nvlink_domain: 7.5}}", "hardware.derive.set.nvlink_domain", "7.5 GPUs"),
    ("{from: dgx-h100, scale: {nvlink_domain: 0.125}}", "hardware.derive.scale.nvlink_domain", "(8 x 0.125 = 1)"),
    ("{from: dgx-h100, scale: {price: 2}, set: {price: 3}}", "hardware.derive.set.price",
     "given in both scale and set"),
    ("{from: dgx-h101}", "hardware.derive.from", "unknown system 'dgx-h101'; allowed: "),
    ("{scale: {price: 2}}", "hardware.derive.from", "required key missing"),
    ("{from: dgx-h100, bogus: 1}", "hardware.derive.bogus", "unknown key; allowed: from, name, scale, set"),
    ("{from: dgx-h100, scale: {price: cheap}}", "hardware.derive.scale.price", "wrong type"),
]


@pytest.mark.parametrize(("derive", "field", "message"), BAD_DERIVES)
def test_impossible_variants_are_one_line_errors_naming_file_and_field(
    tmp_path: Path, derive: str, field: str, message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"model: llama2-7b\nhardware: {{derive: {derive}, gpus: 8}}\ntask: {{seq_len: 2048, global_batch: 16}}\n")
    with pytest.raises(ProblemError) as err:
        load_problem(path)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"{path}: {field}: "), line
    assert message in line, line
    result = run_main("solve", path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and field in result.stderr


def test_derive_excludes_system_and_gpu(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model: llama2-7b\nhardware: {derive: {from: dgx-h100}, system: dgx-h100, gpus: 8}\n"
                    "task: {seq_len: 2048, global_batch: 16}\n")
    with pytest.raises(ProblemError, match=r"hardware: give derive alone .*allowed: one of system, gpu, derive"):
        load_problem(path)


def test_schema_documents_derive_with_its_parameters() -> None:
    schema = ProblemFile.model_json_schema()
    derive = schema["$defs"]["Derive"]
    assert derive["required"] == ["from"]
    assert set(derive["properties"]) == {"from", "scale", "set", "name"}
    assert derive["properties"]["scale"]["propertyNames"]["enum"] == list(PARAMETERS)
    assert set(HARDWARE_PARAMETERS) <= set(PARAMETERS) and len(HARDWARE_PARAMETERS) == 10
