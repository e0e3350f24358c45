"""A task with one batcher in front of a ``submit(batch) -> Future[list[outcome]]`` core.

open_nsfw moderation and generation are such tasks; image-and-text moderation batches per engine
itself (:mod:`worker.tasks.moderation.multimodal`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Generic, Protocol, TypeVar

from engines.profiles import Profile
from worker.config import BatchSettings
from worker.exceptions import JobRejected, SchemaViolation
from worker.tasks.batcher import Batch, Batchable, DynamicBatcher, NoProfileFits
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, admit_each
from worker.wire.records import Headers, SourceRecord, TopicPartitionKey


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

    def __init__(self, topics: TaskTopics, core: Core, batcher: DynamicBatcher[P], *,
                 max_message_bytes: int) -> None:
        self.topics, self.core, self.batcher = topics, core, batcher
        self.max_message_bytes = max_message_bytes
        self.model_id = core.model_id
        self.on_batch_done: Callable[[float, int], None] | None = None
        self._in_flight: list[tuple[Future[list[Any]], int, float]] = []  # future, size, start

    @property
    def engine_hash(self) -> str:
        return self.core.engine_hash

    def warm_up(self) -> None:
        self.core.warm_up()

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        def one(record: SourceRecord, _value: bytes, epoch: int) -> None:
            p = self.core.pending(record, epoch, batch.consumed_at)
            try:
                self.batcher.add(p)
            except NoProfileFits as exc:
                raise SchemaViolation(str(exc), reason="no_profile") from exc

        return admit_each(batch, self.max_message_bytes, one)

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
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


def _partition_key(p: Any) -> TopicPartitionKey:
    key: TopicPartitionKey = p.partition_key
    return key
