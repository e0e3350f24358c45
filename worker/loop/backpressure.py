"""Hold back the intake when too many records, or too many bytes of them, are held; take it up
again when both are under their low watermarks (512 jobs of up to 25 MiB each would be 12 GiB:
the byte watermarks bound memory where the job count cannot).

Held back, the loop takes no records from consume(), except one every ``KEEPALIVE_S``: that call
serves librdkafka's callbacks (rebalances, commits, statistics) and keeps
``max.poll.interval.ms`` from expiring. librdkafka stops fetching once its own prefetch queue is
full (``batch.fetch_queue_kbytes``), so memory stays bounded by the watermarks plus that queue.

The partitions are not paused in librdkafka: its pause drops the prefetched records, and after
its resume the next fetch came 0.5-1 s later, an idle engine after every pause (with the shipped
settings and a 2 ms engine, 524 jobs/s; bench/kafka/loop_gaps.py).
"""

from __future__ import annotations

import structlog

from worker.config import BatchSettings
from worker.loop.stats import Stats

log = structlog.get_logger("worker")
# While held back, one consume() call this often (seconds): callbacks served within this delay.
KEEPALIVE_S = 0.5


class Backpressure:
    def __init__(self, batch: BatchSettings, stats: Stats) -> None:
        self._high, self._low = batch.high_watermark, batch.low_watermark
        self._high_bytes = batch.high_watermark_bytes
        self._low_bytes = batch.low_watermark_bytes
        self._stats = stats
        self.paused = False
        self._consumed_at = 0.0  # time.monotonic() of the last consume() call

    def update(self, held: int, held_bytes: int = 0) -> None:
        if not self.paused and (held >= self._high or held_bytes >= self._high_bytes):
            self.paused = True
            self._stats.pauses += 1
            log.info("backpressure_pause", held=held, held_bytes=held_bytes)
        elif self.paused and held <= self._low and held_bytes <= self._low_bytes:
            self.paused = False
            log.info("backpressure_resume", held=held, held_bytes=held_bytes)

    def overfull(self, held: int, held_bytes: int) -> bool:
        """Held back and still a quarter over a high watermark: the keepalive consumes kept
        admitting records (outputs stuck); the partition hold pauses everything then."""
        return self.paused and (held >= self._high + self._high // 4
                                or held_bytes >= self._high_bytes + self._high_bytes // 4)

    def consume_now(self, now: float) -> bool:
        """Whether this step calls consume(): always while taking records, else once per
        ``KEEPALIVE_S``."""
        if not self.paused or now - self._consumed_at >= KEEPALIVE_S:
            self._consumed_at = now
            return True
        return False
