"""The base of a task with one batcher in front of ``submit(batch) -> Future[list[outcome]]``.

open_nsfw moderation (:class:`worker.tasks.moderation.open_nsfw.OpenNsfwTask`) and generation
(:class:`worker.tasks.generation.task.GenerationTask`) subclass :class:`BatchedTask`: they
implement the job side (decode and check a record, run a batch, answer an expired job, encode
a result) and inherit the rest of the :class:`worker.tasks.protocol.Task` protocol (admit,
schedule, collect, remove, ...). Image-and-text moderation batches per engine itself
(:mod:`worker.tasks.moderation.policy_task`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Generic, TypeVar

import structlog

from engines.profiles import Profile
from worker.config import BatchSettings
from worker.exceptions import (
    JobRejected,
    SchemaViolation,
    TaskFailed,
    WorkerError,
    is_transient,
    one_line,
)
from worker.tasks.batcher import Batch, Batchable, DynamicBatcher, NoProfileFits
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, admit_each
from worker.wire.records import Headers, SourceRecord, SourceRef, TopicPartitionKey

log = structlog.get_logger("worker")
# A job whose batch of one fails this many times is dead-lettered (internal_error).
FAILED_ALONE_LIMIT = 2
# A batch failed by an outage (worker.exceptions.is_transient) runs again after 1, 2, 4 ...
# 30 s, whole: splitting it would only multiply the failing calls.
TRANSIENT_FIRST_S = 1.0
TRANSIENT_MAX_S = 30.0


def sticky_device_error(message: str) -> bool:
    """A CUDA error that poisons the context (an illegal address, a launch failure): every
    later call fails too, so splitting the batch cannot help. Out of memory is not sticky."""
    text = message.lower()
    return ("cuda error" in text or "cudaerror" in text) and "out of memory" not in text


def stops_the_worker(exc: BaseException) -> bool:
    """Whether a batch's failure must stop the worker instead of being isolated: a fatal
    worker error, or a CUDA error that poisons the context (every later call fails too)."""
    if isinstance(exc, WorkerError) and not exc.recoverable and not isinstance(exc, JobRejected):
        return True
    return sticky_device_error(str(exc))


P = TypeVar("P", bound=Batchable)


class QueuedJob:
    """The batcher's view of a consumed job, for a task's item dataclass to inherit: its
    deadline and its source partition (from the item's ``job`` and ``ref``). The item adds
    ``item_shape``, which picks its engine profile."""

    __slots__ = ()
    ref: SourceRef
    job: Any

    @property
    def deadline_ms(self) -> int | None:
        deadline: int | None = self.job.deadline_ms
        return deadline

    @property
    def partition_key(self) -> tuple[str, int]:
        return (self.ref.topic, self.ref.partition)


class BatchedTask(abc.ABC, Generic[P]):
    """One :class:`DynamicBatcher` in front of :meth:`submit`, which runs a batch off the loop's
    thread. Outcomes are anything with ``pending``, ``result`` and ``rejection``; results
    anything with ``id`` and ``status``; items (``P``) anything with ``ref``, ``record`` and
    ``epoch`` besides what the batcher needs.

    A subclass is usable on its own (``submit`` a batch); :meth:`serve` puts the topics and the
    batcher in front of it, after which it is the :class:`~worker.tasks.protocol.Task` the loop
    serves (the factories in :mod:`worker.tasks.registry` do that)."""

    topics: TaskTopics
    # Called with (milliseconds, jobs, profile name, jobs the profile takes) per finished batch.
    on_batch_done: Callable[[float, int, str, int], None] | None = None
    _batcher: DynamicBatcher[P] | None = None
    _max_message_bytes: int = 0

    # -- the job side: what a subclass implements ---------------------------------------------
    @property
    @abc.abstractmethod
    def engine_hash(self) -> str: ...

    @abc.abstractmethod
    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float) -> P:
        """Decode and check a record's ``value`` into the batcher's item (raise JobRejected)."""

    @abc.abstractmethod
    def submit(self, batch: Batch[P]) -> Future[list[Any]]:
        """Run ``batch`` off the caller's thread: a future of one outcome per item."""

    @abc.abstractmethod
    def expired_result(self, p: P, now_ms: int) -> Any:
        """The result of a job the batcher found past its deadline (never run)."""

    @abc.abstractmethod
    def encode(self, result: Any) -> tuple[bytes, Headers]:
        """A result's value and headers on the results topic."""

    @abc.abstractmethod
    def warm_up(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def ready(self) -> bool:
        return True

    # -- the loop's side ----------------------------------------------------------------------
    def serve(self, topics: TaskTopics, batcher: DynamicBatcher[P], *,
              max_message_bytes: int) -> None:
        """Read jobs from ``topics`` through ``batcher``: the task is now what the loop serves."""
        self.topics, self._batcher = topics, batcher
        self._max_message_bytes = max_message_bytes
        # (future of its outcomes, time.monotonic() at submit, the batch)
        self._in_flight: list[tuple[Future[list[Any]], float, Batch[P]]] = []
        # Times a job failed in a batch of its own (poisoned-batch isolation: _isolate).
        self._failed_alone: dict[SourceRef, int] = {}
        # Batches failed by an outage, waiting to run again: (due, attempt, batch). They keep
        # their batch slot, so nothing new is launched into the same outage.
        self._waiting: list[tuple[float, int, Batch[P]]] = []
        self._outage: str | None = None  # the last outage's error, until a batch succeeds
        self._retry_of: dict[int, int] = {}  # id(future) of a relaunched batch -> its attempt

    @property
    def batcher(self) -> DynamicBatcher[P]:
        if self._batcher is None:
            raise RuntimeError(f"{type(self).__name__} is not served yet: call serve() first")
        return self._batcher

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        batcher = self.batcher

        def one(record: SourceRecord, value: bytes, epoch: int) -> None:
            p = self.intake(record, value, epoch, batch.consumed_at)
            try:
                batcher.add(p)
            except NoProfileFits as exc:
                raise SchemaViolation(str(exc), reason="no_profile") from exc

        return admit_each(batch, self._max_message_bytes, one)

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        if self._waiting:
            self._relaunch_due(now, force=force)
        due = self.batcher.schedule(now, now_ms, limit=max(free, 0), force=force)
        answers = [self._answer(p, self.expired_result(p, now_ms)) for p in due.expired]
        for batch in due.batches:
            self._launch(batch)
        return answers

    def _launch(self, batch: Batch[P]) -> None:
        self._in_flight.append((self.submit(batch), time.monotonic(), batch))

    def collect(self, *, block: bool) -> list[Answer]:
        answers: list[Answer] = []
        pending = []
        in_flight_before = len(self._in_flight)
        for entry in self._in_flight[:in_flight_before]:
            fut, started, batch = entry
            if not (block or fut.done()):
                pending.append(entry)
                continue
            attempt = self._retry_of.pop(id(fut), 1) if self._retry_of else 1
            try:
                outcomes = fut.result()
            except Exception as exc:  # fatal ones re-raised, outages waited, the rest isolated
                if self.fatal(exc):
                    raise  # stops the worker without committing these jobs
                if is_transient(exc):
                    self._wait_out(batch, exc, attempt=attempt)
                    continue
                answers += self._isolate(batch, exc)
                continue
            self._outage = None
            done = time.monotonic()
            if self.on_batch_done is not None:
                profile = batch.profile
                self.on_batch_done((done - started) * 1e3, len(batch.items), profile.name,
                                   min(self.batcher.max_batch_size, profile.max_batch))
            for outcome in outcomes:
                p = outcome.pending
                if outcome.rejection is not None:
                    answers.append(Answer(p.ref, p.record, p.epoch, rejection=outcome.rejection))
                elif outcome.result is not None:
                    a = self._answer(p, outcome.result)
                    a.consumed_at, a.batched_at, a.done_at = p.consumed_at, started, done
                    answers.append(a)
        # Halves resubmitted by _isolate while collecting stay in flight.
        self._in_flight = pending + self._in_flight[in_flight_before:]
        return answers

    def fatal(self, exc: BaseException) -> bool:
        return stops_the_worker(exc)

    def _isolate(self, batch: Batch[P], exc: BaseException) -> list[Answer]:
        """A batch that failed as a whole (a bug one job triggers, a transient failure): its
        halves run again, down to single jobs; a job that fails alone ``FAILED_ALONE_LIMIT``
        times is dead-lettered (``internal_error``, the exception named), so one job cannot
        stop the worker on every restart nor take its batch-mates with it."""
        items = batch.items
        why = one_line(f"{type(exc).__name__}: {exc}")
        if len(items) > 1:
            log.warning("batch_failed_split", jobs=len(items), profile=batch.profile.name,
                        error=why)
            mid = len(items) // 2
            for half in (items[:mid], items[mid:]):
                self._launch(Batch(batch.profile, half, batch.profile.padded(len(half))))
            return []
        p: Any = items[0]  # the task's item: ref, record, epoch (as in _answer)
        tries = self._failed_alone.get(p.ref, 0) + 1
        if tries < FAILED_ALONE_LIMIT:
            self._failed_alone[p.ref] = tries
            log.warning("job_failed_alone_retried", topic=p.ref.topic,
                        partition=p.ref.partition, offset=p.ref.offset, error=why)
            self._launch(batch)
            return []
        self._failed_alone.pop(p.ref, None)
        log.error("job_failed_alone", topic=p.ref.topic, partition=p.ref.partition,
                  offset=p.ref.offset, attempts=tries, error=why)
        return [Answer(p.ref, p.record, p.epoch, rejection=TaskFailed(
            f"the task failed on this job alone {tries} times: {why}"))]

    def _wait_out(self, batch: Batch[P], exc: BaseException, *, attempt: int) -> None:
        why = one_line(f"{type(exc).__name__}: {exc}")
        wait_s = min(TRANSIENT_MAX_S, TRANSIENT_FIRST_S * 2 ** (attempt - 1))
        self._outage = why
        self._waiting.append((time.monotonic() + wait_s, attempt, batch))
        log.warning("batch_waits_for_outage", jobs=len(batch.items), profile=batch.profile.name,
                    attempt=attempt, retry_in_s=wait_s, error=why)

    def _relaunch_due(self, now: float, *, force: bool) -> None:
        """Run the waiting batches that are due again. ``force`` (the drain at shutdown):
        drop them instead, uncommitted, for the partitions' next owner to redo: a drain must
        not wait for an outage to end."""
        keep: list[tuple[float, int, Batch[P]]] = []
        for due, attempt, batch in self._waiting:
            if force:
                log.warning("batch_dropped_in_outage", jobs=len(batch.items),
                            reason="shutting down while its outage lasts; not committed")
            elif due <= now:
                fut = self.submit(batch)
                self._in_flight.append((fut, time.monotonic(), batch))
                self._retry_of[id(fut)] = attempt + 1
            else:
                keep.append((due, attempt, batch))
        self._waiting = keep

    def unavailable(self) -> str | None:
        if self._outage is None or self._batcher is None:
            return None
        return f"batches wait for an outage to end: {self._outage[:200]}"

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        if self._waiting:
            kept = []
            for due, attempt, batch in self._waiting:
                items = [p for p in batch.items if p.partition_key not in keys]
                if items:
                    kept.append((due, attempt, Batch(batch.profile, items,
                                                     batch.profile.padded(len(items)))))
            self._waiting = kept
        self.batcher.remove(lambda p: p.partition_key in keys)
        self._failed_alone = {r: n for r, n in self._failed_alone.items()
                              if (r.topic, r.partition) not in keys}

    def held(self) -> int:
        return (len(self.batcher) + sum(len(entry[2].items) for entry in self._in_flight)
                + sum(len(entry[2].items) for entry in self._waiting))

    def in_flight(self) -> int:
        return len(self._in_flight) + len(self._waiting) if self._batcher is not None else 0

    def wait(self, timeout: float) -> None:
        if self._batcher is None:
            return
        if self._in_flight:
            wait([entry[0] for entry in self._in_flight], timeout=timeout,
                 return_when=FIRST_COMPLETED)
        elif self._waiting:  # nothing computing: until the first waiting batch is due
            time.sleep(max(0.0, min(timeout, min(w[0] for w in self._waiting)
                                    - time.monotonic())))

    def _answer(self, p: Any, result: Any) -> Answer:
        try:
            value, headers = self.encode(result)
        except Exception as exc:  # noqa: BLE001 - any bug in one result: TaskFailed
            log.error("result_unencodable", job_id=getattr(result, "id", None),
                      topic=p.ref.topic, partition=p.ref.partition, offset=p.ref.offset,
                      error=f"{type(exc).__name__}: {exc}"[:300])
            return Answer(p.ref, p.record, p.epoch, rejection=TaskFailed(
                f"the worker could not encode this job's result: {type(exc).__name__}: "
                f"{exc}"[:500]))
        # A StrEnum member is a str: stored as it is (no .value lookup per job).
        return Answer(p.ref, p.record, p.epoch, result.id, result.status,
                      result.id.encode(), value, headers)


def make_batcher(b: BatchSettings, profiles: tuple[Profile, ...], *,
                 max_batch_size: int | None = None, expire_deadlines: bool = True
                 ) -> DynamicBatcher[Any]:
    """A batcher over ``profiles`` with the ``[batch]`` settings (``max_batch_size`` overrides
    the jobs per batch, e.g. generation's image budget)."""
    return DynamicBatcher(profiles, max_batch_size=max_batch_size or b.max_batch_size,
                          max_delay_s=b.max_delay_ms / 1e3, max_pad_fraction=b.max_pad_fraction,
                          expire_deadlines=expire_deadlines)
