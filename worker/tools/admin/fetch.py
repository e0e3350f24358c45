"""Fetching the job of a by-reference dead letter from its source topic, if still retained."""

from __future__ import annotations

import time

import confluent_kafka as ck

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError
from worker.kafka import Consumer
from worker.kafka.admin import Admin
from worker.kafka.clients import reader_settings
from worker.tools.admin.deadletters import Reference


class SourceFetcher:
    """Fetches the job a by-reference dead letter names, if its topic still retains it."""

    def __init__(self, cfg: WorkerConfig, admin: Admin, group: str) -> None:
        self.admin = admin
        # Never commits: the group id is only what librdkafka asks of every consumer.
        self.consumer = Consumer(reader_settings(cfg, f"{group}.fetch"))
        self.consumer.open()

    def fetch(self, ref: Reference) -> ck.Message | str:
        """The record at ``ref``, or why it cannot be had any more."""
        topic = self.admin.metadata().topics.get(ref.topic)
        if topic is None or topic.error is not None or ref.partition not in topic.partitions:
            return f"{ref}: the source partition no longer exists"
        low, high = self.admin.watermarks(ref.topic, [ref.partition])[ref.partition]
        if not low <= ref.offset < high:
            held = f"offsets {low}..{high - 1}" if high > low else "no records"
            return f"{ref} no longer retained (the partition holds {held})"
        self.consumer.assign([ck.TopicPartition(ref.topic, ref.partition, ref.offset)])
        deadline = time.monotonic() + self.admin.timeout
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(1, timeout=0.5):
                if msg.error() is not None or (msg.topic(), msg.partition()) != (
                        ref.topic, ref.partition) or (msg.offset() or 0) < ref.offset:
                    continue  # left over from an earlier fetch
                if msg.offset() == ref.offset:
                    return msg
                return f"{ref} no longer retained (compacted, or an aborted transaction's)"
        raise KafkaIOError(f"fetching {ref}: no answer in {self.admin.timeout:.0f} s",
                           recoverable=True)

    def close(self) -> None:
        self.consumer.close()
