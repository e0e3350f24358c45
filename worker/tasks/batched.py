"""The base of a task with dynamic batchers in front of ``submit(batch) -> Future[outcomes]``.

Moderation (:class:`worker.tasks.moderation.task.ModerationTask`, a batcher per part kind) and
generation (:class:`worker.tasks.generation.task.GenerationTask`, one batcher) subclass
:class:`BatchedTask`: they implement the job side (decode and check a record, run a batch,
answer an expired job, encode a result) and inherit the rest of the
:class:`worker.tasks.protocol.Task` protocol (admit, schedule, collect, remove, ...), batch
failure isolation included (:meth:`BatchedTask._isolate`, :meth:`BatchedTask._wait_out`).

Items are what the batchers batch. A task whose jobs are one item each (generation) uses the
defaults; a task whose jobs make several items (moderation: parts) overrides the hooks that
turn a job into items (:meth:`BatchedTask._queue`) and items back into answers
(:meth:`BatchedTask._settle`, :meth:`BatchedTask._expire`, :meth:`BatchedTask._reject`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from engines.profiles import Profile
from worker.config import BatchSettings
from worker.exceptions import (
    JobRejected,
    SchemaViolation,
    TaskFailed,
    Transient,
    WorkerError,
    is_transient,
    one_line,
)
from worker.tasks.batcher import Batch, Batchable, DynamicBatcher, NoProfileFits
from worker.tasks.gpu_share import GpuShare
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, admit_each
from worker.wire.records import Headers, SourceRecord, SourceRef, TopicPartitionKey

log = structlog.get_logger("worker")
# A job whose batch of one fails this many times is dead-lettered (internal_error).
FAILED_ALONE_LIMIT = 2
# A batch failed by an outage (worker.exceptions.is_transient) runs again after 1, 2, 4 ...
# 30 s, whole: splitting it would only multiply the failing calls.
TRANSIENT_FIRST_S = 1.0
TRANSIENT_MAX_S = 30.0
ONE_KIND = ""  # the batcher's key of a task with one batcher


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


@dataclass(eq=False)
class _Split(Generic[P]):
    """The items of a batch that failed as a whole, while its halves run apart. A job that
    fails alone waits here for the others: if every one of them fails alone, nothing can be
    pinned on any job (the engine is at fault), and the whole batch waits out an outage."""

    profile: Profile
    size: int
    left: int  # items not settled yet (answered, or failed alone for good)
    failed: list[tuple[P, str]] = field(default_factory=list)


class BatchedTask(abc.ABC, Generic[P]):
    """Dynamic batchers (one per item kind) in front of :meth:`submit`, which runs a batch off
    the loop's thread. Outcomes are whatever :meth:`_settle` reads (by default anything with
    ``pending``, ``result`` and ``rejection``); results anything with ``id`` and ``status``;
    items (``P``) anything with ``ref``, ``record`` and ``epoch`` besides what the batcher
    needs.

    A subclass is usable on its own (``submit`` a batch); :meth:`serve` puts the topics and the
    batchers in front of it, after which it is the :class:`~worker.tasks.protocol.Task` the
    loop serves (the factories in :mod:`worker.tasks.registry` do that)."""

    topics: TaskTopics
    # Called with (milliseconds, jobs, profile name, jobs the profile takes) per finished batch.
    on_batch_done: Callable[[float, int, str, int], None] | None = None
    _batchers: dict[str, DynamicBatcher[P]] | None = None
    _max_message_bytes: int = 0
    # Beside other tasks in one process (worker.tasks.gpu_share): the share, and whether this
    # task's steps wait for the others' batches (True) or its batches claim the GPU (False).
    _gpu_share: GpuShare | None = None
    _yields_gpu: bool = False

    # -- the job side: what a subclass implements ---------------------------------------------
    @property
    @abc.abstractmethod
    def engine_hash(self) -> str: ...

    @abc.abstractmethod
    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float
               ) -> Any:
        """Decode and check a record's ``value`` (raise JobRejected) into what :meth:`_queue`
        queues: by default one batcher item (``P``)."""

    @abc.abstractmethod
    def submit(self, batch: Batch[P]) -> Future[Any]:
        """Run ``batch`` off the caller's thread: a future of its outcomes (:meth:`_settle`)."""

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

    def kind_of(self, p: P) -> str:
        """The batcher an item goes to (a task with several overrides this)."""
        return ONE_KIND

    # -- the loop's side ----------------------------------------------------------------------
    def serve(self, topics: TaskTopics,
              batchers: DynamicBatcher[P] | Mapping[str, DynamicBatcher[P]], *,
              max_message_bytes: int) -> None:
        """Read jobs from ``topics`` through ``batchers`` (one, or one per item kind): the task
        is now what the loop serves."""
        self.topics = topics
        self._batchers = (dict(batchers) if isinstance(batchers, Mapping)
                          else {ONE_KIND: batchers})
        self._max_message_bytes = max_message_bytes
        # (future of its outcomes, time.monotonic() at submit, the batch)
        # (future, time.monotonic() at submit, batch, its attempt: 1, or more after an outage)
        self._in_flight: list[tuple[Future[Any], float, Batch[P], int]] = []
        # Times an item failed in a batch of its own (poisoned-batch isolation: _isolate), by
        # (its job's source, the item).
        self._failed_alone: dict[tuple[SourceRef, int], int] = {}
        # Items of batches that failed as a whole, by id(item): see _Split.
        self._split_of: dict[int, _Split[P]] = {}
        # Batches failed by an outage, waiting to run again: (due, attempt, batch). They keep
        # their batch slot, so nothing new is launched into the same outage.
        self._waiting: list[tuple[float, int, Batch[P]]] = []
        self._outage: str | None = None  # the last outage's error, until a batch succeeds

    @property
    def batchers(self) -> dict[str, DynamicBatcher[P]]:
        if self._batchers is None:
            raise RuntimeError(f"{type(self).__name__} is not served yet: call serve() first")
        return self._batchers

    @property
    def batcher(self) -> DynamicBatcher[P]:
        """The batcher of a task served with one."""
        (batcher,) = self.batchers.values()
        return batcher

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        self.batchers  # noqa: B018 - raises if not served

        def one(record: SourceRecord, value: bytes, epoch: int) -> None:
            self._queue(self.intake(record, value, epoch, batch.consumed_at))

        return admit_each(batch, self._max_message_bytes, one)

    def _queue(self, admitted: Any) -> None:
        """Queue what :meth:`intake` admitted: by default, it is one item."""
        self._add([admitted])

    def _add(self, items: Iterable[P]) -> None:
        """Queue one job's items, all or none: an item no profile fits refuses the job."""
        batchers = self.batchers
        added: list[P] = []
        try:
            for p in items:
                batchers[self.kind_of(p)].add(p)
                added.append(p)
        except NoProfileFits as exc:
            if added:
                ids = {id(p) for p in added}
                for batcher in batchers.values():
                    batcher.remove(lambda q: id(q) in ids)
            raise SchemaViolation(str(exc), reason="no_profile") from exc

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        if self._waiting:
            self._relaunch_due(now, force=force)
        answers: list[Answer] = []
        free = max(free, 0)
        for batcher in self.batchers.values():
            due = batcher.schedule(now, now_ms, limit=free, force=force)
            if due.expired:
                answers += self._expire(due.expired, now_ms)
            for batch in due.batches:
                self._launch(batch)
            free -= len(due.batches)
        return answers

    def share_gpu(self, share: GpuShare, *, yields: bool) -> None:
        """Serve beside other tasks on one GPU: ``yields``, wait in :meth:`yield_gpu` while
        their batches are in flight; else each batch claims the GPU until its outcome."""
        self._gpu_share, self._yields_gpu = share, yields

    @property
    def gpu_share(self) -> GpuShare | None:
        return self._gpu_share

    def yield_gpu(self, max_wait_s: float | None = None) -> None:
        """Before each step of a long batch (a denoising step): let the claimed batches of
        the other tasks go first (bounded by ``max_wait_s``, else by the share's own wait:
        worker.tasks.gpu_share); a no-op otherwise."""
        if self._gpu_share is not None and self._yields_gpu:
            self._gpu_share.yield_turn(max_wait_s)

    def _launch(self, batch: Batch[P], attempt: int = 1) -> None:
        share = self._gpu_share if not self._yields_gpu else None
        release = share.claim() if share is not None else None
        try:
            future = self.submit(batch)
        except BaseException:
            if release is not None:
                release()
            raise
        if release is not None:
            future.add_done_callback(lambda _done: release())
        self._in_flight.append((future, time.monotonic(), batch, attempt))

    def collect(self, *, block: bool) -> list[Answer]:
        answers: list[Answer] = []
        pending = []
        in_flight_before = len(self._in_flight)
        for entry in self._in_flight[:in_flight_before]:
            fut, started, batch, attempt = entry
            if not (block or fut.done()):
                pending.append(entry)
                continue
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
                cap = self.batchers[self.kind_of(batch.items[0])].max_batch_size
                self.on_batch_done((done - started) * 1e3, len(batch.items), profile.name,
                                   min(cap, profile.max_batch))
            if self._split_of or self._failed_alone:
                answers += self._settled(batch.items)
            answers += self._settle(outcomes, started, done)
        # Halves resubmitted by _isolate while collecting stay in flight.
        self._in_flight = pending + self._in_flight[in_flight_before:]
        return answers

    # -- from items back to answers: what a task whose jobs make several items overrides ------
    def _settle(self, outcomes: Any, started: float, done: float) -> list[Answer]:
        """The answers of a finished batch's outcomes (one per item by default)."""
        answers: list[Answer] = []
        for outcome in outcomes:
            p = outcome.pending
            if outcome.rejection is not None:
                answers.append(Answer(p.ref, p.record, p.epoch, rejection=outcome.rejection))
            elif outcome.result is not None:
                a = self._answer(p, outcome.result)
                a.consumed_at, a.batched_at, a.done_at = p.consumed_at, started, done
                answers.append(a)
        return answers

    def _expire(self, items: list[P], now_ms: int) -> list[Answer]:
        """The answers of items the batcher found past their deadline."""
        return [self._answer(p, self.expired_result(p, now_ms)) for p in items]

    def _reject(self, p: P, rejection: JobRejected) -> list[Answer]:
        """The answers when item ``p`` is refused after intake (it failed alone)."""
        q: Any = p  # the task's item: ref, record, epoch (as in _answer)
        return [Answer(q.ref, q.record, q.epoch, rejection=rejection)]

    # -- batch failures -----------------------------------------------------------------------
    def fatal(self, exc: BaseException) -> bool:
        return stops_the_worker(exc)

    def _isolate(self, batch: Batch[P], exc: BaseException) -> list[Answer]:
        """A batch that failed as a whole (a bug one job triggers): its halves run again, down
        to single items; an item that fails alone ``FAILED_ALONE_LIMIT`` times has its job
        dead-lettered (``internal_error``, the exception named), so one job cannot stop the
        worker on every restart nor take its batch-mates with it. When every item of the batch
        fails alone, no job is to blame: the batch waits out an outage (see :class:`_Split`)."""
        items = batch.items
        why = one_line(f"{type(exc).__name__}: {exc}")
        if len(items) > 1:
            log.warning("batch_failed_split", jobs=len(items), profile=batch.profile.name,
                        error=why)
            if id(items[0]) not in self._split_of:
                new: _Split[P] = _Split(batch.profile, len(items), len(items))
                for item in items:
                    self._split_of[id(item)] = new
            mid = len(items) // 2
            for half in (items[:mid], items[mid:]):
                self._launch(Batch(batch.profile, half, batch.profile.padded(len(half))))
            return []
        p: Any = items[0]  # the task's item: ref, record, epoch (as in _answer)
        key: tuple[SourceRef, int] = (p.ref, id(p))
        tries = self._failed_alone.get(key, 0) + 1
        if tries < FAILED_ALONE_LIMIT:
            self._failed_alone[key] = tries
            log.warning("job_failed_alone_retried", topic=p.ref.topic,
                        partition=p.ref.partition, offset=p.ref.offset, error=why)
            self._launch(batch)
            return []
        self._failed_alone.pop(key, None)
        split = self._split_of.pop(id(p), None)
        if split is None:
            return self._dead_letter(p, why, tries)
        split.failed.append((p, why))
        split.left -= 1
        return self._split_done(split)

    def _dead_letter(self, p: Any, why: str, tries: int = FAILED_ALONE_LIMIT) -> list[Answer]:
        log.error("job_failed_alone", topic=p.ref.topic, partition=p.ref.partition,
                  offset=p.ref.offset, attempts=tries, error=why)
        return self._reject(p, TaskFailed(f"the task failed on this job alone {tries} times: "
                                          f"{why}"))

    def _settled(self, items: list[P]) -> list[Answer]:
        """Items whose batch succeeded: forget their failures, and settle their splits."""
        answers: list[Answer] = []
        for item in items:
            p: Any = item
            if self._failed_alone:
                self._failed_alone.pop((p.ref, id(p)), None)
            split = self._split_of.pop(id(p), None)
            if split is not None:
                split.left -= 1
                answers += self._split_done(split)
        return answers

    def _split_done(self, split: _Split[P]) -> list[Answer]:
        if split.left > 0:
            return []
        if split.size > 1 and len(split.failed) == split.size:
            items = [p for p, _ in split.failed]
            self._wait_out(Batch(split.profile, items, split.profile.padded(len(items))),
                           Transient(f"every job of the batch failed alone: "
                                     f"{split.failed[0][1]}"), attempt=1)
            return []
        return [a for p, why in split.failed for a in self._dead_letter(p, why)]

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
                self._dropped(batch.items)
            elif due <= now:
                self._launch(batch, attempt + 1)
            else:
                keep.append((due, attempt, batch))
        self._waiting = keep

    def _dropped(self, items: list[P]) -> None:
        """Items left unanswered (revoked, or dropped at shutdown): out of their splits."""
        for p in items:
            split = self._split_of.pop(id(p), None)
            if split is not None:
                split.left -= 1
                split.size -= 1

    def unavailable(self) -> str | None:
        if self._outage is None or self._batchers is None:
            return None
        return f"batches wait for an outage to end: {self._outage[:200]}"

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        if self._waiting:
            kept = []
            for due, attempt, batch in self._waiting:
                items = [p for p in batch.items if p.partition_key not in keys]
                self._dropped([p for p in batch.items if p.partition_key in keys])
                if items:
                    kept.append((due, attempt, Batch(batch.profile, items,
                                                     batch.profile.padded(len(items)))))
            self._waiting = kept
        for batcher in self.batchers.values():
            batcher.remove(lambda p: p.partition_key in keys)
        self._failed_alone = {k: n for k, n in self._failed_alone.items()
                              if (k[0].topic, k[0].partition) not in keys}

    def held(self) -> int:
        return (sum(len(b) for b in self.batchers.values())
                + sum(len(entry[2].items) for entry in self._in_flight)
                + sum(len(entry[2].items) for entry in self._waiting)
                + sum(len(s.failed) for s in {id(s): s for s in self._split_of.values()}
                      .values()))

    def in_flight(self) -> int:
        return len(self._in_flight) + len(self._waiting) if self._batchers is not None else 0

    def wait(self, timeout: float) -> None:
        if self._batchers is None:
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
                 max_batch_size: int | None = None, expire_deadlines: bool = True,
                 weight: Callable[[Any], int] | None = None, max_weight: int | None = None
                 ) -> DynamicBatcher[Any]:
    """A batcher over ``profiles`` with the ``[batch]`` settings (``max_batch_size`` overrides
    the jobs per batch; ``weight`` and ``max_weight`` bound what a batch's jobs weigh, e.g.
    generation's images)."""
    return DynamicBatcher(profiles, max_batch_size=max_batch_size or b.max_batch_size,
                          max_delay_s=b.max_delay_ms / 1e3, max_pad_fraction=b.max_pad_fraction,
                          expire_deadlines=expire_deadlines, weight=weight,
                          max_weight=max_weight)
