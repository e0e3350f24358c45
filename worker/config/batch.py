"""The ``[batch]`` and ``[limits]`` sections: batching, backpressure and input bounds."""

from __future__ import annotations

from pydantic import Field, model_validator

from worker.config.base import Section


class BatchSettings(Section):
    max_batch_size: int = Field(16, ge=1, le=4096)
    max_delay_ms: float = Field(20.0, ge=0)
    # A due batch is padded up to the next static size unless that wastes more than this.
    max_pad_fraction: float = Field(0.5, ge=0, le=1)
    max_in_flight_batches: int = Field(2, ge=1, le=64)
    # Backpressure: stop taking records when this many jobs are held, take them again below
    # low (worker/loop/backpressure.py).
    high_watermark: int = Field(512, ge=1)
    low_watermark: int = Field(128, ge=0)
    # ... or when the held records' bytes reach this (resume once both are low): the job
    # count alone allows 512 x 25 MiB.
    high_watermark_bytes: int = Field(512 * 1024 * 1024, ge=1024 * 1024)
    low_watermark_bytes: int = Field(128 * 1024 * 1024, ge=0)
    # A partition with this many offsets consumed past its committed position is paused (its
    # head is stuck: an output that cannot be delivered) until it is back under half; also the
    # most a restart repeats of it. A healthy partition's span is its rate times the commit
    # interval plus a batch (about 1.2 s with the defaults): 20,000 leaves room for 15k jobs/s
    # on one partition, more than one H200 process was measured to take, and costs ~2 MB of
    # bookkeeping per partition at the limit (worker/loop/hold.py).
    max_uncommitted_per_partition: int = Field(20_000, ge=100)
    # The longest a loop step waits for records while it holds no jobs (it returns as soon as
    # one arrives: the intake's take); with work pending it waits at most 1 ms, or, every
    # batch slot busy, until a batch finishes.
    poll_timeout_ms: float = Field(50.0, gt=0)
    # librdkafka prefetches this much per consumer (its default is 64 MiB); part of the memory
    # bound together with the watermarks.
    fetch_queue_kbytes: int = Field(16_384, ge=1024)

    @model_validator(mode="after")
    def _watermarks(self) -> BatchSettings:
        if self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        if self.low_watermark_bytes >= self.high_watermark_bytes:
            raise ValueError("low_watermark_bytes must be below high_watermark_bytes")
        if self.high_watermark < self.max_batch_size:
            raise ValueError("high_watermark must be at least max_batch_size")
        return self


class LimitsSettings(Section):
    max_message_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    # A DLQ record is the original record plus our headers; one larger than this (key, value
    # and headers) is dead-lettered by reference instead: its value replaced by a small JSON
    # document naming the source record (topic, partition, offset, size, sha256). The default
    # fits Kafka's default max.message.bytes (1 MiB) with room for the headers.
    dlq_inline_max_bytes: int = Field(1_000_000, ge=1024)
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    max_image_pixels: int = Field(40_000_000, ge=64)
    max_image_side: int = Field(16_384, ge=8)
    max_text_chars: int = Field(20_000, ge=0, le=100_000)
