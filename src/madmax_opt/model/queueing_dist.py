"""The queueing model at one arrival rate per plan (``distributions``): mean field, wait, TTFT and TPOT
distributions as CDFs on (N, Q) points; the approximations are described in ``model/queueing.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model import queueing_math as qm
from madmax_opt.model.queueing_math import (
    erlang_c,
    kernel_integrals,
    laguerre_nodes,
    mgc_tail_rate,
    negative_binomial_pmf,
    normal_cdf,
    poisson_pmf,
    row_sum,
)
from madmax_opt.model.queueing_table import ServiceTable

_K_TERMS = 48  # admitted prompts per iteration considered (the rest of the negative binomial mass is lumped)
_K_WIDTHS: tuple[int, ...] = (8, 12, 16, 24, 32, _K_TERMS)  # per-plan truncation widths (grouped evaluation)


@dataclass(frozen=True)
class Distributions:
    """TTFT and TPOT distributions per plan at one rate: CDFs on (N, Q) points with their quantile brackets."""

    ttft_cdf: Callable[[Arr], Arr]
    ttft_bracket: tuple[Arr, Arr]
    tpot: _TpotMix | None  # None: every request has one output token (no time between output tokens)
    ttft_mean_s: Arr
    running: Arr
    iteration_s: Arr
    wait_probability: Arr
    utilisation: Arr
    stable: NDArray[np.bool_]

    @property
    def tpot_mean_s(self) -> Arr:
        return self.tpot.mean_s if self.tpot is not None else np.zeros_like(self.ttft_mean_s)


def distributions(st: ServiceTable, rate_per_replica: Arr) -> Distributions:
    """The queueing model at ``rate_per_replica`` requests/s (one per plan): see the module docstring."""
    lam = np.asarray(rate_per_replica, dtype=np.float64)
    c, big_p, delta = st.cap, st.prefill_s, st.first_token_extra_s
    m_mean = st.mean_decode_iterations
    lam_max = st.max_rate_per_replica()
    stable = lam < lam_max
    lam_s = np.where(stable, lam, 0.999999 * lam_max)
    busy_prefill = lam_s * big_p  # m: share of time spent prefilling

    # 1. mean field: n = lambda m_mean t(n) / (1 - lambda P), bisection on [0, c]
    lo, hi = np.zeros_like(lam_s), c.astype(np.float64).copy()
    arrivals, not_prefill = lam_s * m_mean, 1.0 - busy_prefill  # (the same products, in the same order)
    for _ in range(qm.BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        t_mid, _ = st.decode_s(np.maximum(mid, 1.0))
        grow = arrivals * t_mid / not_prefill > mid
        lo, hi = np.where(grow, mid, lo), np.where(grow, hi, mid)
    n = 0.5 * (lo + hi)
    p_idle = np.exp(-n)  # Poisson occupancy (M/G/infinity) below the cap
    n_busy = np.maximum(n / np.maximum(1.0 - p_idle, 1e-12), 1.0)  # mean running given at least one
    t_dec, slope = st.decode_s(n_busy)
    iteration = st.decode_s(np.maximum(n, 1.0))[0] / (1.0 - busy_prefill)

    # 3. queue: a request that waits meets a saturated replica (c slots turning over at lambda_max in all); the
    # delay probability is taken insensitive to the holding-time law: M/M/c Erlang C at c slots, offered load
    # c lambda / lambda_max (the M/G/c "Erlang C" approximation, Tijms 2003 sec. 9.2; Whitt 1993)
    t_cap = st.decode_at_cap_s()
    wait_p = np.where(stable, erlang_c(c, c * lam_s / lam_max), 1.0)
    mo = np.maximum(st.outputs - 1.0, 0.0)
    # a waiting request is served by a saturated replica: every freed slot is refilled at once, so a slot turns over
    # in S_j = m_j T_sat (T_sat = t_dec(c) + c P / E[m], the iteration at the cap; E[S] = c / lambda_max); when every
    # request has one output token (E[m] = 0) a slot is held for its admission iteration at the cap, S = c P, the
    # limit of equal m_j
    share_of_mean = mo / m_mean if m_mean > 0 else np.ones_like(mo)
    # the wait's decay rate, only where a wait enters a result (wait_p > 1e-9; rows are independent)
    theta = np.ones_like(lam_s)
    waits = np.flatnonzero(wait_p > 1e-9)
    if len(waits):
        theta[waits] = mgc_tail_rate(lam_s[waits], c[waits],
                                     share_of_mean[None, :] * (c[waits] / lam_max[waits])[:, None], st.shares)

    # 2. TTFT without queue: Y = residual of a length-biased iteration + prefill of the others it admits with
    iota = lam_s * t_dec
    k_mean = iota / (1.0 - busy_prefill)
    k_var = k_mean / (1.0 - busy_prefill**2)
    # per plan: admitted prompts considered up to mean + 6 sd (Poisson of the longest iteration), 6 to 48
    top_mean = lam_s * (t_dec + big_p * (k_mean + 6.0 * np.sqrt(k_var) + 1.0))
    need = np.ceil(top_mean + 6.0 * np.sqrt(top_mean) + 4.0)
    cut = np.array(_K_WIDTHS)[np.minimum(np.searchsorted(_K_WIDTHS, need), len(_K_WIDTHS) - 1)].astype(np.int64)
    terms = int(np.max(cut, initial=6))
    pi_k = negative_binomial_pmf(k_mean, k_var, terms, cut)
    ks = np.arange(terms, dtype=np.float64)
    t_k = t_dec[:, None] + big_p[:, None] * ks[None, :]  # (N, K)
    biased = pi_k * t_k
    biased /= row_sum(biased)[:, None]
    q_j = poisson_pmf((lam_s[:, None] * t_k).ravel(), terms, np.repeat(cut, terms)).reshape(len(lam_s), terms, terms)
    weight = biased[:, :, None] * q_j  # (N, K, J)
    base = t_dec + big_p + delta  # own iteration without others, + pipeline fill
    shift = big_p[:, None, None] * ks[None, None, :]  # P J
    lone = big_p + delta
    busy = 1.0 - p_idle

    # plans grouped by their truncation width, each group's arrays contiguous: a plan's sums have the same order
    # whatever other plans are evaluated with it
    groups = []
    for w in sorted(set(cut.tolist())):  # (np.unique would import numpy.ma, ~10 ms, for a few integers)
        g = np.flatnonzero(cut == w)
        groups.append((g, np.ascontiguousarray(weight[g][:, :w, :w]), np.ascontiguousarray(t_k[g][:, :w, None]),
                       np.ascontiguousarray(shift[g][:, :, :w])))

    def ttft0_cdf(x: Arr) -> Arr:
        """(N, Q) CDF of the no-queue TTFT at x (N, Q): one pass per truncation width, every column at once."""
        total = np.empty_like(x)
        for g, wgt, tk, sh in groups:
            inside = np.clip(((x[g] - base[g][:, None])[:, :, None, None] - sh[:, None]) / tk[:, None], 0.0, 1.0)
            total[g] = np.sum(wgt[:, None] * inside, axis=(2, 3))
        return np.asarray(busy[:, None] * total + p_idle[:, None] * (x >= lone[:, None]))

    # Gauss-Laguerre nodes for the exponential wait: E[F0(x - W)] = sum_i w_i F0(x - xi_i / theta)
    xi, wq = laguerre_nodes()

    queued = wait_p > 1e-6  # per plan: below, the wait is ignored (so a plan's result never depends on others)

    def ttft_cdf(x: Arr) -> Arr:
        if not queued.any():
            return ttft0_cdf(x)
        # no wait and the 8 waits in one pass: columns (Q, 9)
        shifted = x[:, :, None] - np.concatenate([[0.0], xi])[None, None, :] / theta[:, None, None]
        f = ttft0_cdf(shifted.reshape(len(x), -1)).reshape(shifted.shape)
        no_wait, waited = f[:, :, 0], f[:, :, 1:] @ wq
        return np.asarray(np.where(queued[:, None], (1.0 - wait_p[:, None]) * no_wait + wait_p[:, None] * waited,
                                   no_wait))

    mean_y = row_sum(weight * (0.5 * t_k[:, :, None] + shift))
    ttft_mean = busy * (base + mean_y) + p_idle * lone + np.where(queued, wait_p / theta, 0.0)
    top = base + t_dec + big_p * (2.0 * cut + 1.0) + 12.0 / theta * (wait_p > 1e-9)


    # 4. TPOT: per shape, mean + shot-noise cumulants (others' overlap in iterations x slope, their prefills)
    h_all, h_in = kernel_integrals(st.outputs)
    per_iter = lam_s * iteration  # arrivals per iteration
    n_self = np.minimum(n + 1.0, c)
    tpot_mean = st.decode_s(n_self)[0] + busy_prefill * iteration
    free = 1.0 - wait_p  # at the cap the batch stops fluctuating
    # a burst slows every iteration, which keeps requests longer and lets more prefills and sequences in:
    # TPOT x = t(n) + P K / m with n ~ lambda E[m] x and K ~ lambda m x, so noise is amplified by
    # 1 / (1 - lambda P - lambda E[m] t'(n))
    gain = 1.0 / np.maximum(1.0 - busy_prefill - lam_s * m_mean * slope * free, 0.05)
    # the bursts are branching cascades (each prefill lets Poisson(b) arrivals in, b = 1 - 1/G): per arrival, the
    # cascade size is Borel(b), second moment 1/(1-b)^3 and third b(1+2b)/(1-b)^5 + 3b/(1-b)^4 + 1/(1-b)^3; per
    # unit of total arrivals (mean 1/(1-b)) the cumulants scale by G^2 and by the factor below
    b = 1.0 - 1.0 / gain
    skew_gain = b * (1.0 + 2.0 * b) * gain**4 + 3.0 * b * gain**3 + gain**2
    mus, sds, gammas, bounds = [], [], [], []
    o_min = float(np.min(st.outputs))
    for j, mj in enumerate(mo):
        if mj <= 0:
            continue
        # hard bound from the iteration rules: each of the other c - 1 slots admits at most ceil(m_j / o_min)
        # prompts during the m_j iterations, and t_dec(n) <= t_dec(c): TPOT <= t_dec(c) + (c - 1) ceil(m_j/o_min) P/m_j
        bounds.append(t_cap + (c - 1.0) * np.ceil(mj / o_min) * big_p / mj)
        pm = big_p / mj
        beta = slope * free
        k2 = np.zeros_like(lam_s)
        k3 = np.zeros_like(lam_s)
        for jj, wjj in enumerate(st.shares):
            k2 += wjj * (beta**2 * h_all[2, j, jj] + 2 * beta * pm * h_in[1, j, jj] + pm**2 * h_in[0, j, jj])
            k3 += wjj * (beta**3 * h_all[3, j, jj] + 3 * beta**2 * pm * h_in[2, j, jj]
                         + 3 * beta * pm**2 * h_in[1, j, jj] + pm**3 * h_in[0, j, jj])
        k2, k3 = k2 * per_iter * gain**2, k3 * per_iter * skew_gain
        # its own prefill lengthens its admission iteration; the arrivals meanwhile (and theirs, a cascade) are
        # prefilled in its first decode iterations: P / m x lambda P / (1 - lambda P)
        mu = tpot_mean + pm * busy_prefill / (1.0 - busy_prefill)
        sd = np.sqrt(np.maximum(k2, 0.0))
        sd = np.where(sd > 1e-9 * mu, sd, 0.0)  # below, the quantile bisection cannot resolve it: deterministic
        mus.append(mu)
        sds.append(sd)
        gammas.append(np.where(sd > 0, k3 / np.where(sd > 0, sd, 1.0) ** 3, 0.0))
    tpot = None if not mus else _TpotMix.of(
        np.array([w for w, mj in zip(st.shares, mo, strict=True) if mj > 0]), np.stack(mus), np.stack(sds),
        np.stack(gammas), np.stack(bounds))
    return Distributions(ttft_cdf, (np.minimum(lone, base), top), tpot, ttft_mean, n, iteration, wait_p,
                          lam / lam_max, stable)


@dataclass(frozen=True)
class _TpotMix:
    """TPOT of the mix of request shapes (rows of the (S, N, 1) arrays): per shape a shifted gamma with mean mu, sd
    and skew g (shape k = 4 / g^2, scale sd g / 2), its CDF by the Wilson-Hilferty cube-root normal approximation
    (a normal when the skew is negligible, a step when sd is 0), cut at the shape's hard bound."""

    w: Arr  # (S,) shares
    mu: Arr
    sd: Arr
    g: Arr
    bound: Arr

    @staticmethod
    def of(shares: Arr, mus: Arr, sds: Arr, gammas: Arr, bounds: Arr) -> _TpotMix:
        return _TpotMix(shares / shares.sum(), *(a[:, :, None] for a in (mus, sds, gammas, bounds)))

    @property
    def mean_s(self) -> Arr:
        return np.asarray(self.w @ self.mu[:, :, 0])

    @property
    def bracket(self) -> tuple[Arr, Arr]:
        spread = np.max(self.sd[:, :, 0], axis=0)
        mus = self.mu[:, :, 0]
        return np.min(mus, axis=0) - 6 * spread - 1e-12, np.max(mus, axis=0) + 12 * spread + 1e-12

    def cdf(self, x: Arr) -> Arr:
        """(N, Q) CDF at x (N, Q)."""
        mu, sd, g = self.mu, self.sd, self.g
        skewed = g > 1e-3
        k = np.where(skewed, 4.0 / np.maximum(g, 1e-3) ** 2, 1.0)
        k_scale = k * sd * np.maximum(g, 1e-3) / 2.0
        spread = sd > 0
        y = np.maximum(x[None] - (mu - k_scale), 0.0) / np.where(k_scale > 0, k_scale, 1.0)
        z = np.where(skewed, (np.cbrt(y) - 1.0 + 1.0 / (9.0 * k)) * 3.0 * np.sqrt(k),
                     (x[None] - mu) / np.where(spread, sd, 1.0))
        per_shape = np.where(x[None] >= self.bound, 1.0, np.where(spread, normal_cdf(z), (x[None] >= mu) * 1.0))
        return np.asarray(np.tensordot(self.w, per_shape, axes=1))
