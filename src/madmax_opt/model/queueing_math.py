"""Numerical pieces of the queueing model (``model/queueing.py``): distributions with their tails lumped, Erlang C,
the M/G/c wait-tail rate, quantile bisection and the plan-independent quadrature tables. Sums run in index order
(a row's value never depends on the other rows evaluated with it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.queueing_table import PERCENTILES

BISECT_STEPS = 26  # halvings of every bisection of the model (mean field, quantiles)


def _erf(x: Arr) -> Arr:
    """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * \
        np.exp(-a * a)
    return np.asarray(s * y)


def normal_cdf(z: Arr) -> Arr:
    return 0.5 * (1.0 + _erf(z / np.sqrt(2.0)))


def row_sum(x: Arr) -> Arr:
    """Sum of each row (all trailing axes) in index order, s_k = s_(k-1) + x_k: independent of the padding other
    plans force. Summed down the columns of the transposed rows (a reduction over the outer axis of a C-ordered
    array adds whole rows in order, the cumulative sum's last column, bit for bit: tests/test_queueing_speed.py)."""
    flat = x.reshape(len(x), -1)
    if len(flat) < 2:  # one row: the outer axis would be the contiguous one (pairwise summation)
        return np.asarray(np.cumsum(flat, axis=1)[:, -1])
    return _down_sum(np.ascontiguousarray(flat.T))


def _down_sum(cols: Arr) -> Arr:
    """(K, N) -> (N,): each column summed in row order (N >= 2: a reduction over the outer axis, row by row)."""
    return np.asarray(np.add.reduce(cols, axis=0))


def _lump_tail_t(pmf_t: Arr, cut: NDArray[np.int64]) -> Arr:
    """(terms, N) probabilities, transposed: zero each row's terms from ``cut`` on and add the missing mass to term
    cut - 1 (sequential sums, so a row's values do not depend on the array's width, i.e. on the other plans
    evaluated with it); returns (N, terms) (a transposed view)."""
    kept = np.where(np.arange(pmf_t.shape[0])[:, None] < cut[None, :], pmf_t, 0.0)
    total = _down_sum(kept) if kept.shape[1] >= 2 else np.cumsum(kept[:, 0])[-1:]
    kept[cut - 1, np.arange(len(cut))] += np.maximum(1.0 - total, 0.0)
    return kept.T


def poisson_pmf(mean: Arr, terms: int, cut: NDArray[np.int64] | None = None) -> Arr:
    """(N, terms) Poisson probabilities of 0 .. terms-1 (recursive: p_k = p_{k-1} mean / k); the tail from
    ``cut`` (per row; default: terms) is lumped into column cut - 1. Built as (terms, N): each recursion step is
    one contiguous row."""
    out = np.empty((terms, len(mean)))
    out[0] = np.exp(-mean)
    for k in range(1, terms):
        out[k] = out[k - 1] * mean / k
    return _lump_tail_t(out, np.full(len(mean), terms, dtype=np.int64) if cut is None else cut)


def negative_binomial_pmf(mean: Arr, var: Arr, terms: int, cut: NDArray[np.int64] | None = None) -> Arr:
    """(N, terms) negative binomial with the given mean and variance (>= mean; Poisson when equal), tail lumped."""
    cut = np.full(len(mean), terms, dtype=np.int64) if cut is None else cut
    over = var > mean * (1.0 + 1e-9)
    p = np.where(over, mean / np.where(over, var, 1.0), 1.0)
    r = np.where(over, mean * p / np.maximum(1.0 - p, 1e-300), 1.0)
    nb = np.empty((terms, len(mean)))
    nb[0] = np.exp(r * np.log(np.where(over, p, 1.0)))
    for k in range(1, terms):
        nb[k] = nb[k - 1] * (k - 1 + r) / k * (1.0 - p)
    return np.where(over[:, None], _lump_tail_t(nb, cut), poisson_pmf(mean, terms, cut))


@lru_cache(maxsize=64)
def _log_factorials(top: int) -> Arr:
    """ln k! for k = 0 .. top (read-only), kept per ``top``: the same computation as before, once per size."""
    out = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, top + 1)))])
    out.setflags(write=False)
    return out


def erlang_c(servers: Arr, load: Arr) -> Arr:
    """P(wait) in M/M/c (Erlang C) from Erlang B = (a^c / c!) / sum_{k<=c} a^k / k! (Poisson pmf over cdf at c),
    in logs, every k at once (c = floor(servers)): C = B / (1 - rho (1 - B)); rows whose load is more than 12
    standard deviations below the servers are 0 (below 1e-30) and skipped."""
    rho = load / servers
    out = np.where(rho < 1.0, 0.0, 1.0)
    live = np.flatnonzero((rho < 1.0) & (servers - load < 12.0 * np.sqrt(np.maximum(load, 1.0)) + 12.0))
    if len(live) == 0:
        return out
    c, a = np.floor(servers[live]).astype(np.int64), load[live]
    # terms k = c, c - 1, ... down to 13 standard deviations below the mode min(a, c) (the rest < 1e-36 of the sum)
    span = np.minimum(np.ceil(np.maximum(c - a, 0.0) + 13.0 * np.sqrt(np.maximum(a, 1.0)) + 10.0), c + 1)
    steps = np.arange(int(np.max(span)))
    k = c[:, None] - steps[None, :]
    log_fact = _log_factorials(int(np.max(c)))  # ln k!, k = 0 .. max c
    log_terms = np.where(steps[None, :] < span[:, None],
                         k * np.log(np.maximum(a, 1e-300))[:, None] - log_fact[np.maximum(k, 0)], -np.inf)  # ln a^k/k!
    top = np.max(log_terms, axis=1)
    total = row_sum(np.exp(log_terms - top[:, None]))  # sequential: a row's value does not depend on the width
    b = np.exp(log_terms[:, 0] - top) / total
    out[live] = b / np.maximum(1.0 - rho[live] * (1.0 - b), 1e-300)
    return out


def mgc_tail_rate(lam: Arr, servers: Arr, service: Arr, shares: Arr) -> Arr:
    """Decay rate eta of the M/G/c wait, P(W > t) ~ e^(-eta t): the positive root of eta = lam (E[e^(eta S / c)] - 1)
    (service (N, S) times with probabilities shares); exact for exponential S (eta = c mu - lam, Erlang C) and for
    deterministic S (Crommelin 1932: the M/D/c queue-length tail z0^-n, z0^c = e^(lam S (z0 - 1)), eta = c ln z0 / S),
    heavy-traffic limit 2 (c / E[S] - lam) / (1 + cs^2) (Kingman 1962; Tijms 2003, sec. 9.2.3)."""
    w = shares / np.sum(shares)
    mean_s, mean_s2 = service @ w, service**2 @ w
    lam = np.maximum(lam, 1e-12)
    # f(eta) = lam (E[e^(eta S / c)] - 1) - eta is convex with f(0) = 0, f'(0) < 0 below saturation; since
    # e^y >= 1 + y + y^2 / 2, f >= 0 at hi = 2 c^2 (1 - lam E[S] / c) / (lam E[S^2]): bisect on [0, hi]
    hi = 2.0 * servers**2 * np.maximum(1.0 - lam * mean_s / servers, 1e-12) / (lam * mean_s2)
    lo = np.zeros_like(hi)
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        f = lam * (np.exp(np.minimum(mid[:, None] * service / servers[:, None], 700.0)) @ w - 1.0) - mid
        lo, hi = np.where(f < 0.0, mid, lo), np.where(f < 0.0, hi, mid)
    return np.asarray(np.maximum(0.5 * (lo + hi), 1e-12))


def bisect_quantiles(cdf: Callable[[Arr], Arr], lo: Arr, hi: Arr, ps: Arr) -> Arr:
    """(N, Q) quantiles at probabilities ``ps`` (Q,) of each row's CDF on [lo, hi] (N,): every percentile
    bisected together, ``cdf`` called on (N, Q) points."""
    lo = np.repeat(lo[:, None], len(ps), axis=1)
    hi = np.repeat(hi[:, None], len(ps), axis=1)
    for _ in range(BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < ps[None, :]
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def percentile_columns(bisect: Callable[[Arr], Arr], ps: list[int], n: int) -> Arr:
    """(n, 3) in PERCENTILES order: the wanted ``ps`` from ``bisect`` (probabilities -> (n, len(ps))), NaN else."""
    out = np.full((n, len(PERCENTILES)), np.nan)
    if ps:
        out[:, [PERCENTILES.index(p) for p in ps]] = bisect(np.array(ps, dtype=np.float64) / 100.0)
    return out


# 8-point Gauss-Laguerre rule (numpy.polynomial.laguerre.laggauss(8), written out so that a solve does not import
# numpy.polynomial; tests/test_queueing_speed.py checks them against it and against int x^k e^-x dx = k!, k <= 15)
_LAGUERRE_NODES = (0.17027963230510093, 0.90370177679938, 2.251086629866131, 4.266700170287659, 7.0459054023934655,
                   10.758516010180996, 15.740678641278004, 22.863131736889265)
_LAGUERRE_WEIGHTS = (0.36918858934163495, 0.4187867808143447, 0.17579498663717255, 0.033343492261215794,
                     0.0027945362352256834, 9.076508773358139e-05, 8.48574671627257e-07, 1.0480011748715153e-09)


@cache
def laguerre_nodes() -> tuple[Arr, Arr]:
    """8-point Gauss-Laguerre nodes and weights."""
    return np.array(_LAGUERRE_NODES), np.array(_LAGUERRE_WEIGHTS)


def kernel_integrals(outputs: Arr) -> tuple[Arr, Arr]:
    return _kernel_integrals_cached(tuple(float(o) for o in outputs))


@cache
def _kernel_integrals_cached(outputs_key: tuple[float, ...]) -> tuple[Arr, Arr]:
    """Plan-independent shot-noise integrals over the arrival offset u (iterations) of another request:
    ``H[k, j, j']`` = int h^k du over all u and ``Hin[k, j, j']`` = int_0^m h^k du (k = 0..3), where
    h(u) = overlap of its m' decode iterations with the tagged request's m, divided by m."""
    m = np.maximum(np.array(outputs_key) - 1.0, 0.0)
    s = len(m)
    h_all = np.zeros((4, s, s))
    h_in = np.zeros((4, s, s))
    for j in range(s):
        for jj in range(s):
            if m[j] <= 0 or m[jj] <= 0:
                continue
            u = np.linspace(-m[jj], m[j], 4097)
            du = u[1] - u[0]
            h = np.maximum(np.minimum(m[j], u + m[jj]) - np.maximum(0.0, u), 0.0) / m[j]
            inside = (u > 0) & (u <= m[j])
            for k in range(4):
                h_all[k, j, jj] = np.trapezoid(h**k, dx=du) if k else m[j] + m[jj]
                h_in[k, j, jj] = np.sum(np.where(inside, h**k, 0.0)) * du
    return h_all, h_in
