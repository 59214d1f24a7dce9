"""Reference discrete-event simulation of one continuous-batching replica under Poisson arrivals (seeded).

It plays the iteration rules of ``model/queueing.py`` literally, request by request, with the same service table
(decode round t_dec(n), prefill P per prompt, pipeline fill delta, cap c, request mix), so the two differ only in
the queueing mathematics: the analytic percentiles are checked against it. Runs of identical decode-only iterations
(no arrival, no departure) advance in one step, so a run of 10^5 requests takes well under a second.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from madmax_opt.core.numeric import Arr
from madmax_opt.model.queueing import PERCENTILES, ServiceTable


@dataclass(frozen=True)
class SimulatedLatency:
    ttft_s: Arr  # per measured request
    tpot_s: Arr  # per measured request with at least 2 output tokens
    running_mean: float  # running sequences averaged over iterations
    iterations: int
    full_time_fraction: float  # share of the time all c slots were busy
    running_var: float  # time-weighted variance of the running sequences

    def percentiles(self) -> dict[str, float]:
        out = {}
        for p in PERCENTILES:
            out[f"ttft_p{p}_s"] = float(np.percentile(self.ttft_s, p))
            out[f"tpot_p{p}_s"] = float(np.percentile(self.tpot_s, p))
        out["ttft_s"] = float(self.ttft_s.mean())
        out["tpot_s"] = float(self.tpot_s.mean())
        return out


def simulate_replica(st: ServiceTable, rate_per_s: float, requests: int = 50_000, seed: int = 0,
                     warmup_fraction: float = 0.1) -> SimulatedLatency:
    """Simulate plan row 0 of ``st`` at ``rate_per_s`` requests/s into this replica; the first ``warmup_fraction``
    of the requests (and the last 2 %, which see a draining system) are not measured."""
    if len(st) != 1:
        raise ValueError("simulate_replica takes one plan (ServiceTable.row(i))")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, requests))
    shape = rng.choice(len(st.outputs), size=requests, p=st.shares / st.shares.sum())
    out = st.outputs[shape].astype(np.int64)
    cap = int(st.cap[0])
    big_p = float(st.prefill_s[0])
    delta = float(st.first_token_extra_s[0])
    t_of_n = np.concatenate([[0.0], _table(st, cap)])  # decode round with n = 0 .. c running

    admit_iter = np.zeros(requests, dtype=np.int64)
    admit_end = np.zeros(requests)
    seg_k: list[int] = []  # iteration segments: first iteration index, its end time, duration per iteration
    seg_t: list[float] = []
    seg_d: list[float] = []
    leave: list[int] = []  # heap of finishing iteration indices (last decode iteration)
    t, k, head, running = 0.0, 0, 0, 0
    run_sum = 0.0
    full_s = 0.0
    n1 = n2 = 0.0  # time-weighted moments of the running count
    while head < requests:
        arrived = int(np.searchsorted(arrivals, t, side="right"))
        if running == 0 and arrived == head:
            t = float(arrivals[head])  # idle until the next arrival
            continue
        admit = min(arrived - head, cap - running)
        if admit > 0:
            dur = t_of_n[running] + admit * big_p
            full_s += dur if running + admit >= cap else 0.0
            n1 += dur * running
            n2 += dur * running**2
            t += dur
            seg_k.append(k)
            seg_t.append(t)
            seg_d.append(dur)
            run_sum += running
            idx = slice(head, head + admit)
            admit_iter[idx] = k
            admit_end[idx] = t
            for o in out[idx]:
                if o > 1:
                    heapq.heappush(leave, k + int(o) - 1)
                    running += 1
            head += admit
            k += 1
        else:  # decode-only iterations until the next arrival (if a slot is free) or departure
            dur = t_of_n[running]
            steps = leave[0] - k + 1 if leave else 1
            if running < cap and arrived == head and head < requests:
                steps = min(steps, max(1, int(np.ceil((arrivals[head] - t) / dur))))
            seg_k.append(k)
            seg_t.append(t + dur)
            seg_d.append(dur)
            t += steps * dur
            full_s += steps * dur if running >= cap else 0.0
            n1 += steps * dur * running
            n2 += steps * dur * running**2
            run_sum += steps * running
            k += steps
        while leave and leave[0] <= k - 1:
            heapq.heappop(leave)
            running -= 1
    # drain: the rest leave after their last decode iteration; only the end times of those iterations matter
    while leave:
        dur = t_of_n[running]
        seg_k.append(k)
        seg_t.append(t + dur)
        seg_d.append(dur)
        steps = leave[0] - k + 1
        t += steps * dur
        k += steps
        while leave and leave[0] <= k - 1:
            heapq.heappop(leave)
            running -= 1

    sk, st_, sd = np.array(seg_k), np.array(seg_t), np.array(seg_d)

    def end_time(it: NDArray[np.int64]) -> Arr:
        s = np.searchsorted(sk, it, side="right") - 1
        return np.asarray(st_[s] + (it - sk[s]) * sd[s])

    lo, hi = int(warmup_fraction * requests), int(0.98 * requests)
    meas = np.arange(lo, hi)
    ttft = admit_end[meas] + delta - arrivals[meas]
    multi = meas[out[meas] > 1]
    tpot = (end_time(admit_iter[multi] + out[multi] - 1) - admit_end[multi]) / (out[multi] - 1)
    return SimulatedLatency(ttft, tpot, run_sum / max(k, 1), k, full_s / t, n2 / t - (n1 / t) ** 2)


def _table(st: ServiceTable, cap: int) -> Arr:
    n = np.arange(1, cap + 1, dtype=np.float64)
    rows = ServiceTable(
        cap=np.full(cap, st.cap[0]), n_grid=np.repeat(st.n_grid, cap, axis=0),
        t_grid=np.repeat(st.t_grid, cap, axis=0), prefill_s=np.repeat(st.prefill_s, cap),
        first_token_extra_s=np.repeat(st.first_token_extra_s, cap), replicas=np.repeat(st.replicas, cap),
        outputs=st.outputs, shares=st.shares)
    return rows.decode_s(n)[0]
