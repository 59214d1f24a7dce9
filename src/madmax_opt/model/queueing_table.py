"""The queueing model's inputs per serving plan (``ServiceTable``, built from the closed-form serving model by
``service_table``) and its outputs at one arrival rate (``OnlineLatency``); the model is ``model/queueing.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.inference import InferenceTerms, ServingArrays, ServingWorkload

PERCENTILES: tuple[int, ...] = (50, 90, 99)


@dataclass(frozen=True)
class ServiceTable:
    """Per plan (one row each): what the queueing model needs from the closed-form serving model."""

    cap: Arr  # c: running sequences per decode replica
    n_grid: Arr  # (N, G) running batch sizes where the decode round was evaluated (non-decreasing)
    t_grid: Arr  # (N, G) decode round time there, s
    prefill_s: Arr  # P: replica time per admitted prompt (share-weighted over the request mix), s
    first_token_extra_s: Arr  # delta: lone-prompt prefill latency beyond P (pipeline fill), s
    replicas: Arr  # decode replicas the arrivals are split over
    outputs: Arr  # (S,) output tokens of each request shape
    shares: Arr  # (S,) request shares

    def __len__(self) -> int:
        return int(self.cap.shape[0])

    def row(self, i: int) -> ServiceTable:
        return self.take(np.array([i]))

    def take(self, rows: NDArray[np.int64]) -> ServiceTable:
        """The plans at ``rows`` (repeats allowed), the request mix unchanged."""
        per_plan = {f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name not in ("outputs", "shares")}
        return ServiceTable(**per_plan, outputs=self.outputs, shares=self.shares)

    @property
    def mean_decode_iterations(self) -> float:
        """E[o] - 1: decode iterations a request spends in the running batch."""
        return float(np.sum(self.shares * (self.outputs - 1.0)))

    @cached_property
    def _segments(self) -> tuple[Arr, Arr, Arr, NDArray[np.int64], Arr, Arr, NDArray[np.int64]]:
        """The grid flattened, the slope of each grid interval (N, G - 1), each row's offset into the flat grid,
        the grid's ends and the row numbers: computed once per table (``decode_s`` runs in every step of the
        model's bisections)."""
        g, t = self.n_grid, self.t_grid
        dn = g[:, 1:] - g[:, :-1]
        slopes = np.where(dn > 0, (t[:, 1:] - t[:, :-1]) / np.where(dn > 0, dn, 1.0), 0.0)
        rows = np.arange(len(g), dtype=np.int64)
        return (np.ravel(g), np.ravel(t), np.ravel(slopes), rows * (g.shape[1] - 1), np.ascontiguousarray(g[:, 0]),
                np.ascontiguousarray(g[:, -1]), rows)

    def decode_s(self, n: Arr) -> tuple[Arr, Arr]:
        """t_dec(n) by linear interpolation on the grid (n >= 1; clamped to the grid) and its slope d t / d n."""
        g = self.n_grid
        flat_g, flat_t, slopes, row0, g_first, g_last, rows = self._segments
        n = np.minimum(np.maximum(n, g_first), g_last)
        idx = np.minimum(np.maximum((g <= n[:, None]).sum(axis=1) - 1, 0), g.shape[1] - 2)
        seg = row0 + idx  # interval idx of each row; its left grid point is at seg + row in the flat grid
        left = seg + rows
        slope = slopes[seg]
        return flat_t[left] + slope * (n - flat_g[left]), slope

    @cached_property
    def _limits(self) -> tuple[Arr, Arr]:
        """t_dec(c) and lambda_max, computed once per table (read-only)."""
        t_c, _ = self.decode_s(self.cap)
        rate = self.cap / (self.mean_decode_iterations * t_c + self.cap * self.prefill_s)
        t_c.setflags(write=False)
        rate.setflags(write=False)
        return t_c, rate

    def decode_at_cap_s(self) -> Arr:
        """t_dec(c), the decode round of a full batch (read-only)."""
        return self._limits[0]

    def max_rate_per_replica(self) -> Arr:
        """lambda_max = c / ((E[o] - 1) t_dec(c) + c P): the rate at which the c slots are always busy (read-only)."""
        return self._limits[1]


@dataclass(frozen=True)
class OnlineLatency:
    """Latency distribution per plan at one arrival rate (SI units). Percentile columns follow PERCENTILES."""

    ttft_s: Arr  # (N, 3)
    tpot_s: Arr  # (N, 3)
    ttft_mean_s: Arr
    tpot_mean_s: Arr
    running: Arr  # mean running sequences per replica
    iteration_s: Arr  # mean iteration time
    wait_probability: Arr  # probability an arrival finds all c slots busy
    utilisation: Arr  # lambda / lambda_max
    stable: NDArray[np.bool_]

    def metric(self, name: str) -> Arr:
        """``ttft_p99_s``, ``tpot_p50_s``, ..., or the means ``ttft_s`` / ``tpot_s``."""
        if name in ("ttft_s", "tpot_s"):
            return np.asarray(getattr(self, name.replace("_s", "_mean_s")))
        kind, p, _ = name.split("_")
        return np.asarray(getattr(self, f"{kind}_s")[:, PERCENTILES.index(int(p[1:]))])


# ------------------------------------------------------------------------------------ from the serving model

GRID_POINTS = 12
OPEN_LOOP = 1 << 30  # offered concurrency of an open system: the running batch is set by the cap alone


def service_table(terms: Callable[[ServingArrays], InferenceTerms], plans: ServingArrays,
                  sw: ServingWorkload) -> ServiceTable:
    """The queueing inputs of each plan from the closed-form serving model ``terms`` (``ServingModel.terms``).
    Cap c = the running batch of an open system (min of the KV-cache max batch and max_num_seqs); the decode round
    is evaluated at GRID_POINTS running batches from 1 to c (quadratic spacing: the round is close to affine in n,
    the grid resolves the pipeline's micro-batch steps at small n); P and delta are read at the cap."""
    at_cap = terms(replace(plans, batch=np.full(len(plans), OPEN_LOOP, dtype=np.int64)))
    cap = np.maximum(at_cap.running_batch, 1.0)
    g = np.linspace(0.0, 1.0, GRID_POINTS) ** 2
    n_grid = np.rint(1.0 + (cap[:, None] - 1.0) * g[None, :])
    grid_plans = plans.take(np.repeat(np.arange(len(plans)), GRID_POINTS))
    grid_plans = replace(grid_plans, batch=n_grid.ravel().astype(np.int64))
    t_grid = terms(grid_plans).decode_step_s.reshape(len(plans), GRID_POINTS)
    per_prompt = at_cap.step["prefill"] * sw.mean_output / cap  # step["prefill"] = (B / E[o]) P at running B
    return ServiceTable(
        cap=cap,
        n_grid=n_grid,
        t_grid=t_grid,
        prefill_s=per_prompt,
        first_token_extra_s=np.maximum(at_cap.prefill_s - per_prompt, 0.0),
        replicas=(plans.dp - plans.prefill_dp).astype(np.float64),
        outputs=np.array([float(r.output_len) for r in sw.requests]),
        shares=np.asarray(sw.share, dtype=np.float64),
    )
