"""Reading fixed offset ranges of a topic to their ends, outside any consumer group (the
replay's resume scan and its comparison read their output topics through this)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import confluent_kafka as ck

from worker.exceptions import KafkaIOError
from worker.kafka.clients import is_fatal
from worker.kafka.consumer import Consumer


def read_ranges(
    settings: Mapping[str, Any],
    topic: str,
    ranges: dict[int, tuple[int, int]],
    on_message: Callable[[ck.Message], None],
    *,
    timeout: float = 300.0,
) -> int:
    """Read ``[start, end)`` of each partition of ``topic`` with a consumer of ``settings``
    (:func:`worker.kafka.clients.reader_settings`), calling ``on_message`` for each record in
    range; return how many. The end is reached by position, not by record: a transaction
    marker or a compacted record at the end would otherwise be waited for forever."""
    todo = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not todo:
        return 0
    consumer = Consumer(dict(settings))
    consumer.open()
    n = 0
    try:
        consumer.assign([ck.TopicPartition(topic, p, s) for p, (s, _) in todo.items()])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise KafkaIOError(f"reading {topic} did not reach its end in {timeout:.0f} s "
                                   f"(partitions left: {sorted(todo)})", recoverable=True)
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if is_fatal(err):
                        raise KafkaIOError(f"reading {topic} failed: {err.str()}",
                                           code=err.code())
                    continue
                p, off = msg.partition(), msg.offset()
                if p in todo and off is not None and off < todo[p][1]:
                    on_message(msg)
                    n += 1
            for tp in consumer.position([ck.TopicPartition(topic, p) for p in list(todo)]):
                if tp.offset >= todo[tp.partition][1]:
                    del todo[tp.partition]
    finally:
        consumer.close()
    return n
