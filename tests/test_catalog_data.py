"""Catalog defaults live in data: a GPU's standard node comes from data/gpus.yaml, and a GPU without one is a
one-line error naming the systems that hold it (issue 12: a GPU added to gpus.yaml alone crashed with KeyError)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io import catalog

DATA = Path(__file__).resolve().parents[1] / "src" / "madmax_opt" / "data"


def test_standard_node_of_every_gpu_is_read_from_the_data_file() -> None:
    raw = yaml.safe_load((DATA / "gpus.yaml").read_text())  # read independently of the catalog loader
    for name, fields in raw.items():
        if fields.get("standard_system") is not None:
            system = catalog.standard_system(name, file=None, field="hardware.gpu")
            assert system.name == fields["standard_system"]
            assert system.gpu == name


def test_a_gpu_without_a_standard_node_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = dict(catalog.gpus())
    gpus["new-gpu"] = gpus["h100-sxm"].model_copy(update={"name": "new-gpu", "standard_system": None})
    monkeypatch.setattr(catalog, "gpus", lambda: gpus)
    with pytest.raises(ProblemError, match="'new-gpu' has no standard node") as exc:
        catalog.standard_system("new-gpu", file="p.yaml", field="hardware.gpu")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("p.yaml: hardware.gpu:")


# ---------------------------------------------------------------------- checkpoints: hf_id / native_precision


def test_every_model_with_a_public_checkpoint_names_its_repository_and_dtype() -> None:
    raw = yaml.safe_load((DATA / "models.yaml").read_text())
    for name, fields in raw.items():
        # the two fields come together: a checkpoint has a dtype; a paper model has neither
        assert ("hf_id" in fields) == ("native_precision" in fields), name
        model = catalog.models()[name]
        assert model.hf_id == fields.get("hf_id")
        if model.hf_id is not None:
            owner, repo = model.hf_id.split("/")
            assert owner and repo
    # the checkpoints the issues name, with the dtypes of their config.json / quantization_config
    expect = {"deepseek-r1": ("deepseek-ai/DeepSeek-R1-0528", "fp8"), "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "fp8"),
              "gpt-oss-20b": ("openai/gpt-oss-20b", "mxfp4"), "gpt-oss-120b": ("openai/gpt-oss-120b", "mxfp4"),
              "llama2-70b": ("meta-llama/Llama-2-70b-hf", "fp16"), "gpt3-175b": (None, None)}
    for name, (hf_id, dtype) in expect.items():
        m = catalog.models()[name]
        assert (m.hf_id, m.native_precision) == (hf_id, dtype), name


def test_a_malformed_hf_id_is_refused() -> None:
    from pydantic import ValidationError

    fields = catalog.models()["llama3-8b"].model_dump()
    with pytest.raises(ValidationError, match="hf_id"):
        type(catalog.models()["llama3-8b"])(**{**fields, "hf_id": "not a repo id"})


def test_unknown_model_suggests_a_hugging_face_config() -> None:
    with pytest.raises(ProblemError, match=r"\{hf_config: config.json\}") as exc:
        catalog.lookup("model", "llama-9b", file="p.yaml", field="model")
    assert "\n" not in str(exc.value) and "allowed: " in str(exc.value)


# ---------------------------------------------------------------------------- parameter counts vs published


def _params(name: str) -> int:
    from madmax_opt.model.spec import Stack, Task
    from madmax_opt.model.workload import lower

    return lower(catalog.models()[name], Task(seq_len=2048, global_batch=8), Stack()).params


def _moe_total_by_hand(layers: int, hidden: int, q_dim: int, kv_dim: int, experts: int, expert_ffn: int,
                       vocab: int, bias: bool) -> int:
    """Total parameters of a SwiGLU MoE decoder with untied embeddings and RMSNorm, counted from the config."""
    attn = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + (q_dim + 2 * kv_dim + hidden if bias else 0)
    expert = 3 * hidden * expert_ffn + (2 * expert_ffn + hidden if bias else 0)
    router = hidden * experts + (experts if bias else 0)
    return layers * (attn + experts * expert + router + 2 * hidden) + 2 * vocab * hidden + hidden


def test_deepseek_r1_is_the_v3_architecture_under_its_own_name() -> None:
    r1, v3 = catalog.models()["deepseek-r1"], catalog.models()["deepseek-v3"]
    keep = {"name", "hf_id", "source"}
    assert r1.model_dump(exclude=keep) == v3.model_dump(exclude=keep)
    assert _params("deepseek-r1") == pytest.approx(671e9, rel=0.06)  # DeepSeek-V3 report: 671 B (MLA as MHA)


def test_gpt_oss_20b_parameters_match_the_model_card() -> None:
    # the real config (64 heads of 64, 8 KV heads; biases on attention, experts and router) counted by hand:
    real = _moe_total_by_hand(24, 2880, 64 * 64, 8 * 64, 32, 2880, 201088, bias=True)
    assert real == pytest.approx(20.91e9, rel=0.01)  # model card: 20.91 B total
    # the catalog approximates the attention with 40 heads of 72 (hidden / heads): within 1 % of the real total
    assert _params("gpt-oss-20b") == pytest.approx(real, rel=0.01)


# ------------------------------------------------------------------------------------------- new GPUs


@pytest.mark.parametrize(
    ("gpu", "system", "bf16_dense", "fp8_dense", "fp4_dense", "hbm_gb", "hbm_tb_s"),
    [
        # datasheet figures, converted independently: sparse rack/node figures / GPUs / 2, or dense / GPUs
        ("b300", "dgx-b300", 36e15 / 8 / 2, 72e15 / 8 / 2, 108e15 / 8, 2304 / 8, 8.0),  # HGX B300
        ("gb300", "gb300-nvl72", 360e15 / 72 / 2, 720e15 / 72 / 2, 1080e15 / 72, 288, 576 / 72),  # GB300 NVL72
        ("mi325x", "mi325x-platform", 2614.9e12 / 2, 5229.8e12 / 2, None, 256, 6.0),  # MI325X (sparse / 2)
        ("mi355x", "mi355x-platform", 5033.2e12 / 2, 10066.4e12 / 2, 20132.7e12 / 2, 288, 8.0),  # MI355X
        ("h100-pcie", "h100-pcie-server", 1513e12 / 2, 3026e12 / 2, None, 80, 2.0),  # H100 datasheet, PCIe
        ("h100-nvl", "h100-nvl-server", 1671e12 / 2, 3341e12 / 2, None, 94, 3.9),  # H100 datasheet, NVL
        ("l40s", "l40s-server", 362.05e12, 1466e12 / 2, None, 48, 0.864),  # L40S datasheet (BF16 given dense)
    ],
)
def test_new_gpus_carry_their_datasheet_figures(gpu: str, system: str, bf16_dense: float, fp8_dense: float,
                                               fp4_dense: float | None, hbm_gb: float, hbm_tb_s: float) -> None:
    g = catalog.gpus()[gpu]
    assert g.peak_flops["bf16"] == pytest.approx(bf16_dense, rel=1e-3)
    assert g.peak_flops["fp8"] == pytest.approx(fp8_dense, rel=1e-3)
    assert g.peak_flops.get("fp4") == (None if fp4_dense is None else pytest.approx(fp4_dense, rel=1e-3))
    assert g.hbm_bytes == hbm_gb * 2**30  # the catalog's convention: GB read as GiB
    assert g.hbm_bw == pytest.approx(hbm_tb_s * 1e12)
    assert "datasheet" in g.source
    s = catalog.standard_system(gpu, file=None, field="hardware.gpu")
    assert s.name == system and s.gpu == gpu and "Price" in s.source


def _dense_layer(hidden: int, q_dim: int, kv_dim: int, ffn: int, qkv_bias: bool = False) -> int:
    """One decoder layer counted from a config: Q, K, V, O projections, a gated (3-matrix) MLP, two norms."""
    return hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * ffn + 2 * hidden + (
        q_dim + 2 * kv_dim if qkv_bias else 0)


def _real(layers: int, layer: int, vocab: int, hidden: int, tied: bool) -> int:
    return layers * layer + (1 if tied else 2) * vocab * hidden + hidden


# name: (total counted by hand from the Hugging Face config, published total, how far the catalog's head_dim =
# hidden / heads approximation moves the total as its source says, as a fraction)
_E = 3 * 5120 * 8192  # one Llama 4 expert
REAL_CONFIGS: dict[str, tuple[int, float, float]] = {
    "llama3.1-8b": (_real(32, _dense_layer(4096, 4096, 1024, 14336), 128256, 4096, False), 8.03e9, 0.0),
    "llama3.1-70b": (_real(80, _dense_layer(8192, 8192, 1024, 28672), 128256, 8192, False), 70.6e9, 0.0),
    "llama3.3-70b": (_real(80, _dense_layer(8192, 8192, 1024, 28672), 128256, 8192, False), 70.6e9, 0.0),
    "qwen2.5-7b": (_real(28, _dense_layer(3584, 3584, 512, 18944, True), 152064, 3584, False), 7.61e9, 0.0),
    "qwen2.5-14b": (_real(48, _dense_layer(5120, 5120, 1024, 13824, True), 152064, 5120, False), 14.7e9, 0.0),
    "qwen2.5-32b": (_real(64, _dense_layer(5120, 5120, 1024, 27392, True), 152064, 5120, False), 32.5e9, 0.0),
    "qwen2.5-72b": (_real(80, _dense_layer(8192, 8192, 1024, 29568, True), 152064, 8192, False), 72.7e9, 0.0),
    "qwen3-8b": (_real(36, _dense_layer(4096, 4096, 1024, 12288), 151936, 4096, False), 8.2e9, 0.0),
    "qwen3-14b": (_real(40, _dense_layer(5120, 5120, 1024, 17408), 151936, 5120, False), 14.8e9, 0.0),
    "qwen3-32b": (_real(64, _dense_layer(5120, 8192, 1024, 25600), 151936, 5120, False), 32.8e9, -0.06),
    # Gemma reports embedding + non-embedding parameters of the text model (Gemma 2 / 3 reports, Table 1)
    "gemma2-9b": (_real(42, _dense_layer(3584, 4096, 2048, 14336), 256000, 3584, True), 0.918e9 + 8.324e9, -0.025),
    "gemma2-27b": (_real(46, _dense_layer(4608, 4096, 2048, 36864), 256000, 4608, True), 1.180e9 + 26.047e9, 0.012),
    "gemma3-12b": (_real(48, _dense_layer(3840, 4096, 2048, 15360), 262208, 3840, True), 1.012e9 + 10.759e9, -0.016),
    "gemma3-27b": (_real(62, _dense_layer(5376, 4096, 2048, 21504), 262208, 5376, True), 1.416e9 + 25.600e9, 0.047),
    "mixtral-8x22b": (_real(56, _dense_layer(6144, 6144, 1024, 0) + 8 * 3 * 6144 * 16384 + 6144 * 8, 32000, 6144,
                            False), 141e9, 0.0),
    # Scout: 16 routed + 1 shared expert in every layer; the published 109 B includes the vision encoder (< 2 %)
    "llama4-scout": (_real(48, _dense_layer(5120, 5120, 1024, 0) + 17 * _E + 5120 * 16, 202048, 5120, False),
                     109e9, 0.0),
    # Maverick: 24 MoE layers (128 routed + 1 shared) and 24 dense layers of FFN 16384; catalog: 48 x (64 + 1)
    "llama4-maverick": (24 * (_dense_layer(5120, 5120, 1024, 0) + 129 * _E + 5120 * 128)
                        + 24 * _dense_layer(5120, 5120, 1024, 16384) + 2 * 202048 * 5120 + 5120, 400e9, -0.008),
}


@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_new_models_match_their_published_parameter_counts(name: str) -> None:
    real, published, approximation = REAL_CONFIGS[name]
    # the config as published adds up to the model card's total (rounded there to 2-3 digits; Scout's card counts
    # the vision encoder too)
    assert real == pytest.approx(published, rel=0.02 if name == "llama4-scout" else 0.006)
    # the catalog entry is the config, up to the approximation its source states
    assert _params(name) / real - 1 == pytest.approx(approximation, abs=0.004)
    m = catalog.models()[name]
    assert m.hf_id is not None and m.native_precision == "bf16"


CLOUD_INSTANCES = {  # name: (GPU, $ per GPU-hour as the cited page gives it, date the page gives)
    "spheron-h200": ("h200-sxm", 4.54, "17 March 2026"),
    "spheron-b200": ("b200", 6.03, "17 March 2026"),
    "spheron-gb200": ("gb200", 9.08 / 2, "17 March 2026"),  # $9.08 per superchip of 2 GPUs
    "vultr-mi300x": ("mi300x", 1.85, "2026-05-18"),
    "azure-nd-mi300x-v5": ("mi300x", 6.00, "2026-05-18"),
}


@pytest.mark.parametrize("name", sorted(CLOUD_INSTANCES))
def test_cloud_instances_carry_an_on_demand_price_with_its_date(name: str) -> None:
    gpu, price, date = CLOUD_INSTANCES[name]
    s = catalog.systems()[name]
    assert s.gpu == gpu and s.price_per_gpu_hour == pytest.approx(price, abs=0.005)
    assert date in s.source and "on-demand" in s.source.replace("on demand", "on-demand")
    # the interconnect is the vendor node the instance rents: the same tiers as the GPU's standard node
    assert [(t.size, t.bw) for t in s.tiers] == [(t.size, t.bw) for t in
                                                catalog.standard_system(gpu, file=None, field="gpu").tiers]
    assert not name.startswith("cloud-")  # `cloud-*` is the MAD-Max paper's cloud table (problems/sweeps/cloud.yaml)


@pytest.mark.parametrize("kind", ["gpus", "systems", "models"])
def test_catalog_tables_at_80_columns_keep_names_whole(kind: str) -> None:
    from rich.console import Console

    from madmax_opt.report.catalog_report import print_catalog

    console = Console(width=80, record=True)
    print_catalog(kind, False, console)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    raw = yaml.safe_load((DATA / f"{kind}.yaml").read_text())  # the names, read independently
    for name in raw:
        assert f"│ {name} " in text, name
    if kind == "models":  # every checkpoint's repository whole, beside its model
        for name, fields in raw.items():
            if "hf_id" in fields:
                assert re.search(rf"│ {re.escape(name)}\s+│ {re.escape(fields['hf_id'])}\s+│", text), name
    if kind == "systems":
        for name, fields in raw.items():
            assert re.search(rf"│ {re.escape(name)}\s+│ {re.escape(fields['gpu'])}\s+│", text), name
