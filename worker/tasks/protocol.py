"""What the worker loop serves: a task that admits records, batches them and answers them.

The loop in :mod:`worker.loop.worker` knows Kafka, offsets and transactions, and nothing about
models. A :class:`ServedTask` knows its jobs: it decodes and checks a record (a rejection goes
to the DLQ), batches what it admitted, runs batches without blocking the loop and hands back
:class:`Answer` s, each one the encoded result of one source record. Three tasks exist
(:mod:`worker.tasks.registry`): open_nsfw moderation, image-and-text moderation by policy, and
text-to-image generation.

:class:`BatchedTask` is the common shape for a task with one batcher and a
``submit(batch) -> Future[list[outcome]]`` core (open_nsfw moderation and generation); the
image-and-text task batches per engine itself and is adapted in :mod:`worker.tasks.registry`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from engines.profiles import Profile
from worker.config import BatchSettings
from worker.exceptions import JobRejected, OversizedMessage, SchemaViolation
from worker.loop.commit.offsets import TopicPartitionKey
from worker.tasks.batcher import Batch, Batchable, DynamicBatcher, NoProfileFits
from worker.wire.moderation_jobs import Status
from worker.wire.records import Headers, SourceRecord, SourceRef


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

    @property
    def expired(self) -> bool:
        return self.status == Status.EXPIRED.value


class ServedTask(Protocol):
    topics: TaskTopics
    model_id: str
    # Called with (milliseconds, jobs) as each batch finishes, where the task can tell.
    on_batch_done: Callable[[float, int], None] | None

    @property
    def engine_hash(self) -> str: ...

    def warm_up(self) -> None:
        """Activate engines and run every shape once; called before the first poll."""

    def admit(self, record: SourceRecord, epoch: int, consumed_at: float) -> None:
        """Decode, check and queue one record; raise :class:`JobRejected` for the DLQ."""

    def step(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        """Release due batches (at most ``free``, unless ``force``); answer expired jobs."""

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

    def close(self) -> None: ...


class Core(Protocol):
    """What :class:`BatchedTask` needs from a one-batcher task."""

    model_id: str

    @property
    def engine_hash(self) -> str: ...

    def warm_up(self) -> None: ...

    def pending(self, record: SourceRecord, epoch: int, consumed_at: float) -> Any:
        """Decode and check ``record`` into the batcher's item (raise JobRejected)."""

    def submit(self, batch: Batch[Any]) -> Future[list[Any]]: ...

    def expired_result(self, p: Any, now_ms: int) -> Any: ...

    def encode(self, result: Any) -> tuple[bytes, Headers]:
        """A result's value and headers on the results topic."""

    def ready(self) -> bool: ...

    def close(self) -> None: ...


P = TypeVar("P", bound=Batchable)


class BatchedTask(Generic[P]):
    """One :class:`DynamicBatcher` in front of a core whose ``submit`` runs a batch off the
    loop's thread. Outcomes are anything with ``pending``, ``result`` and ``rejection``."""

    def __init__(self, topics: TaskTopics, core: Core, batcher: DynamicBatcher[P]) -> None:
        self.topics, self.core, self.batcher = topics, core, batcher
        self.model_id = core.model_id
        self.on_batch_done: Callable[[float, int], None] | None = None
        self._in_flight: list[tuple[Future[list[Any]], int, float]] = []  # future, size, start

    @property
    def engine_hash(self) -> str:
        return self.core.engine_hash

    def warm_up(self) -> None:
        self.core.warm_up()

    def admit(self, record: SourceRecord, epoch: int, consumed_at: float) -> None:
        p = self.core.pending(record, epoch, consumed_at)
        try:
            self.batcher.add(p)
        except NoProfileFits as exc:
            raise SchemaViolation(str(exc), reason="no_profile") from exc

    def step(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        due = self.batcher.schedule(now, now_ms, limit=max(free, 0), force=force)
        answers = [self._answer(p, self.core.expired_result(p, now_ms)) for p in due.expired]
        for batch in due.batches:
            self._in_flight.append((self.core.submit(batch), len(batch.items), time.monotonic()))
        return answers

    def collect(self, *, block: bool) -> list[Answer]:
        answers: list[Answer] = []
        pending = []
        for entry in self._in_flight:
            fut, size, started = entry
            if not (block or fut.done()):
                pending.append(entry)
                continue
            # An exception here is a bug in the task, not a bad job: it stops the worker
            # without committing those offsets.
            outcomes = fut.result()
            if self.on_batch_done is not None:
                self.on_batch_done((time.monotonic() - started) * 1e3, size)
            for outcome in outcomes:
                if outcome.rejection is not None:
                    answers.append(self._rejected(outcome.pending, outcome.rejection))
                elif outcome.result is not None:
                    answers.append(self._answer(outcome.pending, outcome.result))
        self._in_flight = pending
        return answers

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        self.batcher.remove(lambda p: _partition_key(p) in keys)

    def held(self) -> int:
        return len(self.batcher) + sum(size for _, size, _ in self._in_flight)

    def in_flight(self) -> int:
        return len(self._in_flight)

    def wait(self, timeout: float) -> None:
        if self._in_flight:
            wait([f for f, _, _ in self._in_flight], timeout=timeout, return_when=FIRST_COMPLETED)

    def ready(self) -> bool:
        return self.core.ready()

    def close(self) -> None:
        self.core.close()

    def _answer(self, p: Any, result: Any) -> Answer:
        value, headers = self.core.encode(result)
        status = result.status.value
        return Answer(p.ref, p.record, p.epoch, result.id, status, result.id.encode(), value,
                      headers)

    @staticmethod
    def _rejected(p: Any, rejection: JobRejected) -> Answer:
        return Answer(p.ref, p.record, p.epoch, rejection=rejection)


def make_batcher(b: BatchSettings, profiles: tuple[Profile, ...], *,
                 max_batch_size: int | None = None, expire_deadlines: bool = True
                 ) -> DynamicBatcher[Any]:
    """A batcher over ``profiles`` with the ``[batch]`` settings (``max_batch_size`` overrides
    the jobs per batch, e.g. generation's image budget)."""
    return DynamicBatcher(profiles, max_batch_size=max_batch_size or b.max_batch_size,
                          max_delay_s=b.max_delay_ms / 1e3, max_pad_fraction=b.max_pad_fraction,
                          expire_deadlines=expire_deadlines)


def record_value(record: SourceRecord, max_message_bytes: int) -> bytes:
    """The record checks every task shares, before its own decoding: no tombstone, no record
    over ``limits.max_message_bytes``."""
    value = record.value
    if value is None:
        raise SchemaViolation("record has no value (tombstone)")
    if len(value) > max_message_bytes:
        raise OversizedMessage(f"record of {len(value)} bytes exceeds limits.max_message_bytes "
                               f"{max_message_bytes}")
    return value


def _partition_key(p: Any) -> TopicPartitionKey:
    key: TopicPartitionKey = p.partition_key
    return key


def source_ref(record: SourceRecord) -> SourceRef:
    return SourceRef(record.topic, record.partition, record.offset)

