"""Online serving under Poisson arrivals: continuous batching as a queue; TTFT and TPOT percentiles (vectorised).

Iteration model (the same rules drive the reference simulation, ``analysis/serving_sim.py``):
- requests arrive as a Poisson process of rate lambda, split uniformly at random over the dp decode replicas (each
  replica sees Poisson(lambda / dp); round-robin routing would be less bursty, so this is the conservative side);
- a replica runs iterations; at the start of one it admits waiting requests first come first served while fewer
  than c sequences are running (c = min(plan batch, KV-cache max batch): vLLM ``max_num_seqs``, TensorRT-LLM
  ``max_batch_size``);
- an iteration with n running sequences and K admitted prompts takes T = t_dec(n) + K P: the decode round of the
  running batch plus the admitted prompts' prefill in the same mixed batch (Orca, Yu et al. 2022; Sarathi-Serve,
  Agrawal et al. 2024; vLLM chunked prefill). t_dec and P are the closed-form model's (``inference.py``: decode
  round at batch n, replica time per prefilled prompt); delta = lone-prompt prefill latency - P (pipeline fill);
- an admitted request gets its first token at the end of its admission iteration (+ delta), then one token per
  iteration for o - 1 iterations, and leaves. TTFT = first token - arrival; TPOT = (last - first token)/(o - 1).

Analytic approximations (each checked against the simulation in ``tests/test_online_serving.py``):
1. Mean field (Little's law): running sequences n = lambda (E[o] - 1) E[T], E[T] = t_dec(n) / (1 - lambda P)
   (prefill takes a share lambda P of the time). Stable while lambda < lambda_max = c / ((E[o]-1) t_dec(c) + c P).
2. TTFT, no queue: admitted prompts per iteration K form a Galton-Watson process with immigration (each prefill of
   P seconds lets Poisson(lambda P) arrivals in, each decode round Poisson(lambda t_dec)); K is taken negative
   binomial with its exact mean iota / (1 - m) and variance mean / (1 - m^2) (m = lambda P, iota = lambda t_dec).
   An arrival lands in a length-biased iteration (weight T_K), waits its uniform residual, then its own iteration
   of t_dec + P (1 + J) with J ~ Poisson(lambda T_K) others. An idle replica (probability e^-n, n Poisson) starts
   at once: TTFT = P + delta.
3. Queue when all c slots are busy: a waiting request meets a saturated replica, where every freed slot is refilled
   at once, so a slot of shape j turns over in S_j = m_j T_sat (E[S] = c / lambda_max). P(wait) = Erlang C of c
   slots under load c lambda / lambda_max (delay probability taken insensitive to the holding-time law); the wait
   given a wait is exponential with the M/G/c asymptotic decay rate eta = lambda (E[e^(eta S / c)] - 1), exact for
   M/M/c and M/D/c (``mgc_tail_rate``); TTFT = wait + the no-queue TTFT. This regime is the least accurate
   (results/validation/online_serving.md).
4. TPOT of a request of o tokens: t_dec averaged over its o - 1 iterations plus the prefills admitted meanwhile.
   Other requests are an M/G/infinity shot noise (each overlapping iteration adds t_dec' / (o - 1), each admitted
   prompt P / (o - 1)). A burst slows every iteration and lets more arrivals in: the noise comes in branching
   cascades (gain G = 1 / (1 - lambda P - lambda E[m] t_dec'), Borel cluster sizes), which scale the second
   cumulant by G^2 and the third by the Borel third moment; a shifted gamma with those three cumulants
   (Wilson-Hilferty for its CDF) per request shape, mixed by share, gives the percentiles, cut at the hard bound
   t_dec(c) + (c - 1) ceil(m_j / o_min) P / m_j (the other slots admit at most that many prompts meanwhile).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.queueing_dist import distributions
from madmax_opt.model.queueing_math import bisect_quantiles, erlang_c, mgc_tail_rate, percentile_columns
from madmax_opt.model.queueing_table import (
    GRID_POINTS,
    OPEN_LOOP,
    PERCENTILES,
    OnlineLatency,
    ServiceTable,
    service_table,
)
from madmax_opt.model.spec import PERCENTILE_TARGETS

LATENCY_TARGETS = PERCENTILE_TARGETS  # ttft_p50_s ... tpot_p99_s (spec.py)

__all__ = ["GRID_POINTS", "LATENCY_TARGETS", "OPEN_LOOP", "PERCENTILES", "RATE_BITS", "OnlineLatency", "ServiceTable",
           "erlang_c", "latency", "max_rate", "meets", "mgc_tail_rate", "service_table"]


def latency(st: ServiceTable, rate_per_replica: Arr, only: Collection[str] | None = None) -> OnlineLatency:
    """TTFT / TPOT percentiles and means per plan at ``rate_per_replica`` requests/s (one per plan); with ``only``
    (target names), the percentiles not named are left NaN."""
    d = distributions(st, rate_per_replica)

    def wanted(kind: str) -> list[int]:
        return [p for p in PERCENTILES if only is None or f"{kind}_p{p}_s" in only]

    n = len(d.stable)
    ttft = percentile_columns(lambda ps: bisect_quantiles(d.ttft_cdf, *d.ttft_bracket, ps), wanted("ttft"), n)
    mix = d.tpot
    tpot = (percentile_columns(lambda ps: bisect_quantiles(mix.cdf, *mix.bracket, ps), wanted("tpot"), n)
            if mix is not None else percentile_columns(lambda ps: np.zeros((n, len(ps))), wanted("tpot"), n))
    inf = ~d.stable
    return OnlineLatency(
        ttft_s=np.where(inf[:, None], np.inf, ttft),
        tpot_s=np.where(inf[:, None], np.inf, tpot),
        ttft_mean_s=np.where(inf, np.inf, d.ttft_mean_s),
        tpot_mean_s=np.where(inf, np.inf, d.tpot_mean_s),
        running=d.running,
        iteration_s=d.iteration_s,
        wait_probability=d.wait_probability,
        utilisation=d.utilisation,
        stable=d.stable,
    )


def meets(st: ServiceTable, rate_per_replica: Arr, targets: dict[str, float]) -> NDArray[np.bool_]:
    """Whether each plan is stable and meets every target at ``rate_per_replica``: a percentile target q_p <= L
    read as CDF(L) >= p (the quantile is the least x with CDF(x) >= p), a mean target directly; no bisection."""
    d = distributions(st, rate_per_replica)
    ok = d.stable.copy()
    for name, limit in targets.items():
        parts = name.split("_")  # ttft_p99_s (a percentile) or ttft_s (the mean)
        kind, p = parts[0], parts[1] if len(parts) == 3 else ""
        if not p:
            ok &= (d.ttft_mean_s if kind == "ttft" else d.tpot_mean_s) <= limit
            continue
        if kind == "tpot" and d.tpot is None:
            continue  # no time between output tokens: 0 <= limit
        cdf = d.ttft_cdf if kind == "ttft" else d.tpot.cdf  # type: ignore[union-attr]
        ok &= cdf(np.full((len(ok), 1), limit))[:, 0] >= int(p[1:]) / 100.0
    return ok


RATE_BITS = 2  # the rate search splits each bracket into 2^RATE_BITS parts per model evaluation


def max_rate(st: ServiceTable, targets: dict[str, float], steps: int = 30) -> Arr:
    """Highest deployment arrival rate (requests/s over all decode replicas) at which each plan meets every target
    (percentile or mean latency, s), to 2^-steps of its stability limit; the limit itself without targets; 0 when
    even a vanishing rate misses a target. Every latency grows with the rate: a 2^RATE_BITS-ary search (the
    bisection's answer, RATE_BITS halvings per evaluation of all plans x 2^RATE_BITS - 1 rates at once)."""
    lam_max = st.max_rate_per_replica() * (1.0 - 1e-6)
    if not targets:
        return np.asarray(lam_max * st.replicas)
    parts = 1 << RATE_BITS
    frac = np.arange(1, parts) / parts
    tiled = st.take(np.repeat(np.arange(len(st)), parts - 1))
    lo, width = np.zeros_like(lam_max), lam_max.copy()
    for _ in range(-(-steps // RATE_BITS)):
        ok = meets(tiled, (lo[:, None] + width[:, None] * frac[None, :]).ravel(), targets).reshape(len(st), -1)
        below = np.where(ok.all(axis=1), parts - 1, np.argmin(ok, axis=1))  # rates met before the first miss
        lo, width = lo + width * below / parts, width / parts
    return np.asarray(lo * st.replicas)
