"""Kafka plumbing of the replay: client settings, an admin helper, a read-to-the-end reader.

The replay's consumer never joins a group: it ``assign()``s partitions at explicit offsets,
under a throwaway ``group.id`` (librdkafka wants one) with auto commit and offset store off,
and it never calls commit. So no group's committed offsets, the live one's least of all, move.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # re-exported untyped by .admin

from worker.config import WorkerConfig
from worker.kafka import consumer_settings, is_fatal, producer_settings
from worker.tools.replay.exceptions import ReplayError, UnknownTopic

# Keys of consumer_settings() that an AdminClient would warn about and ignore.
_CONSUMER_ONLY = frozenset({
    "group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
    "partition.assignment.strategy", "session.timeout.ms", "max.poll.interval.ms",
    "max.partition.fetch.bytes", "fetch.max.bytes", "isolation.level",
    "queued.max.messages.kbytes", "queued.min.messages", "fetch.min.bytes", "fetch.wait.max.ms",
    "heartbeat.interval.ms", "group.instance.id", "group.protocol", "enable.partition.eof",
    "check.crcs",
})


def replay_consumer_settings(cfg: WorkerConfig, replay_id: str) -> dict[str, Any]:
    conf = consumer_settings(cfg)
    conf.update({
        "group.id": f"ktw-replay-{replay_id}",  # throwaway: assign() only, never committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
    })
    return conf


def replay_producer_settings(cfg: WorkerConfig) -> dict[str, Any]:
    conf = producer_settings(cfg)
    # Required by the replay's no-duplicate design, whatever producer_extra says.
    conf.update({"enable.idempotence": True, "acks": "all"})
    return conf


def admin_settings(cfg: WorkerConfig) -> dict[str, Any]:
    drop = _CONSUMER_ONLY | set(cfg.kafka.consumer_extra)
    return {k: v for k, v in consumer_settings(cfg).items() if k not in drop}


@dataclass(frozen=True, slots=True)
class Found:
    """An offset found by timestamp, with the timestamp of the record there."""

    offset: int  # -1 when no record is at or after the time
    timestamp: int


def _wrap(exc: Exception, what: str) -> ReplayError:
    err = exc.args[0] if exc.args else None
    detail = err.str() if isinstance(err, ck.KafkaError) else str(exc)
    return ReplayError(f"{what}: {detail}")


class Admin:
    """Metadata and offset look-ups; nothing here reads a record."""

    def __init__(self, settings: dict[str, Any], timeout: float = 30.0) -> None:
        self._client = AdminClient(settings)
        self._timeout = timeout

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; :class:`UnknownTopic` if it does not exist."""
        try:
            meta = self._client.list_topics(timeout=self._timeout)
        except ck.KafkaException as exc:
            raise _wrap(exc, "could not read cluster metadata") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            known = sorted(t for t in meta.topics if not t.startswith("__"))
            hint = f" (topics: {', '.join(known[:20])})" if known else ""
            raise UnknownTopic(f"topic {topic!r} does not exist{hint}")
        return sorted(found.partitions)

    def _list(self, specs: dict[ck.TopicPartition, Any], what: str
              ) -> dict[tuple[str, int], Any]:
        if not specs:
            return {}
        try:
            futures = self._client.list_offsets(
                specs, isolation_level=ck.IsolationLevel.READ_COMMITTED,
                request_timeout=self._timeout,
            )
            return {(tp.topic, tp.partition): f.result(self._timeout)
                    for tp, f in futures.items()}
        except ck.KafkaException as exc:
            raise _wrap(exc, f"could not list {what} offsets") from exc

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """(first retained offset, end offset) per partition; the end is the last stable one."""
        parts = list(partitions)
        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        low = self._list({ck.TopicPartition(topic, p): earliest for p in parts}, "earliest")
        high = self._list({ck.TopicPartition(topic, p): latest for p in parts}, "latest")
        return {p: (low[(topic, p)].offset, high[(topic, p)].offset) for p in parts}

    def offsets_for_time(self, topic: str, partitions: Iterable[int], ms: int
                         ) -> dict[int, Found]:
        """Per partition, the first offset whose timestamp is >= ``ms`` (and that timestamp)."""
        parts = list(partitions)
        got = self._list(
            {ck.TopicPartition(topic, p): OffsetSpec.for_timestamp(ms) for p in parts},
            "by-timestamp",
        )
        return {p: Found(got[(topic, p)].offset, got[(topic, p)].timestamp) for p in parts}


def read_to_end(
    settings: dict[str, Any],
    topic: str,
    ranges: dict[int, tuple[int, int]],
    on_message: Callable[[ck.Message], None],
    *,
    timeout: float = 300.0,
) -> int:
    """Read ``[start, end)`` of each partition, calling ``on_message``; return records read."""
    todo = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not todo:
        return 0
    consumer = ck.Consumer(settings)
    n = 0
    try:
        consumer.assign([ck.TopicPartition(topic, p, s) for p, (s, _) in todo.items()])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise ReplayError(f"reading {topic} did not reach its end in {timeout:.0f} s "
                                  f"(partitions left: {sorted(todo)})")
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if is_fatal(err):
                        raise ReplayError(f"reading {topic} failed: {err.str()}")
                    continue
                p, off = msg.partition(), msg.offset()
                if p in todo and off is not None and off < todo[p][1]:
                    on_message(msg)
                    n += 1
            for tp in consumer.position([ck.TopicPartition(topic, p) for p in list(todo)]):
                if tp.offset >= todo[tp.partition][1]:
                    del todo[tp.partition]
    except ck.KafkaException as exc:
        raise _wrap(exc, f"reading {topic} failed") from exc
    finally:
        consumer.close()
    return n
