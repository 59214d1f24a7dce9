"""The queueing model's fast numerical pieces (model/queueing_math.py, queueing_table.py) against plain references:
sums in index order bit for bit (a row's value must not depend on the rows evaluated with it), the lumped pmfs
against a per-row Python recursion, the written-out Gauss-Laguerre rule against numpy and against the moments it
integrates exactly, and the cached stability limit against its formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madmax_opt.model.queueing_math import laguerre_nodes, negative_binomial_pmf, poisson_pmf, row_sum


@pytest.mark.parametrize("shape", [(1, 7), (2, 1), (2, 48), (3, 5, 4), (17, 48), (500, 33), (1000, 256)])
def test_row_sum_adds_each_row_in_index_order(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.random(shape) * 10.0 ** rng.integers(-12, 12, shape)  # wide magnitudes: the order shows in the bits
    want = np.empty(shape[0])
    for i, row in enumerate(x.reshape(shape[0], -1)):
        acc = 0.0
        for v in row.tolist():
            acc += v
        want[i] = acc
    assert np.array_equal(row_sum(x), want)


def _lumped(want: list[float], cut: int) -> list[float]:
    """Terms from ``cut`` dropped, their mass (1 - the sum, added left to right) on term cut - 1."""
    kept = [v if k < cut else 0.0 for k, v in enumerate(want)]
    acc = 0.0
    for v in kept:
        acc += v
    kept[cut - 1] += max(1.0 - acc, 0.0)
    return kept


def test_poisson_and_negative_binomial_equal_a_per_row_recursion() -> None:
    rng = np.random.default_rng(7)
    terms = 24
    mean = np.concatenate([[0.0, 1e-9, 0.5, 3.0], rng.random(40) * 12.0])
    var = mean * np.concatenate([[1.0, 1.0, 1.0, 2.5], 1.0 + rng.random(40) * 3.0])
    cut = rng.integers(1, terms + 1, len(mean))
    first = np.exp(-mean)  # the same exp of the same vector; the rest is Python float arithmetic
    pois = poisson_pmf(mean, terms, cut)
    for i, m in enumerate(mean.tolist()):
        want = [float(first[i])]
        for k in range(1, terms):  # p_k = p_(k-1) mean / k, left to right
            want.append(want[-1] * m / k)
        assert pois[i].tolist() == _lumped(want, int(cut[i])), i
    assert np.allclose(pois.sum(axis=1), 1.0, rtol=1e-12, atol=0.0)
    nb = negative_binomial_pmf(mean, var, terms, cut)
    over = var > mean * (1.0 + 1e-9)
    p = np.where(over, mean / np.where(over, var, 1.0), 1.0)
    r = np.where(over, mean * p / np.maximum(1.0 - p, 1e-300), 1.0)
    start = np.exp(r * np.log(np.where(over, p, 1.0)))
    for i in range(len(mean)):
        if not over[i]:  # Poisson rows
            assert nb[i].tolist() == pois[i].tolist()
            continue
        ri, qi = float(r[i]), 1.0 - float(p[i])
        # the model's recursion p_k = p_(k-1) (k - 1 + r) / k (1 - p), left to right
        want = [float(start[i])]
        for k in range(1, terms):
            want.append(want[-1] * (k - 1 + ri) / k * qi)
        assert nb[i].tolist() == _lumped(want, int(cut[i])), i


def test_written_out_laguerre_rule() -> None:
    xi, wq = laguerre_nodes()
    ref_x, ref_w = np.polynomial.laguerre.laggauss(8)
    assert np.allclose(xi, ref_x, rtol=1e-13, atol=0.0) and np.allclose(wq, ref_w, rtol=1e-13, atol=0.0)
    for k in range(16):  # an 8-point rule integrates x^k e^-x exactly for k <= 15: k!
        assert float(np.sum(wq * xi**k)) == pytest.approx(math.factorial(k), rel=1e-11)


def test_cached_stability_limit_is_the_formula_and_read_only() -> None:
    from madmax_opt.io.problem import problem_from_dict
    from madmax_opt.model.queueing import service_table
    from madmax_opt.search.online import online_plans
    from madmax_opt.search.serving_space import ServingModel

    model = ServingModel(problem_from_dict({
        "model": "llama3-70b", "hardware": {"system": "dgx-h100", "gpus": 8},
        "task": {"kind": "inference", "prompt_len": 1024, "output_len": 256, "arrival_rate": 5.0,
                 "ttft_p99_s": 0.5}}))
    st = service_table(model.terms, online_plans(model), model.workload)
    limit = st.max_rate_per_replica()
    t_cap = np.array([np.interp(c, g, t) for c, g, t in zip(st.cap, st.n_grid, st.t_grid, strict=True)])
    want = st.cap / (st.mean_decode_iterations * t_cap + st.cap * st.prefill_s)
    assert np.allclose(limit, want, rtol=1e-12, atol=0.0)
    assert np.array_equal(st.decode_at_cap_s(), st.decode_s(st.cap)[0])
    with pytest.raises(ValueError):
        limit[0] = 0.0
    assert np.array_equal(st.take(np.array([2, 0])).max_rate_per_replica(), limit[[2, 0]])
