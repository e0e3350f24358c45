"""Record and header types: where a job came from, and the consumed record as it arrived."""

from __future__ import annotations

from dataclasses import dataclass

TopicPartitionKey = tuple[str, int]

# confluent-kafka's header list; values we write are bytes, originals pass through as read.
Headers = list[tuple[str, str | bytes | None]]


# Not frozen: made per message, and a frozen dataclass's __init__ costs ~1 us more per object.
@dataclass(slots=True)
class SourceRecord:
    """The consumed record as it arrived, kept until its job is answered so a late rejection
    (an undecodable image found by the decode pool) still dead-letters the original bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    timestamp_ms: int | None
    # Why its headers could not be read (a key that is not UTF-8: worker.kafka.headers), then
    # ``headers`` is None: the record is dead-lettered by reference, reason ``bad_headers``.
    headers_error: str | None = None


# Not frozen (see SourceRecord), hashable all the same.
@dataclass(slots=True, unsafe_hash=True)
class SourceRef:
    """Where a job came from; carried to its result, its DLQ record and its offset commit."""

    topic: str
    partition: int
    offset: int
