"""DLRM recommendation models: lowering of a model to dense GEMMs and the GPU/node layout of a hardware option.

The cost model has two halves that meet in ``dlrm_dense.step_terms``: embeddings (``dlrm_embedding``: per-shard
coefficients that the exact evaluator sums in floats and the CP-SAT placement rounds once to integers; a collective
takes as long as its busiest GPU lane) and the dense part (``dlrm_dense``: bottom/top MLPs, interaction, optional
transformer and MoE blocks as GEMMs with DDP / FSDP / tensor-parallel collectives, vectorised over dense plans).
Embedding sharding follows TorchRec with FBGEMM's table-batched embedding kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from madmax_opt.core.numeric import IntArr
from madmax_opt.model.collectives import Tiers
from madmax_opt.model.dlrm_spec import DENSE_WEIGHT_BYTES, DLRMModel, DLRMStack
from madmax_opt.model.hardware import HardwareOption, HardwareTable

# =========================================================================================== lowering


@dataclass(frozen=True)
class DenseGemm:
    """y[rows, n] = x[rows, k] @ W[k, n] with ``rows = tokens`` per sample (1 for MLP layers)."""

    name: str
    k: int
    n: int
    tokens: int
    block: Literal["bottom", "top", "local"]  # local: replicated, never tensor-parallel (projection, transformer)
    row_parallel: bool = False  # TP: second GEMM of a column/row-parallel pair
    expert: bool = False

    @property
    def flops_per_sample(self) -> int:
        return 2 * self.k * self.n * self.tokens  # one MAC per weight per row

    @property
    def params(self) -> int:
        return self.k * self.n + self.n  # weights + bias


@dataclass(frozen=True)
class DLRMWorkload:
    model: DLRMModel
    gemms: tuple[DenseGemm, ...]
    interaction_flops_per_sample: float  # batched dot products (bmm over the feature vectors)
    interaction_dim: int  # smallest bmm dimension (GEMM efficiency)
    interaction_out: int  # top-MLP input width
    attn_flops_per_sample: float  # transformer block: QK^T and AV
    act_bytes: float  # dense activation element size
    act_bytes_per_sample: float  # activations kept for the backward pass
    elementwise_bytes_per_sample: float  # forward ReLU / norm traffic
    experts: int
    top_k: int

    @property
    def dense_params(self) -> int:
        """Parameters outside the experts (counted once)."""
        return sum(g.params for g in self.gemms if not g.expert)

    @property
    def expert_params(self) -> int:
        """All experts' parameters together."""
        return sum(g.params for g in self.gemms if g.expert) * self.experts

    @property
    def params(self) -> int:
        return self.dense_params + self.expert_params + self.model.embedding_params

    @property
    def dense_fwd_flops_per_sample(self) -> float:
        gemm = sum(g.flops_per_sample * (self.top_k if g.expert else 1) for g in self.gemms)
        return gemm + self.interaction_flops_per_sample + self.attn_flops_per_sample


def _mlp(name: str, block: Literal["bottom", "top"], k_in: int, widths: list[int], expert: bool) -> list[DenseGemm]:
    out, k = [], k_in
    for i, n in enumerate(widths):
        out.append(DenseGemm(f"{name}{i}", k, n, 1, block, row_parallel=i % 2 == 1, expert=expert))
        k = n
    return out


def lower(model: DLRMModel) -> DLRMWorkload:
    """A DLRM as dense GEMMs per sample, interaction FLOPs and activation bytes (embeddings: ``embedding_options``)."""
    act = DENSE_WEIGHT_BYTES[model.dense_precision]
    dims = {t.dim for t in model.tables}
    d = next(iter(dims)) if model.interaction == "dot" else model.bottom_mlp.width
    bottom_widths = [model.bottom_mlp.width] * (model.bottom_mlp.layers - 1) + [d]
    gemms = _mlp("bottom", "bottom", model.dense_features, bottom_widths, expert=False)
    features = model.n_tables + 1  # pooled embeddings + the bottom MLP output
    local: list[DenseGemm] = []
    if model.interaction == "dot":
        c = model.compressed_features
        if c is not None:  # Z[d, c] = E[d, F] @ W[F, c] per sample: a linear compression of the feature axis
            local.append(DenseGemm("compress", features, c, d, "local"))
        f = c or features
        inter_flops = 2.0 * f * f * d  # bmm of (f x d) by (d x f); the lower triangle is kept
        inter_dim = min(f, d)
        inter_out = f * (f - 1) // 2 + d
    else:
        inter_flops, inter_dim = 0.0, 1
        inter_out = sum(t.count * t.dim for t in model.tables) + model.bottom_mlp.width
    attn, act_tf = 0.0, 0.0
    if model.transformer is not None:
        tb = model.transformer
        h, s = tb.hidden, tb.seq_len
        local.append(DenseGemm("seq_in", d, h, s, "local"))
        for i in range(tb.layers):
            local += [DenseGemm(f"seq{i}_qkv", h, 3 * h, s, "local"), DenseGemm(f"seq{i}_proj", h, h, s, "local"),
                      DenseGemm(f"seq{i}_up", h, tb.ffn, s, "local"), DenseGemm(f"seq{i}_down", tb.ffn, h, s, "local")]
        attn = tb.layers * 4.0 * s * s * h  # QK^T and AV: 2*s*h FLOPs each per token, s tokens
        # Korthikanti et al. 2022 eq. (1) per token and layer, 34h + 5as bytes at 2-byte activations
        act_tf = tb.layers * s * (34.0 * h + 5.0 * tb.heads * s) * act / 2.0
        inter_out += h  # the block's mean-pooled output joins the top-MLP input
    moe = model.top_moe
    top_widths = [model.top_mlp.width] * (model.top_mlp.layers - 1) + [1]
    top = _mlp("top", "top", inter_out, top_widths[:-1], expert=moe is not None)
    top += [DenseGemm("top_out", top_widths[-2] if len(top_widths) > 1 else inter_out, 1, 1, "top",
                      row_parallel=len(top_widths) % 2 == 0)]
    if moe is not None:  # router: a (k x experts) GEMM per MoE layer
        top += [DenseGemm(f"router{i}", g.k, moe.experts, 1, "local") for i, g in enumerate(top) if g.expert]
    gemms = gemms + local + top
    top_k = moe.top_k if moe else 1
    # each GEMM keeps its input for the weight gradient and its output for the ReLU mask (fp32 or 16-bit)
    act_gemm = sum(g.tokens * (g.k + g.n) * act * (top_k if g.expert else 1) for g in gemms)
    act_inter = ((model.compressed_features or features) * d + inter_out) * act
    elem = sum(2.0 * g.tokens * g.n * act * (top_k if g.expert else 1) for g in gemms)  # ReLU: read + write
    return DLRMWorkload(
        model=model,
        gemms=tuple(gemms),
        interaction_flops_per_sample=inter_flops,
        interaction_dim=inter_dim,
        interaction_out=inter_out,
        attn_flops_per_sample=attn,
        act_bytes=act,
        act_bytes_per_sample=act_gemm + act_inter + act_tf,
        elementwise_bytes_per_sample=elem,
        experts=moe.experts if moe else 1,
        top_k=top_k,
    )


# ============================================================================================= layout


@dataclass(frozen=True)
class Layout:
    """One hardware option seen by the embedding model: N GPUs in M nodes of G (node = scale-up domain)."""

    option: HardwareOption
    gpus: int
    node: int  # G: GPUs per node in this job (the scale-up domain, or N when smaller)
    nodes: int  # M = N / G
    intra_bw: float  # effective one-way bytes/s per GPU inside a node (bandwidth x efficiency)
    inter_bw: float  # ... across nodes (the outermost tier)
    hbm_bw: float  # achieved HBM bytes/s (bandwidth x hbm_eff)
    capacity_bytes: float  # HBM minus the reserve
    tiers: Tiers  # the system's tiers for one plan column (collectives.*)

    @property
    def node_of(self) -> IntArr:
        return np.arange(self.gpus, dtype=np.int64) // self.node


def layout_of(option: HardwareOption, stack: DLRMStack) -> Layout:
    tiers = option.system.tiers
    size = tiers[0].size if len(tiers) > 1 else None
    node = min(size or option.gpus, option.gpus)
    if option.gpus % node:
        raise ValueError(f"{option.gpus} GPUs is not a whole number of {node}-GPU nodes")
    table = HardwareTable((option,))
    return Layout(
        option=option,
        gpus=option.gpus,
        node=node,
        nodes=option.gpus // node,
        intra_bw=tiers[0].bw * tiers[0].efficiency,
        inter_bw=tiers[-1].bw * tiers[-1].efficiency,
        hbm_bw=option.gpu.hbm_bw * option.gpu.calibration.hbm_eff,
        capacity_bytes=option.gpu.hbm_bytes * (1.0 - stack.memory_reserve_fraction),
        tiers=table.tiers(np.zeros(1, dtype=np.int64)),
    )
