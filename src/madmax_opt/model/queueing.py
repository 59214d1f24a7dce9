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

from collections.abc import Callable, Collection
from dataclasses import dataclass, fields, replace
from functools import cache, cached_property

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.inference import InferenceTerms, ServingArrays, ServingWorkload
from madmax_opt.model.spec import PERCENTILE_TARGETS

PERCENTILES: tuple[int, ...] = (50, 90, 99)
LATENCY_TARGETS = PERCENTILE_TARGETS  # ttft_p50_s ... tpot_p99_s (spec.py)
_Z = {50: 0.0, 90: 1.2815515655446004, 99: 2.3263478740408408}  # standard normal quantiles
_K_TERMS = 48  # admitted prompts per iteration considered (the rest of the negative binomial mass is lumped)
_K_WIDTHS: tuple[int, ...] = (8, 12, 16, 24, 32, _K_TERMS)  # per-plan truncation widths (grouped evaluation)
_BISECT = 26


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
    def _segments(self) -> tuple[Arr, Arr, Arr, NDArray[np.int64]]:
        """The grid flattened, the slope of each grid interval (N, G - 1) and each row's offset into the flat
        grid: computed once per table (``decode_s`` runs in every step of the model's bisections)."""
        g, t = self.n_grid, self.t_grid
        dn = g[:, 1:] - g[:, :-1]
        slopes = np.where(dn > 0, (t[:, 1:] - t[:, :-1]) / np.where(dn > 0, dn, 1.0), 0.0)
        return np.ravel(g), np.ravel(t), np.ravel(slopes), np.arange(len(g), dtype=np.int64) * (g.shape[1] - 1)

    def decode_s(self, n: Arr) -> tuple[Arr, Arr]:
        """t_dec(n) by linear interpolation on the grid (n >= 1; clamped to the grid) and its slope d t / d n."""
        g = self.n_grid
        flat_g, flat_t, slopes, row0 = self._segments
        n = np.minimum(np.maximum(n, g[:, 0]), g[:, -1])
        idx = np.minimum(np.maximum(np.sum(g <= n[:, None], axis=1) - 1, 0), g.shape[1] - 2)
        seg = row0 + idx  # interval idx of each row; its left grid point is at seg + row in the flat grid
        left = seg + np.arange(len(n))
        slope = slopes[seg]
        return flat_t[left] + slope * (n - flat_g[left]), slope

    def max_rate_per_replica(self) -> Arr:
        """lambda_max = c / ((E[o] - 1) t_dec(c) + c P): the rate at which the c slots are always busy."""
        t_c, _ = self.decode_s(self.cap)
        return self.cap / (self.mean_decode_iterations * t_c + self.cap * self.prefill_s)


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


# ------------------------------------------------------------------------------------------------- helpers


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


def _row_sum(x: Arr) -> Arr:
    """Sum of each row (all trailing axes) in index order: independent of the padding other plans force."""
    return np.asarray(np.cumsum(x.reshape(len(x), -1), axis=1)[:, -1])


def _lump_tail(pmf: Arr, cut: NDArray[np.int64]) -> Arr:
    """Zero each row's columns from ``cut`` on and add the missing mass to column cut - 1 (sequential sums, so a
    row's values do not depend on the array's width, i.e. on the other plans evaluated with it)."""
    cols = np.arange(pmf.shape[1])[None, :]
    kept = np.where(cols < cut[:, None], pmf, 0.0)
    missing = np.maximum(1.0 - np.cumsum(kept, axis=1)[:, -1], 0.0)
    kept[np.arange(len(cut)), cut - 1] += missing
    return kept


def poisson_pmf(mean: Arr, terms: int, cut: NDArray[np.int64] | None = None) -> Arr:
    """(N, terms) Poisson probabilities of 0 .. terms-1 (recursive: p_k = p_{k-1} mean / k); the tail from
    ``cut`` (per row; default: terms) is lumped into column cut - 1."""
    out = np.empty((len(mean), terms))
    out[:, 0] = np.exp(-mean)
    for k in range(1, terms):
        out[:, k] = out[:, k - 1] * mean / k
    return _lump_tail(out, np.full(len(mean), terms, dtype=np.int64) if cut is None else cut)


def negative_binomial_pmf(mean: Arr, var: Arr, terms: int, cut: NDArray[np.int64] | None = None) -> Arr:
    """(N, terms) negative binomial with the given mean and variance (>= mean; Poisson when equal), tail lumped."""
    cut = np.full(len(mean), terms, dtype=np.int64) if cut is None else cut
    over = var > mean * (1.0 + 1e-9)
    p = np.where(over, mean / np.where(over, var, 1.0), 1.0)
    r = np.where(over, mean * p / np.maximum(1.0 - p, 1e-300), 1.0)
    nb = np.empty((len(mean), terms))
    nb[:, 0] = np.exp(r * np.log(np.where(over, p, 1.0)))
    for k in range(1, terms):
        nb[:, k] = nb[:, k - 1] * (k - 1 + r) / k * (1.0 - p)
    return np.where(over[:, None], _lump_tail(nb, cut), poisson_pmf(mean, terms, cut))


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
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, int(np.max(c)) + 1)))])  # ln k!
    log_terms = np.where(steps[None, :] < span[:, None],
                         k * np.log(np.maximum(a, 1e-300))[:, None] - log_fact[np.maximum(k, 0)], -np.inf)  # ln a^k/k!
    top = np.max(log_terms, axis=1)
    total = _row_sum(np.exp(log_terms - top[:, None]))  # sequential: a row's value does not depend on the width
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


def _bisect_quantiles(cdf: Callable[[Arr], Arr], lo: Arr, hi: Arr, ps: Arr) -> Arr:
    """(N, Q) quantiles at probabilities ``ps`` (Q,) of each row's CDF on [lo, hi] (N,): every percentile
    bisected together, ``cdf`` called on (N, Q) points."""
    lo = np.repeat(lo[:, None], len(ps), axis=1)
    hi = np.repeat(hi[:, None], len(ps), axis=1)
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < ps[None, :]
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _percentile_columns(bisect: Callable[[Arr], Arr], ps: list[int], n: int) -> Arr:
    """(n, 3) in PERCENTILES order: the wanted ``ps`` from ``bisect`` (probabilities -> (n, len(ps))), NaN else."""
    out = np.full((n, len(PERCENTILES)), np.nan)
    if ps:
        out[:, [PERCENTILES.index(p) for p in ps]] = bisect(np.array(ps, dtype=np.float64) / 100.0)
    return out


# ------------------------------------------------------------------------------------------- the model


@cache
def _laguerre_nodes() -> tuple[Arr, Arr]:
    """8-point Gauss-Laguerre nodes and weights (computed once)."""
    xi, wq = np.polynomial.laguerre.laggauss(8)
    return np.asarray(xi), np.asarray(wq)


def _kernel_integrals(outputs: Arr) -> tuple[Arr, Arr]:
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


@dataclass(frozen=True)
class _Distributions:
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


def latency(st: ServiceTable, rate_per_replica: Arr, only: Collection[str] | None = None) -> OnlineLatency:
    """TTFT / TPOT percentiles and means per plan at ``rate_per_replica`` requests/s (one per plan); with ``only``
    (target names), the percentiles not named are left NaN."""
    d = _distributions(st, rate_per_replica)

    def wanted(kind: str) -> list[int]:
        return [p for p in PERCENTILES if only is None or f"{kind}_p{p}_s" in only]

    n = len(d.stable)
    ttft = _percentile_columns(lambda ps: _bisect_quantiles(d.ttft_cdf, *d.ttft_bracket, ps), wanted("ttft"), n)
    mix = d.tpot
    tpot = (_percentile_columns(lambda ps: _bisect_quantiles(mix.cdf, *mix.bracket, ps), wanted("tpot"), n)
            if mix is not None else _percentile_columns(lambda ps: np.zeros((n, len(ps))), wanted("tpot"), n))
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
    d = _distributions(st, rate_per_replica)
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


def _distributions(st: ServiceTable, rate_per_replica: Arr) -> _Distributions:
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
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        t_mid, _ = st.decode_s(np.maximum(mid, 1.0))
        grow = lam_s * m_mean * t_mid / (1.0 - busy_prefill) > mid
        lo, hi = np.where(grow, mid, lo), np.where(grow, hi, mid)
    n = 0.5 * (lo + hi)
    p_idle = np.exp(-n)  # Poisson occupancy (M/G/infinity) below the cap
    n_busy = np.maximum(n / np.maximum(1.0 - p_idle, 1e-12), 1.0)  # mean running given at least one
    t_dec, slope = st.decode_s(n_busy)
    iteration = st.decode_s(np.maximum(n, 1.0))[0] / (1.0 - busy_prefill)

    # 3. queue: a request that waits meets a saturated replica (c slots turning over at lambda_max in all); the
    # delay probability is taken insensitive to the holding-time law: M/M/c Erlang C at c slots, offered load
    # c lambda / lambda_max (the M/G/c "Erlang C" approximation, Tijms 2003 sec. 9.2; Whitt 1993)
    t_cap, _ = st.decode_s(c)
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
    biased /= _row_sum(biased)[:, None]
    q_j = poisson_pmf((lam_s[:, None] * t_k).ravel(), terms, np.repeat(cut, terms)).reshape(len(lam_s), terms, terms)
    weight = biased[:, :, None] * q_j  # (N, K, J)
    base = t_dec + big_p + delta  # own iteration without others, + pipeline fill
    shift = big_p[:, None, None] * ks[None, None, :]  # P J
    lone = big_p + delta
    busy = 1.0 - p_idle

    # plans grouped by their truncation width, each group's arrays contiguous: a plan's sums have the same order
    # whatever other plans are evaluated with it
    groups = []
    for w in np.unique(cut):
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
    xi, wq = _laguerre_nodes()

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

    mean_y = _row_sum(weight * (0.5 * t_k[:, :, None] + shift))
    ttft_mean = busy * (base + mean_y) + p_idle * lone + np.where(queued, wait_p / theta, 0.0)
    top = base + t_dec + big_p * (2.0 * cut + 1.0) + 12.0 / theta * (wait_p > 1e-9)


    # 4. TPOT: per shape, mean + shot-noise cumulants (others' overlap in iterations x slope, their prefills)
    h_all, h_in = _kernel_integrals(st.outputs)
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
    return _Distributions(ttft_cdf, (np.minimum(lone, base), top), tpot, ttft_mean, n, iteration, wait_p,
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
