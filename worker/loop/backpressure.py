"""Pause the assignment when too many records are held; resume under the low watermark.

The loop keeps polling while paused, so ``max.poll.interval.ms`` is never breached and memory
stays bounded. Partitions assigned while paused are paused as they arrive.
"""

from __future__ import annotations

import structlog

from worker.config import BatchSettings
from worker.kafka import Consumer
from worker.loop.stats import Stats

log = structlog.get_logger("worker")


class Backpressure:
    def __init__(self, consumer: Consumer, batch: BatchSettings, stats: Stats) -> None:
        self._consumer, self._high, self._low = consumer, batch.high_watermark, batch.low_watermark
        self._stats = stats
        self.paused = False

    def update(self, held: int) -> None:
        if not self.paused and held >= self._high:
            self._consumer.pause(self._consumer.assignment())
            self.paused = True
            self._stats.pauses += 1
            log.info("backpressure_pause", held=held)
        elif self.paused and held <= self._low:
            self._consumer.resume(self._consumer.assignment())
            self.paused = False
            log.info("backpressure_resume", held=held)
