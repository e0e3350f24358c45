"""Pause the assignment when too many records, or too many bytes of them, are held; resume
when both are under their low watermarks (512 jobs of up to 25 MiB each would be 12 GiB: the
byte watermarks bound memory where the job count cannot).

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
        self._high_bytes = batch.high_watermark_bytes
        self._low_bytes = batch.low_watermark_bytes
        self._stats = stats
        self.paused = False

    def update(self, held: int, held_bytes: int = 0) -> None:
        if not self.paused and (held >= self._high or held_bytes >= self._high_bytes):
            self._consumer.pause(self._consumer.assignment())
            self.paused = True
            self._stats.pauses += 1
            log.info("backpressure_pause", held=held, held_bytes=held_bytes)
        elif self.paused and held <= self._low and held_bytes <= self._low_bytes:
            self._consumer.resume(self._consumer.assignment())
            self.paused = False
            log.info("backpressure_resume", held=held, held_bytes=held_bytes)
