"""A GPU's streams on one network tier as a processor-sharing link (the step-timeline simulator's ``SharedLink``).

Used by ``trace.py``: ZeRO-3 all-gathers, gradient buckets and pipeline sends are step-level traffic that contends
with the layer collectives on the same tier; each busy stream gets an equal share of the tier's bandwidth.
"""

from __future__ import annotations

import math
from collections import deque


class LinkOp:
    """A collective on a shared link: ``work_s`` at the link's full bandwidth; start/end known once served."""

    __slots__ = ("end_s", "issue_s", "queue", "rem_s", "start_s", "work_s")

    def __init__(self, queue: int, issue_s: float, work_s: float) -> None:
        self.queue = queue
        self.issue_s = issue_s
        self.work_s = work_s
        self.rem_s = work_s
        self.start_s = -1.0
        self.end_s = -1.0


class SharedLink:
    """The streams of one GPU on one network tier: each stream runs its ops in issue order, and the busy streams
    split the tier's bandwidth equally (processor sharing).

    E.g. ZeRO-3 all-gathers and gradient reduce-scatters run on separate CUDA streams (FSDP) over the same NIC:
    neither waits behind the other, and together they never move more bytes per second than the link. Evaluated
    lazily: ``finish(op)`` advances the link until ``op`` is done, which is exact because the engine issues every
    op no earlier than the link's current time and never before an op it has already waited for ends.
    """

    def __init__(self) -> None:
        self.queues: dict[int, deque[LinkOp]] = {}
        self.t = 0.0
        self.busy_s: dict[int, float] = {}

    def issue(self, queue: int, issue_s: float, work_s: float) -> LinkOp:
        op = LinkOp(queue, max(issue_s, self.t), work_s)
        if queue not in self.queues:
            self.queues[queue] = deque()
            self.busy_s[queue] = 0.0
        self.queues[queue].append(op)
        return op

    def idle_at(self, t: float) -> bool:
        """Advance to ``t``; whether nothing is left in flight."""
        self.finish(until_s=t)
        return not any(self.queues.values())

    def finish(self, op: LinkOp | None = None, until_s: float = math.inf) -> float:
        """Advance until ``op`` ends (default: until every op has ended, or to ``until_s``)."""
        queues = self.queues
        while op is None or op.end_s < 0.0:
            heads = [q[0] for q in queues.values() if q]
            if not heads or self.t >= until_s:
                break
            t = self.t
            if len(heads) == 1:  # one busy stream: its head runs alone at full bandwidth
                h = heads[0]
                start = max(t, h.issue_s)
                if h.start_s < 0.0:
                    if start >= until_s:
                        self.t = until_s
                        break
                    h.start_s = start
                end = start + h.rem_s
                if end > until_s:
                    h.rem_s = end - until_s
                    self.t = until_s
                    break
                h.rem_s = 0.0
                h.end_s = self.t = end
                self.busy_s[h.queue] += end - h.start_s
                queues[h.queue].popleft()
                continue
            active = [h for h in heads if h.issue_s <= t]
            if not active:
                self.t = min(min(h.issue_s for h in heads), until_s)
                continue
            k = len(active)
            for h in active:
                if h.start_s < 0.0:
                    h.start_s = t
            dt = min(h.rem_s for h in active) * k
            for h in heads:
                if t < h.issue_s < t + dt:
                    dt = h.issue_s - t
            dt = min(dt, until_s - t)
            self.t = t + dt
            for h in active:
                h.rem_s -= dt / k
                if h.rem_s <= 1e-12 * (h.work_s + 1e-9):
                    h.end_s = self.t
                    self.busy_s[h.queue] += h.end_s - h.start_s
                    queues[h.queue].popleft()
        return self.t
