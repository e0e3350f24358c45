"""Where a job's time goes, hop by hop, from the consumer's fetch to the broker's ack.

Hops (seconds, one sample per job unless said otherwise):

- ``intake``: fetch -> admitted (consume() returned -> the task admitted the consumed batch;
  one sample per consumed batch);
- ``queue``: fetch -> batch formed (the job waited in the batcher, intake included);
- ``engine``: batch formed -> engine done (preprocessing, the engine, and the wait for a free
  slot; as the loop sees it when it collects the batch);
- ``output``: engine done -> result produced (encoding waited for, the loop's turn);
- ``delivery``: result produced -> delivery acknowledged (at-least-once: the last record of
  the same emit() acknowledged, as reports are taken per batch), or -> its
  transaction committed (exactly-once: outputs become visible to read_committed readers then,
  so the hop includes the wait for the commit interval).

Samples are kept in bounded windows (the most recent ``keep`` per hop), so a long-running worker
holds a constant amount; :meth:`HopTimes.summary` gives p50 / p99 in milliseconds. Every sample
also lands in a cumulative histogram per hop (``buckets``), exported to Prometheus as
``trt_worker_hop_seconds``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from typing import Any

from worker.observe.buckets import LATENCY_BOUNDS, Buckets

HOPS = ("intake", "queue", "engine", "output", "delivery")


class HopTimes:
    def __init__(self, keep: int = 100_000) -> None:
        self._samples: dict[str, deque[float]] = {h: deque(maxlen=keep) for h in HOPS}
        self.buckets = {h: Buckets(LATENCY_BOUNDS) for h in HOPS}

    def add(self, hop: str, seconds: float) -> None:
        self._samples[hop].append(seconds)
        b = self.buckets[hop]  # Buckets.observe inlined: ~4 samples per job on the hot path
        b.counts[bisect_left(b.bounds, seconds)] += 1
        b.sum += seconds

    def add_many(self, hop: str, values: list[float]) -> None:
        self._samples[hop].extend(values)
        b = self.buckets[hop]
        counts, bounds = b.counts, b.bounds
        for v in values:
            counts[bisect_left(bounds, v)] += 1
        b.sum += sum(values)

    def answered(self, answers: list[Any]) -> None:
        """The queue, engine and output hops of answers the engine ran (worker.tasks.protocol
        .Answer: consumed_at, batched_at, done_at), as they are produced. One list per hop for
        the whole batch of answers: three ``add`` calls per job cost more than the lists."""
        now = time.monotonic()
        ran = [a for a in answers if a.done_at]
        if not ran:
            return
        self.add_many("queue", [a.batched_at - a.consumed_at for a in ran])
        self.add_many("engine", [a.done_at - a.batched_at for a in ran])
        self.add_many("output", [now - a.done_at for a in ran])

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for hop, window in self._samples.items():
            if not window:
                continue
            xs = sorted(window)
            n = len(xs)
            out[hop] = {"n": n, "p50_ms": xs[n // 2] * 1e3,
                        "p99_ms": xs[min(n - 1, (n * 99) // 100)] * 1e3}
        return out
