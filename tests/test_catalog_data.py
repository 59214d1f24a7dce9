"""Catalog defaults live in data: a GPU's standard node comes from data/gpus.yaml, and a GPU without one is a
one-line error naming the systems that hold it (issue 12: a GPU added to gpus.yaml alone crashed with KeyError)."""

from __future__ import annotations

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
