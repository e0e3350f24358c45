"""The worker loop: consume -> decode -> batch -> infer -> produce -> commit.

The loop knows Kafka, offsets and transactions; what it serves (open_nsfw moderation,
image-and-text moderation, text-to-image generation) is a :class:`worker.tasks.protocol.ServedTask`
chosen by the config (worker.tasks.registry).

One step is schedule (release due batches) -> execute (submit, non-blocking) -> update (collect
finished batches, produce results, serve delivery callbacks, commit). The main thread never
waits on the engine, so it keeps polling and ``max.poll.interval.ms`` is never breached; when
too many jobs are held it pauses the assignment instead of blocking (backpressure).

Guarantees (``processing.guarantee``):

- at-least-once: a record counts as finished when its result (or DLQ record) is acknowledged by
  the broker; offset commits carry the lowest unfinished offset per partition
  (worker.loop.commit.offsets).
- exactly-once: outputs are released into one Kafka transaction in offset order per partition
  (worker.loop.commit.ordered), a record counts as finished once its output is in the transaction,
  and
  every commit interval the transaction commits together with those positions
  (worker.loop.commit.transactions). An aborted transaction rewinds every partition to its last
  committed
  position and drops the work in progress, so each output is committed exactly once.

Rebalances (cooperative-sticky): on revoke, queued jobs of the revoked partitions are dropped,
batches in flight finish, and their offsets are committed (at-least-once) or the transaction is
committed with them (exactly-once; if that fails it is aborted and the new owner redoes the
work). On lost, nothing is committed; under exactly-once the open transaction is aborted,
since it may hold outputs that the partitions' new owner produces again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import (
    ConfigError,
    DeliveryFailed,
    JobRejected,
    KafkaIOError,
    ProducerFenced,
    TransactionError,
)
from worker.kafka import (
    Consumer,
    Producer,
    is_fatal,
    member_consumer_settings,
    producer_settings,
    source_record,
    transactional_id,
    transactional_producer_settings,
)
from worker.loop.commit.offsets import OffsetTracker, TopicPartitionKey
from worker.loop.commit.ordered import OrderedRelease, Output
from worker.loop.commit.transactions import Transactions
from worker.loop.stats import Stats
from worker.tasks.protocol import Answer, ServedTask, record_value
from worker.wire.dlq import dead_letter
from worker.wire.records import SourceRecord, SourceRef

log = structlog.get_logger("worker")


# An async commit unanswered this long is presumed lost: the next interval sends another.
_ASYNC_COMMIT_STALE_S = 60.0
_PURGED = frozenset({ck.KafkaError._PURGE_QUEUE, ck.KafkaError._PURGE_INFLIGHT})


def _DEBUG_JOBS() -> bool:
    return logging.getLogger("worker").isEnabledFor(logging.DEBUG)


class Worker:
    def __init__(self, cfg: WorkerConfig, task: ServedTask | None = None) -> None:
        if not cfg.kafka.bootstrap_servers:
            raise ConfigError("kafka.bootstrap_servers is empty (set KAFKA_BOOTSTRAP_SERVERS)")
        self.cfg = cfg
        if task is None:
            from worker.tasks.registry import make_served_task

            task = make_served_task(cfg)
        self.task = task
        self.topics = task.topics
        task.on_batch_done = self._check_batch_time
        self.stats = Stats()
        self.exactly_once = cfg.processing.guarantee == "exactly-once"
        self._consumer = Consumer(member_consumer_settings(cfg))
        self._producer = Producer(
            transactional_producer_settings(cfg) if self.exactly_once else producer_settings(cfg)
        )
        self._txn: Transactions | None = (
            Transactions(self._producer, timeout_ms=cfg.kafka.transaction_timeout_ms)
            if self.exactly_once else None
        )
        self._tracker = OffsetTracker()
        self._release = OrderedRelease(self._tracker)
        self._assigned: set[TopicPartitionKey] = set()
        self._epochs: dict[TopicPartitionKey, int] = {}
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._abort_request: str | None = None
        self._rewind_needed = False
        self._paused = False
        self._last_commit = time.monotonic()
        self._commit_sent: float | None = None  # when the unanswered async commit was sent
        self.rewinds = 0
        self.stale_discarded = 0
        self.slow_batches = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from signal handlers and other threads)."""
        self._stop.set()

    def request_abort(self, reason: str = "requested") -> None:
        """Exactly-once fault drill: abort the open transaction at the next step and rewind.

        Safe from other threads; nothing is lost or repeated (the tests use it to prove that).
        No effect under at-least-once.
        """
        self._abort_request = reason

    def guarantee_totals(self) -> dict[str, int]:
        out = {"rewinds": self.rewinds, "stale_discarded": self.stale_discarded,
               "slow_batches": self.slow_batches}
        if self._txn is not None:
            out |= {"txn_commits": self._txn.commits, "txn_aborts": self._txn.aborts,
                    "txn_retries": self._txn.retries, "producer_resets": self._txn.resets}
        return out

    def run(self) -> None:
        self.task.warm_up()
        self._producer.open()
        if self._txn is not None:
            # Fences an earlier incarnation of this instance and aborts its open transaction,
            # so its uncommitted outputs never become visible and its offsets are released.
            self._txn.init()
        self._consumer.open(on_commit=self._committed)
        self._consumer.subscribe(
            [self.topics.jobs], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("worker_started", task=self.cfg.processing.task, topic=self.topics.jobs,
                 group=self.cfg.kafka.group_id, model=self.task.model_id,
                 engine=self.task.engine_hash, client_id=self.cfg.kafka.client_id,
                 guarantee=self.cfg.processing.guarantee,
                 transactional_id=transactional_id(self.cfg) if self.exactly_once else None)
        try:
            while not self._stop.is_set():
                self.step()
                if self._fatal is not None:
                    raise self._fatal
        except Exception as exc:
            # Whatever stopped the loop, the shutdown must not drain or commit past it.
            self._fatal = self._fatal or exc
            log.error("worker_failed", error=f"{type(exc).__name__}: {exc}"[:500],
                      fenced=isinstance(exc, ProducerFenced))
            raise
        finally:
            self._shutdown()

    def step(self) -> None:
        room = self.cfg.batch.high_watermark - self._tracker.pending()
        msgs = self._consumer.consume(
            num_messages=max(1, min(1000, room)), timeout=self.cfg.batch.poll_timeout_ms / 1e3
        )
        for msg in msgs:
            self._accept(msg)
        self._schedule(force=False)
        self._collect(block=False)
        self._producer.poll(0)
        self._settle()
        self._backpressure()
        self._maybe_commit(force=False)
        self._settle()
        self.stats.maybe_log(log, pending=self._tracker.pending(), paused=self._paused,
                             **self.guarantee_totals())

    def _shutdown(self) -> None:
        log.info("worker_draining", pending=self._tracker.pending(),
                 in_flight_batches=self.task.in_flight())
        fatal = self._fatal is not None
        try:
            if not fatal:
                while self.task.held():
                    self._schedule(force=True)
                    self._collect(block=True)
            if self._txn is None:
                undelivered = self._producer.flush(self.cfg.commit.drain_timeout_s)
                if undelivered:
                    log.error("undelivered_at_shutdown", count=undelivered)
                # Only delivered records count as finished: committing them is safe even
                # after a failure.
                self._maybe_commit(force=True)
            elif not fatal:
                # Commits the last transaction (or aborts a failed one: its work is redone by
                # the partitions' next owner).
                self._maybe_commit(force=True)
        except Exception as exc:
            self._fatal = self._fatal or exc
            log.error("shutdown_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            try:
                self._consumer.close()
                if self._fatal is not None and self._txn is not None:
                    # Nothing of a failed transactional producer may be delivered any more
                    # (and flushing a fenced one fails inside its delivery callbacks).
                    self._producer.abandon()
                else:
                    self._producer.close(self.cfg.commit.drain_timeout_s)
            finally:
                self.task.close()
                log.info("worker_stopped", **self.stats.totals(), **self.guarantee_totals())

    # -- intake ------------------------------------------------------------------------------
    def _accept(self, msg: ck.Message) -> None:
        err = msg.error()
        if err is not None:
            if is_fatal(err):
                # The consumer is unusable (e.g. fenced by another static member with this
                # instance id): stop, so the process is restarted, instead of idling forever.
                raise KafkaIOError(f"fatal consumer error: {err.str()}")
            log.warning("consumer_error", error=err.str(), code=err.code())
            return
        topic, partition, offset = _coordinates(msg)
        key = (topic, partition)
        if key not in self._assigned:
            # Fetched before a revoke or loss served in the same consume() call: its new
            # owner reads it.
            return
        if self._tracker.begin(topic, partition, offset) and self._txn is not None:
            # The consumer went backwards on its own (not after our seek): outputs of these
            # offsets may already be in the open transaction. Abort and rewind.
            self.request_abort(f"{topic}[{partition}] re-delivered offset {offset}")
        self.stats.consumed += 1
        record = source_record(msg, topic, partition, offset)
        try:
            record_value(record, self.cfg.limits.max_message_bytes)
            self.task.admit(record, self._epochs.get(key, 0), time.monotonic())
        except JobRejected as exc:
            self._dead_letter(record, exc)

    # -- schedule / execute / update -------------------------------------------------------
    def _schedule(self, *, force: bool) -> None:
        free = self.cfg.batch.max_in_flight_batches - self.task.in_flight()
        if free <= 0 and not force:
            return
        for answer in self.task.step(time.monotonic(), int(time.time() * 1e3), free=free,
                                     force=force):
            self._answer(answer)

    def _collect(self, *, block: bool) -> None:
        # An exception here is a bug in the task, not a bad job: let it stop the worker without
        # committing those offsets.
        for answer in self.task.collect(block=block):
            self._answer(answer)

    def _check_batch_time(self, took_ms: float, size: int) -> None:
        if took_ms > self.cfg.processing.max_batch_ms:
            self.slow_batches += 1
            log.error("batch_over_budget", took_ms=round(took_ms), size=size,
                      max_batch_ms=self.cfg.processing.max_batch_ms,
                      transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)

    def _answer(self, a: Answer) -> None:
        if self._epochs.get((a.ref.topic, a.ref.partition), 0) != a.epoch:
            # Its partition was revoked, lost or rewound since intake: the new owner (or the
            # replay after the rewind) answers it.
            self.stale_discarded += 1
            return
        if a.rejection is not None:
            self._dead_letter(a.record, a.rejection)
            return
        if a.expired:
            self.stats.expired += 1
            log.info("job_expired", job_id=a.job_id, topic=a.ref.topic,
                     partition=a.ref.partition, offset=a.ref.offset)
        elif _DEBUG_JOBS():  # a filtered structlog call still costs ~10 us per job
            log.debug("job_result", job_id=a.job_id, topic=a.ref.topic,
                      partition=a.ref.partition, offset=a.ref.offset, status=a.status)
        assert a.value is not None
        self._emit(Output(a.ref, self.topics.results, a.key, a.value, a.headers or [],
                          "result"))
        self.stats.results += 1

    # -- output ------------------------------------------------------------------------------

    def _dead_letter(self, src: SourceRecord, error: JobRejected) -> None:
        record = dead_letter(src, error, self.cfg.kafka.client_id)
        ref = SourceRef(src.topic, src.partition, src.offset)
        log.warning("job_dead_lettered",
                    key=src.key.decode("utf-8", "replace") if src.key else None,
                    topic=ref.topic, partition=ref.partition, offset=ref.offset,
                    reason=error.reason, error=str(error)[:300])
        self._emit(Output(ref, self.topics.dlq, record.key, record.value, record.headers,
                          "dlq"))
        self.stats.dead_lettered += 1

    def _emit(self, out: Output) -> None:
        if self._txn is None:
            self._producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                                   on_delivery=partial(self._delivered, out.ref))
            return
        for ready in self._release.complete(out):
            if self._txn.failed is not None:
                return  # doomed: the rewind that follows redoes these records
            try:
                self._txn.produce(ready, partial(self._txn_delivered, self._txn.sequence))
            except TransactionError as exc:
                if exc.fatal:
                    raise
                return  # abortable: marked failed; _settle aborts and rewinds

    def _delivered(self, ref: SourceRef, err: ck.KafkaError | None, _msg: ck.Message) -> None:
        if err is not None:
            # librdkafka already retried for message.timeout.ms; never commit past this record.
            self._fatal = DeliveryFailed(
                f"delivery for {ref.topic}[{ref.partition}]@{ref.offset} failed: {err.str()}",
            )
            return
        self._tracker.finish(ref.topic, ref.partition, ref.offset)

    def _txn_delivered(self, sequence: int, err: ck.KafkaError | None, _msg: ck.Message) -> None:
        txn = self._txn
        if err is None or txn is None or sequence != txn.sequence or err.code() in _PURGED:
            return  # fine, or a purged record of a transaction being (or already) aborted
        log.warning("transactional_delivery_failed", error=err.str())
        txn.fail(f"delivery failed: {err.str()}",
                 timed_out=err.code() == ck.KafkaError._MSG_TIMED_OUT)

    # -- transactions (exactly-once) --------------------------------------------------------
    def _settle(self) -> None:
        """Abort a failed or abort-requested transaction, then rewind (main loop only)."""
        if self._txn is None:
            return
        reason = self._abort_request or self._txn.failed
        if reason is not None:
            self._abort_request = None
            self._abort(reason)
        if self._rewind_needed:
            self._rewind()

    def _abort(self, reason: str) -> None:
        """Abort the open transaction now; the rewind follows in the main loop (never inside a
        rebalance callback: consume() may already hold records fetched before the seek)."""
        assert self._txn is not None
        if not self._txn.open and self._txn.failed is None:
            return  # nothing produced since the last commit: nothing to undo
        log.warning("transaction_abort", reason=reason[:300], records=self._txn.records,
                    age_s=round(self._txn.age_s, 3))
        self._txn.abort()
        self._rewind_needed = True

    def _rewind(self) -> None:
        """Seek every partition back to its last committed position; drop work in progress."""
        self._rewind_needed = False
        self.task.remove(set(self._tracker.partitions()) | self._assigned)
        self._release.clear()
        positions: dict[str, int] = {}
        for key in self._tracker.partitions():
            target = self._tracker.rewind(key)
            self._bump(key)
            if target is not None and key in self._assigned:
                # A failed seek would let the consumer run on past the aborted range: fatal
                # (the restart resumes from the committed positions).
                self._consumer.seek(ck.TopicPartition(key[0], key[1], target))
                positions[f"{key[0]}[{key[1]}]"] = target
        self.rewinds += 1
        log.warning("rewound", positions=positions)

    def _bump(self, key: TopicPartitionKey) -> None:
        self._epochs[key] = self._epochs.get(key, 0) + 1

    def _commit_transaction(self) -> None:
        txn = self._txn
        assert txn is not None
        reason = self._abort_request or txn.failed
        if reason is not None:
            self._abort_request = None
            self._abort(reason)
            return
        if not txn.open:
            return
        positions = self._tracker.committable()
        offsets = [ck.TopicPartition(t, p, o) for (t, p), o in positions.items()]
        if txn.age_s * 1e3 > self.cfg.kafka.transaction_timeout_ms / 2:
            log.warning("transaction_long", age_s=round(txn.age_s, 1),
                        transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)
        records = txn.records
        try:
            txn.commit(offsets, self._consumer.group_metadata())
        except TransactionError as exc:
            if exc.fatal:
                raise
            self._abort(f"commit failed: {exc}")
            return
        self._tracker.mark_committed(positions)
        log.debug("transaction_committed", records=records,
                  offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})

    # -- offsets, backpressure, rebalance ---------------------------------------------------
    def _maybe_commit(self, *, force: bool, only: Iterable[TopicPartitionKey] | None = None
                      ) -> None:
        now = time.monotonic()
        if not force and (now - self._last_commit) * 1e3 < self.cfg.commit.interval_ms:
            return
        self._last_commit = now
        if self._txn is not None:
            # One transaction covers every partition: ``only`` cannot narrow it.
            self._commit_transaction()
            return
        if not force and self._commit_sent is not None \
                and now - self._commit_sent < _ASYNC_COMMIT_STALE_S:
            return  # the previous commit is still unanswered: don't queue more behind it
        positions = self._tracker.committable(only)
        if not positions:
            return
        offsets = [ck.TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            # The steady loop commits asynchronously: a synchronous commit blocks the loop
            # (and every batch behind it) until the coordinator answers, up to a minute while
            # the broker stalls. Revoke and shutdown commit synchronously: the positions must
            # be stored before the partitions move on.
            if not force:
                self._consumer.commit_async(offsets)
                self._commit_sent = now  # _committed marks them once accepted
                return
            self._consumer.commit(offsets)
        except KafkaIOError as exc:
            # Usually a rebalance in progress; the same positions are retried next interval.
            log.warning("commit_failed", error=str(exc), recoverable=exc.recoverable)
            return
        self._tracker.mark_committed(positions)
        log.debug("committed", offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})

    def _committed(self, err: ck.KafkaError | None, partitions: list[ck.TopicPartition]
                   ) -> None:
        """librdkafka's commit report (served from consume()): marks accepted positions, so
        the tracker only offers positions that moved on since (a failure is retried)."""
        self._commit_sent = None
        if err is not None:
            log.warning("commit_failed", error=err.str(), recoverable=err.retriable())
            return
        accepted = {(tp.topic, tp.partition): tp.offset for tp in partitions
                    if tp.error is None and tp.offset >= 0}
        self._tracker.mark_committed(accepted)
        if len(accepted) < len(partitions):
            log.warning("commit_failed", partitions=[f"{tp.topic}[{tp.partition}]: {tp.error}"
                                                     for tp in partitions if tp.error])
        log.debug("committed", offsets={f"{t}[{p}]": o for (t, p), o in accepted.items()})

    def _backpressure(self) -> None:
        held = self._tracker.pending()
        if not self._paused and held >= self.cfg.batch.high_watermark:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
            self.stats.pauses += 1
            log.info("backpressure_pause", held=held)
        elif self._paused and held <= self.cfg.batch.low_watermark:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False
            log.info("backpressure_resume", held=held)

    def _forget(self, keys: set[TopicPartitionKey]) -> None:
        self._tracker.drop(keys)
        self._release.drop(keys)
        for key in keys:
            self._bump(key)

    def _callback_failed(self, where: str, exc: BaseException) -> None:
        # Never let an exception escape into librdkafka: stop the loop with it instead.
        if isinstance(exc, TransactionError) and not exc.fatal:
            log.warning(f"{where}_failed", error=str(exc))
            return
        if isinstance(exc, KafkaIOError) and not isinstance(exc, TransactionError):
            log.warning(f"{where}_failed", error=str(exc))
            return
        log.error(f"{where}_failed", error=str(exc), fatal=True)
        if self._fatal is None:
            self._fatal = exc

    def _on_assign(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        self._assigned |= {(tp.topic, tp.partition) for tp in partitions}
        try:
            log.info("partitions_assigned", partitions=_names(partitions))
        finally:
            if self._paused and partitions:
                consumer.pause(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self._assigned -= keys
        log.info("partitions_revoked", partitions=_names(partitions))
        try:
            if self._fatal is None:
                # Queued jobs of revoked partitions are dropped uncommitted (the new owner
                # redoes them); batches already computing are finished and their outputs
                # produced, then committed: their offsets (at-least-once) or the whole
                # transaction with every partition's position (exactly-once).
                self.task.remove(keys)
                self._collect(block=True)
                if self._txn is None:
                    self._producer.flush(self.cfg.commit.drain_timeout_s)
                self._maybe_commit(force=True, only=keys)
        except Exception as exc:  # noqa: BLE001 - see _callback_failed
            self._callback_failed("revoke_commit", exc)
        finally:
            self._forget(keys)

    def _on_lost(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self._assigned -= keys
        log.warning("partitions_lost", partitions=_names(partitions))
        try:
            self.task.remove(keys)
            if self._txn is not None and self._fatal is None and self._txn.open:
                # Another member may own them already and redo their jobs: the open transaction
                # (which may hold their outputs) must never commit.
                self._abort("partitions lost")
        except Exception as exc:  # noqa: BLE001 - see _callback_failed
            self._callback_failed("lost_abort", exc)
        finally:
            # Never commit here; late outcomes of these partitions are discarded.
            self._forget(keys)


def _coordinates(msg: ck.Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise KafkaIOError("consumed record without topic/partition/offset")
    return topic, partition, offset


def _names(partitions: list[ck.TopicPartition]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions]
