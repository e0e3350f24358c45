"""The redrive's clients: a DLQ reader committing under the redrive's own group and a sender
that confirms every delivery (the fetcher of by-reference jobs: :mod:`.fetch`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import DeliveryFailed, KafkaIOError
from worker.kafka import Consumer, Producer, is_fatal, producer_settings
from worker.kafka.clients import ClientSettings, reader_settings
from worker.kafka.headers import read_headers
from worker.wire.records import Headers

log = structlog.get_logger("worker.admin")

IDLE_TIMEOUT_S = 60.0  # no record while partitions are left: the broker is not answering


def sender_settings(cfg: WorkerConfig) -> ClientSettings:
    conf = producer_settings(cfg)
    conf.update({"enable.idempotence": True, "acks": "all"})  # whatever producer_extra says
    # Every record delivered or failed for good within this, so a confirm() that returns has
    # a final answer for each (librdkafka's default is 5 minutes).
    conf.setdefault("message.timeout.ms", 120_000)
    return conf


def timestamp_ms(msg: ck.Message) -> int | None:
    kind, ts = msg.timestamp()
    return None if kind == ck.TIMESTAMP_NOT_AVAILABLE else int(ts)


def header_list(msg: ck.Message) -> Headers | None:
    """The record's headers; None, logged, when they cannot be read (a key that is not UTF-8):
    a DLQ record without readable headers is then reported as no dead letter, and a job
    fetched by reference is re-sent without them (the worker dead-lettered it for them)."""
    headers, unreadable = read_headers(msg)
    if unreadable is not None:
        log.warning("headers_unreadable", topic=msg.topic(), partition=msg.partition(),
                    offset=msg.offset(), error=unreadable)
    return headers


def scan_start(committed: int | None, low: int, end: int) -> int:
    """Where a partition's scan starts: the redrive's commit, unless the log moved past it
    (expired) or it is beyond the end (the DLQ was recreated)."""
    return committed if committed is not None and low <= committed <= end else low


class DlqReader:
    """Reads ``[start, end)`` of each DLQ partition, in batches; :meth:`stop` leaves a
    partition where it is. :meth:`commit` stores the redrive's progress."""

    def __init__(self, cfg: WorkerConfig, group: str, topic: str,
                 ranges: dict[int, tuple[int, int]]) -> None:
        self.topic, self.ends = topic, {p: end for p, (_, end) in ranges.items()}
        self.todo = {p for p, (start, end) in ranges.items() if start < end}
        # assign() only (the group never has members); offsets are committed explicitly,
        # after the re-sent jobs are acknowledged; aborted transactional output is never read.
        self.consumer = Consumer(reader_settings(cfg, group))
        self.consumer.open()
        if self.todo:
            self.consumer.assign([ck.TopicPartition(topic, p, ranges[p][0])
                                  for p in sorted(self.todo)])

    def active(self, partition: int) -> bool:
        return partition in self.todo

    def stop(self, partition: int) -> None:
        self.todo.discard(partition)
        self.consumer.pause([ck.TopicPartition(self.topic, partition)])

    def batches(self) -> Iterator[list[ck.Message]]:
        last = time.monotonic()
        while self.todo:
            got = []
            for msg in self.consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if is_fatal(err):
                        raise KafkaIOError(f"reading {self.topic} failed: {err.str()}")
                    continue
                p, off = msg.partition(), msg.offset()
                if p in self.todo and off is not None and off < self.ends[p]:
                    got.append(msg)
            if got:
                last = time.monotonic()
                yield got
            positions = self.consumer.position(
                [ck.TopicPartition(self.topic, p) for p in sorted(self.todo)])
            self.todo -= {tp.partition for tp in positions if tp.offset >= self.ends[tp.partition]}
            if self.todo and time.monotonic() - last > IDLE_TIMEOUT_S:
                raise KafkaIOError(f"reading {self.topic}: nothing for {IDLE_TIMEOUT_S:.0f} s "
                                   f"(partitions left: {sorted(self.todo)})", recoverable=True)

    def commit(self, offsets: dict[int, int]) -> None:
        if offsets:
            self.consumer.commit([ck.TopicPartition(self.topic, p, o)
                                  for p, o in sorted(offsets.items())])

    def close(self) -> None:
        self.consumer.close()


class Sender:
    """An idempotent producer (acks=all) whose :meth:`confirm` checks every delivery."""

    def __init__(self, cfg: WorkerConfig) -> None:
        settings = sender_settings(cfg)
        self.confirm_s = int(settings["message.timeout.ms"]) / 1000 + 30
        self.producer = Producer(settings)
        self.producer.open()
        self.failures: list[str] = []

    def _delivered(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        if err is not None:
            self.failures.append(f"{msg.topic()}: {err.str()}")

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self.producer.produce(topic, key=key, value=value, headers=headers,
                              on_delivery=self._delivered)
        self.producer.poll(0)

    def confirm(self) -> None:
        """Raise :class:`DeliveryFailed` unless everything sent so far was acknowledged."""
        left = self.producer.flush(self.confirm_s)
        if left:
            raise DeliveryFailed(f"{left} re-sent jobs not acknowledged in "
                                 f"{self.confirm_s:.0f} s")
        if self.failures:
            raise DeliveryFailed(f"{len(self.failures)} re-sent jobs refused, e.g. "
                                 f"{self.failures[0]}")

    def close(self) -> None:
        self.producer.close()
