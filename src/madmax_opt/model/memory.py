"""Memory per GPU for training: weights, gradients, optimizer states, activations, temporary buffers (vectorised).

Mixed-precision Adam as Megatron-Core runs it (Korthikanti et al. 2022, Fig. 1; Rajbhandari et al. 2020, ZeRO):
bf16 weights (2 B), main gradients (4 B fp32, or 2 B), fp32 master weights + Adam m and v (12 B; 8 or 6 B with
bf16 optimizer states, ``OPTIMIZER_STATE_BYTES``) per parameter;
ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the weights over the data-parallel
group (dp x cp, Megatron's ``data_parallel_group_with_cp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.spec import RC

WEIGHT_BYTES = 2.0  # bf16 model weights
# Adam state per trainable parameter, by ``stack.optimizer_dtype``:
# fp32: fp32 master weights + m + v (Megatron-Core default; Rajbhandari et al. 2020, Sec. 3.1: 12 B);
# bf16-moments: fp32 master + bf16 m, v (Megatron-Core --use-precision-aware-optimizer --exp-avg-dtype bf16
#   --exp-avg-sq-dtype bf16, megatron/core/optimizer/optimizer_config.py);
# bf16: master copy, m and v all in the state dtype bf16 (Apex DistributedFusedAdam, dtype=bf16, store_params=True:
#   StateBucket allocates params_shard, exp_avg_shard, exp_avg_sq_shard in ``dtype``,
#   apex/contrib/optimizers/distributed_fused_adam.py @d571f3e), which NeMo 1.0's SFT recipe selects
#   (NeMo-Framework-Launcher launcher_scripts/conf/peft/llama/sft.yaml @0da9ad9: optim.dtype bf16).
OPTIMIZER_STATE_BYTES: dict[str, float] = {"fp32": 12.0, "bf16-moments": 8.0, "bf16": 6.0}
OPTIMIZER_BYTES = OPTIMIZER_STATE_BYTES["fp32"]
LOGIT_BYTES = 4.0  # fp32 logits kept for the cross-entropy backward (vocab-parallel)


@dataclass(frozen=True)
class MemoryTerms:
    weights: Arr
    gradients: Arr
    optimizer: Arr
    activations: Arr
    temporary: Arr

    @cached_property
    def total(self) -> Arr:
        """weights + gradients + optimizer + activations + temporary, summed once per instance (the record
        builders read it once per plan: recomputing it per access made ``to_records`` quadratic)."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.temporary


def model_state_bytes(
    params: Arr,
    trainable: Arr,
    zero: NDArray[np.int64] | Arr,
    shard: Arr | float,
    grad_bytes: float,
    optimizer_bytes: float = OPTIMIZER_BYTES,
) -> tuple[Arr, Arr, Arr]:
    """(weights, gradients, optimizer) bytes per GPU for ``params`` local parameters (``trainable`` of them):
    2 P / (d if ZeRO-3), g T / (d if ZeRO >= 2), o T / (d if ZeRO >= 1) (Rajbhandari et al. 2020, Sec. 5), with
    o the Adam state bytes per parameter (``OPTIMIZER_STATE_BYTES``)."""
    weights = params * WEIGHT_BYTES / np.where(zero >= 3, shard, 1.0)
    gradients = trainable * grad_bytes / np.where(zero >= 2, shard, 1.0)
    optimizer = trainable * optimizer_bytes / np.where(zero >= 1, shard, 1.0)
    return weights, gradients, optimizer


def layer_activation_bytes(
    tokens: Arr,
    tp: Arr,
    sp: NDArray[Any],
    recompute: NDArray[Any],
    replicated_per_token: float,
    tp_sharded_per_token: float,
    score_per_token: Arr,
    input_per_token: float,
) -> tuple[Arr, Arr]:
    """(stored, working) activation bytes of one layer for one micro-batch of ``tokens`` tokens on one GPU.

    none:      tokens * (R / (t if SP) + S / t + A_scores / t)   (Korthikanti eq. (1)-(5), generalised)
    selective: drops the attention-score term (recomputed)
    full:      only the layer input, tokens * 2h / (t if SP); the working set of one layer is rebuilt in backward
    ``recompute`` is 0/1/2 for none/selective/full.
    """
    sp_div = np.where(sp > 0, tp, 1.0)
    full_store = tokens * (replicated_per_token / sp_div + tp_sharded_per_token / tp + score_per_token / tp)
    selective = full_store - tokens * score_per_token / tp
    inputs = tokens * input_per_token / sp_div
    stored = np.select([recompute == RC.NONE, recompute == RC.SELECTIVE], [full_store, selective], inputs)
    working = np.where(recompute == RC.FULL, full_store, 0.0)
    return stored, working


def op_sac_layer_bytes(
    tokens: Arr, tp: Arr, sp: NDArray[Any], replicated_per_token: float, tp_sharded_per_token: float,
    unsharded_per_token: float,
) -> Arr:
    """Stored activation bytes of one layer for one micro-batch under torchtitan's op-level selective AC:
    tokens * (R / (t if SP) + S / t + U) (the per-token sets: ``workload.op_sac_bytes``)."""
    sp_div = np.where(sp > 0, tp, 1.0)
    return tokens * (replicated_per_token / sp_div + tp_sharded_per_token / tp + unsharded_per_token)
