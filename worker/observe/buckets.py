"""Cumulative histogram buckets kept by the loop itself, read by the metrics collector.

prometheus_client's Histogram takes a lock per observation; the loop is single-threaded and
observes several values per job, so it keeps plain counts here (one bisect and two adds) and
the collector copies them when Prometheus scrapes. A torn read between two scrapes only shifts
one sample into the next scrape.
"""

from __future__ import annotations

import bisect

# Seconds: 0.5 ms .. 60 s, about x2.5 per step (frames want the low end, generation the top).
LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                  5.0, 10.0, 30.0, 60.0)
RATIO_BOUNDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus's ``le`` buckets: (upper bound, samples at or below it), +Inf last."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out
