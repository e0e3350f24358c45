"""What the worker loop serves: one Task protocol, whatever the jobs.

The loop (:mod:`worker.loop.worker`) knows Kafka, offsets and commits, and nothing about models.
A :class:`Task` knows its jobs: it admits a consumed batch of records (decoding and checking
them; a rejection comes back at once as an :class:`Answer` for the DLQ), batches what it
admitted per engine profile, submits batches without blocking the loop, and hands back
:class:`Answer` s, each the encoded result of one source record. Tasks are found by name in
:mod:`worker.tasks.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from worker.exceptions import JobRejected, OversizedMessage, SchemaViolation, UnreadableHeaders
from worker.wire.moderation_jobs import Status
from worker.wire.records import Headers, SourceRecord, SourceRef, TopicPartitionKey

_EXPIRED = Status.EXPIRED.value  # (an enum's .value is a descriptor call: once, here)


@dataclass(frozen=True, slots=True)
class TaskTopics:
    jobs: str
    results: str
    dlq: str


@dataclass(slots=True)
class Answer:
    """The outcome of one source record: an encoded result, or a rejection for the DLQ."""

    ref: SourceRef
    record: SourceRecord
    epoch: int  # the partition's epoch at intake (stale if it has moved on since)
    job_id: str = ""
    status: str = ""  # the result's status ("ok", "expired", "error"), for stats and logs
    key: bytes | None = None
    value: bytes | None = None
    headers: Headers | None = None
    rejection: JobRejected | None = None
    # time.monotonic() at fetch, batch formed and engine done, where the task can tell (else
    # 0.0): the loop's per-hop timings (worker.loop.hops).
    consumed_at: float = field(default=0.0, compare=False)
    batched_at: float = field(default=0.0, compare=False)
    done_at: float = field(default=0.0, compare=False)

    @property
    def expired(self) -> bool:
        return self.status == _EXPIRED


@dataclass(frozen=True, slots=True)
class ConsumedBatch:
    """Records of one ``consume()`` call, in the order they came, with their partitions'
    epochs, read at admission (an answer whose partition moved on since is discarded as
    stale)."""

    records: Sequence[SourceRecord]
    epochs: Mapping[TopicPartitionKey, int]
    consumed_at: float  # time.monotonic() when the batch was consumed

    def epoch(self, record: SourceRecord) -> int:
        return self.epochs.get((record.topic, record.partition), 0)


class Task(Protocol):
    topics: TaskTopics
    model_id: str
    # Called with (milliseconds, jobs, profile name, jobs the profile takes) as each batch
    # finishes, where the task can tell.
    on_batch_done: Callable[[float, int, str, int], None] | None

    @property
    def engine_hash(self) -> str: ...

    def warm_up(self) -> None:
        """Activate engines and run every shape once; called before the first poll."""

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        """Decode, check and queue a consumed batch; the rejected records' answers now."""

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        """Submit due batches (at most ``free``, unless ``force``) without blocking; answer
        expired jobs."""

    def collect(self, *, block: bool) -> list[Answer]:
        """Answers of finished batches (all in flight when ``block``)."""

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        """Drop queued jobs of these partitions; their computing jobs are answered as usual
        and discarded by the loop if stale."""

    def held(self) -> int:
        """Jobs queued or computing (the loop drains until this is zero)."""

    def in_flight(self) -> int:
        """Batches computing."""

    def wait(self, timeout: float) -> None:
        """Block until a batch in flight finishes, or ``timeout`` seconds (none in flight:
        returns at once)."""

    def ready(self) -> bool:
        """True once warm-up is done and batches run at full speed."""

    def unavailable(self) -> str | None:
        """Why batches wait instead of running (a downstream out for now: the blob store, a
        full disk, the device out of memory), for readiness; None when they run."""

    def close(self) -> None: ...


def admit_each(batch: ConsumedBatch, max_message_bytes: int,
               admit_one: Callable[[SourceRecord, bytes, int], None]) -> list[Answer]:
    """Admit records one by one through ``admit_one(record, value, epoch)``; a
    :class:`JobRejected` it raises (or the shared record checks) becomes that record's answer."""
    rejected: list[Answer] = []
    for record in batch.records:
        epoch = batch.epoch(record)
        try:
            admit_one(record, record_value(record, max_message_bytes), epoch)
        except JobRejected as exc:
            rejected.append(Answer(source_ref(record), record, epoch, rejection=exc))
    return rejected


def record_value(record: SourceRecord, max_message_bytes: int) -> bytes:
    """The record checks every task shares, before its own decoding: no tombstone, no record
    over ``limits.max_message_bytes``; headers that could be read."""
    if record.headers_error is not None:
        raise UnreadableHeaders(record.headers_error)
    value = record.value
    if value is None:
        raise SchemaViolation("record has no value (tombstone)")
    if len(value) > max_message_bytes:
        raise OversizedMessage(f"record of {len(value)} bytes exceeds limits.max_message_bytes "
                               f"{max_message_bytes}")
    return value


def source_ref(record: SourceRecord) -> SourceRef:
    return SourceRef(record.topic, record.partition, record.offset)

