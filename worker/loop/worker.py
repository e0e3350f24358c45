"""The worker loop: intake -> collect -> schedule -> emit -> commit, one step at a time.

Each step consumes what is there (:mod:`worker.loop.intake`), lets the task admit it, hand back
finished batches and submit due ones without blocking (:mod:`worker.tasks.protocol`), turns
answers into outputs (:mod:`worker.loop.output`) and gives them to the committer, which owns
offsets, production and commits for the process's delivery guarantee
(:mod:`worker.loop.commit`). The loop never asks which guarantee it runs. When too many records
are held it stops taking more (:mod:`worker.loop.backpressure`). A step waits on the engine (until
a batch finishes) only when it wants no records: held back, or every batch slot busy; otherwise,
with work pending, it blocks at most a millisecond in consume(), so finished batches are
collected and freed slots refilled as they come.

Rebalances (cooperative-sticky): on revoke, queued jobs of the revoked partitions are dropped,
batches in flight finish and their outputs are made durable by the committer; on lost, the
task's queued work is dropped and the committer makes sure nothing of theirs is committed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import (
    ConfigError,
    KafkaIOError,
    ProducerFenced,
    TopicNotAuthorized,
    TransactionError,
    UnknownTopic,
    one_line,
)
from worker.kafka import Consumer, member_consumer_settings
from worker.kafka.clients import common_settings
from worker.kafka.topics import check_topics
from worker.loop.assignment import Assignment
from worker.loop.backpressure import Backpressure
from worker.loop.commit.base import make_committer
from worker.loop.heap import HeapPolicy
from worker.loop.hold import PartitionHold
from worker.loop.hops import HopTimes
from worker.loop.intake import Intake
from worker.loop.orphans import OrphanWatch
from worker.loop.output import CloudEvents, OutputBuilder
from worker.loop.poison import PoisonGuard
from worker.loop.rejoin import ClusterProbe, Rejoin
from worker.loop.stats import Stats
from worker.observe.spans import make_spans
from worker.observe.vitals import Vitals, process_age_s
from worker.tasks.protocol import Answer, ConsumedBatch, Task
from worker.wire.records import SourceRecord, TopicPartitionKey

log = structlog.get_logger("worker")
# The longest a step blocks waiting for records while the task holds jobs (see _consume_timeout).
WORK_TICK_S = 0.001
# How often the partition hold (worker/loop/hold.py) looks at the uncommitted spans.
HOLD_CHECK_S = 0.05
# The longest wait between two start-up checks of a topic that is missing or refused.
TOPICS_RETRY_MAX_S = 30.0
# A step that takes no record (the crash-loop breaker's isolated record is in flight).
_NOTHING = ConsumedBatch([], {}, 0.0)


class Worker:
    def __init__(self, cfg: WorkerConfig, task: Task | None = None) -> None:
        if not cfg.kafka.bootstrap_servers:
            raise ConfigError("kafka.bootstrap_servers is empty (set KAFKA_BOOTSTRAP_SERVERS)")
        t0 = time.monotonic()
        if task is None:
            from worker.tasks.registry import make_task

            task = make_task(cfg)
        built_s = time.monotonic() - t0
        self.cfg, self.task, self.topics = cfg, task, task.topics
        task.on_batch_done = self._batch_done
        self.stats = Stats()
        self.vitals = Vitals()  # heartbeat, warm-up, rebalances, batches, lag (worker.observe)
        self.vitals.startup["task_built_s"] = round(built_s, 2)
        self.heap = HeapPolicy(cfg.gc)  # the collector once warm (freeze, young threshold)
        self.spans = make_spans(cfg)  # None unless tracing.otlp_endpoint is set
        self.assignment = Assignment()
        # A lost consumer that stays lost once the cluster answers is replaced (loop/rejoin.py).
        self._rejoin = Rejoin(ClusterProbe(common_settings(cfg.kafka)))
        self.hops = HopTimes()
        self._consumer = Consumer(member_consumer_settings(cfg, on_stats=self.vitals.on_stats))
        # Static members only: partitions left to nobody by a member killed mid-rebalance
        # (loop/orphans.py).
        # A revoke callback finishes the batches in flight, then flushes and commits
        # (each bounded by drain_timeout_s): the orphan watch waits that out too.
        revoke_bound_s = (2 * cfg.commit.drain_timeout_s + cfg.batch.max_in_flight_batches
                          * cfg.processing.max_batch_ms / 1e3)
        self._orphans = (OrphanWatch(common_settings(cfg.kafka), cfg.kafka.group_id,
                                     self.topics.jobs, cfg.kafka.session_timeout_ms,
                                     revoke_bound_s)
                         if cfg.kafka.static_membership else None)
        self._outputs = OutputBuilder(
            self.topics, cfg.kafka.client_id, self.stats,
            dlq_inline_max_bytes=cfg.limits.dlq_inline_max_bytes,
            cloudevents=(CloudEvents(cfg.processing.task, cfg.kafka.group_id)
                         if cfg.kafka.cloudevents else None))
        self.committer = make_committer(cfg, self._consumer, self.assignment, task.remove,
                                        self.hops, self._outputs)
        self.committer.on_committed = self.vitals.note_committed  # (exactly-once: the lag)
        self._intake = Intake(self._consumer, self.assignment, self.committer, self.stats)
        # A record that kills the process is dead-lettered after so many deaths (poison.py).
        self._poison = (PoisonGuard(cfg.processing.poison_max_attempts,
                                    cfg.batch.max_batch_size * cfg.batch.max_in_flight_batches,
                                    self._consumer, self.committer, self._outputs)
                        if cfg.processing.poison_max_attempts else None)
        # TEST HOOK, set only by tests (tests/integration/faults/test_poison.py): the process
        # kills itself (SIGKILL, as a cgroup OOM kill does) when it takes a job with this key.
        self._kill_on_key = (os.environ.get("KTW_TEST_KILL_ON_KEY") or "").encode() or None
        self.backpressure = Backpressure(cfg.batch, self.stats)
        self.hold = PartitionHold(self._consumer.pause, self._consumer.resume,
                                  max_uncommitted=cfg.batch.max_uncommitted_per_partition)
        self._hold_checked = 0.0
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self.slow_batches = 0
        self._poll_s = cfg.batch.poll_timeout_ms / 1e3

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from signal handlers and other threads)."""
        self.vitals.stopping = True
        self._stop.set()

    def request_abort(self, reason: str = "requested") -> None:
        """Exactly-once fault drill: abort the open transaction at the next step and rewind
        (nothing is lost or repeated; the tests prove it). No effect under at-least-once."""
        self.committer.request_abort(reason)

    def guarantee_totals(self) -> dict[str, int]:
        return {"stale_discarded": self.assignment.stale_discarded,
                "slow_batches": self.slow_batches, "consumer_reopens": self._rejoin.reopens,
                "orphan_rejoins": self._orphans.rejoins if self._orphans is not None else 0,
                "partition_holds": self.hold.holds,
                "poison_isolations": self._poison.isolated if self._poison is not None else 0,
                **self.committer.totals()}

    def run(self) -> None:
        self._wait_for_topics()
        if self._stop.is_set():  # stopped while waiting: no client was opened yet
            self.task.close()
            log.info("worker_stopped", waited_for_topics=True)
            return
        startup, t = self.vitals.startup, time.monotonic()
        # The clients open while the task warms up, in a thread (their waits hold no GIL): a
        # new idempotent producer's first send waits about 0.5 s for its producer id
        # (librdkafka, measured on the 2-core VM), and exactly-once's init_transactions waits
        # for the coordinator. The group is joined only once warm: no partition waits on a
        # cold worker.
        with ThreadPoolExecutor(1, thread_name_prefix="clients-open") as pool:
            opened = pool.submit(self._open_clients)
            try:
                self.task.warm_up()
            except BaseException:
                self._close_unused_clients(opened)
                raise
        startup["warm_up_s"] = round(time.monotonic() - t, 2)
        if opened.exception() is not None:  # raised here, after the clients are closed
            self._close_unused_clients(opened)
        startup["clients_s"] = opened.result()
        self.vitals.warm = True
        self._consumer.subscribe([self.topics.jobs], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        if self._orphans is not None:
            self._orphans.start()
        startup["gc_settle_s"] = round(self.heap.settle(), 2)  # released in _shutdown
        startup["since_process_start_s"] = process_age_s()
        self.vitals.subscribed = True
        log.info("worker_started", task=self.cfg.processing.task, topic=self.topics.jobs,
                 group=self.cfg.kafka.group_id, model=self.task.model_id,
                 engine=self.task.engine_hash, client_id=self.cfg.kafka.client_id,
                 guarantee=self.cfg.processing.guarantee,
                 transactional_id=self.committer.transactional_id, startup_s=startup)
        try:
            while not self._stop.is_set():
                self.step()
                self._raise_fatal()
        except Exception as exc:
            # Whatever stopped the loop, the shutdown must not drain or commit past it.
            self._fatal = self._fatal or exc
            log.error("worker_failed", error=f"{type(exc).__name__}: {exc}"[:500],
                      fenced=isinstance(exc, ProducerFenced))
            raise
        finally:
            self._shutdown()

    def _wait_for_topics(self) -> None:
        """The start-up check of the topics, waited out while one is missing or refused
        (``kafka.topics_wait_s``): readiness off with the reason, liveness kept."""
        wait_for = self.cfg.kafka.topics_wait_s
        t0 = time.monotonic()
        attempt = 0
        while True:
            self.vitals.beat = time.monotonic()
            try:
                check_topics(self.cfg, self.topics.jobs, self.topics.results, self.topics.dlq)
            except (UnknownTopic, TopicNotAuthorized) as exc:
                waited = time.monotonic() - t0
                if wait_for is not None and waited >= wait_for:
                    raise
                attempt += 1
                retry_s = min(TOPICS_RETRY_MAX_S, 2.0 ** (attempt - 1))
                if wait_for is not None:
                    retry_s = max(0.0, min(retry_s, wait_for - waited))
                self.vitals.waiting = f"start-up waits: {one_line(exc, 250)}"
                log.error("topics_unavailable", error=one_line(exc, 500), attempt=attempt,
                          waited_s=round(waited, 1), retry_in_s=retry_s,
                          give_up_after_s=wait_for)
                if self._stop.wait(retry_s):
                    return
                continue
            self.vitals.waiting = None
            return

    def _open_clients(self) -> float:
        t = time.monotonic()
        self.committer.start()
        self._consumer.open(on_commit=self.committer.on_commit)
        return round(time.monotonic() - t, 2)

    def _close_unused_clients(self, opened: Future[float]) -> None:
        """A warm-up failed: once the opening thread has ended, close whatever it opened,
        quietly, so that the warm-up's error is the one reported."""
        wait([opened])
        with contextlib.suppress(Exception):
            self._consumer.close(timeout_s=1.0)
        with contextlib.suppress(Exception):
            self.committer.close(failed=True)

    def step(self) -> None:
        self.vitals.beat = now = time.monotonic()
        if self._rejoin.due(now, self.vitals.coordinator_up, self.vitals.stats_at):
            log.warning("consumer_reopened", reopens=self._rejoin.reopens,
                        reason="partitions lost, not assigned again, the cluster answers")
            self._consumer.reopen()
        if self._orphans is not None and self._orphans.due(now):
            log.warning("partitions_orphaned", partitions=sorted(self._orphans.orphans),
                        topic=self.topics.jobs, action="rejoin",
                        reason="no member of the group holds them")
            try:
                self._consumer.resubscribe()
            except KafkaIOError as exc:  # the next finding tries again; the loop goes on
                log.warning("orphan_rejoin_failed", error=str(exc)[:300])
        if self.backpressure.consume_now(now):
            # Held back (backpressure), consume() runs only to serve librdkafka's callbacks:
            # it takes at most one record.
            pending = self.committer.pending()
            room = 1 if self.backpressure.paused else self.cfg.batch.high_watermark - pending
            guard = self._poison if self._poison is not None and self._poison.active else None
            take = True
            if guard is not None:  # isolating a partition: one record at a time, alone
                take, room = guard.steer(pending), 1
                if not guard.active:  # (isolation over: the next step is a normal one)
                    guard = None
            timeout = self._consume_timeout(pending)
            # Idle (nothing pending): the wait is the whole poll timeout, so a job is taken
            # when it arrives, not when the timeout ends.
            batch = (self._intake.consume(room, timeout, prompt=pending == 0) if take
                     else _NOTHING)
            if guard is not None:
                batch = guard.screen(batch)
            if batch.records:
                if self._kill_on_key is not None:
                    _kill_on(batch.records, self._kill_on_key)
                rejected = self.task.admit(batch)
                self.hops.add("intake", time.monotonic() - batch.consumed_at)
                self._emit(rejected)
            elif timeout == 0.0 or not take:  # what matters next is a batch finishing
                self._idle()
        else:
            self._idle()
        # Finished batches first: the slots they free are refilled in this same step.
        self._emit(self.task.collect(block=False))
        # An isolated record (poison.py) runs at once: no batch fills up behind it.
        self._schedule(force=self._poison is not None and self._poison.active)
        pending, held_bytes = self.committer.pending(), self.committer.held_bytes()
        self.backpressure.update(pending, held_bytes)
        self.committer.tick()
        if now - self._hold_checked >= HOLD_CHECK_S:
            self._hold_checked = now
            self.hold.update(self.committer.uncommitted(), self.assignment.owned,
                             overfull=self.backpressure.overfull(pending, held_bytes))
        if self.stats.due():  # (the totals are built only when the line is written)
            self.stats.log_line(log, pending=self.committer.pending(),
                                paused=self.backpressure.paused, **self.guarantee_totals())

    def _consume_timeout(self, pending: int) -> float:
        """How long consume() may block: poll_timeout_ms while nothing consumed is unfinished;
        0 while every batch slot is busy (the step then waits on the engine instead: _idle);
        otherwise (jobs queued, results awaiting their acknowledgement) at most WORK_TICK_S,
        so the step comes back to launch due batches and take delivery reports. Blocking the
        whole poll timeout with work pending held the shipped settings to 256 jobs/s with a
        2 ms engine (bench/kafka/loop_gaps.py); a 1 ms tick while a CPU engine filled every slot
        cost it ~6% (bench/cpu_e2e.py)."""
        if pending == 0:
            return self._poll_s
        if self.task.in_flight() >= self.cfg.batch.max_in_flight_batches:
            return 0.0
        return min(self._poll_s, WORK_TICK_S)

    def _idle(self) -> None:
        """A step's wait when no records are wanted (held back, or every slot busy): until a
        batch in flight finishes, at most the poll timeout (the step then collects it and takes
        delivery reports), or, with none in flight, WORK_TICK_S for the acknowledgements."""
        if self.task.in_flight():
            self.task.wait(self._poll_s)
        else:
            time.sleep(WORK_TICK_S)

    @property
    def fatal_error(self) -> BaseException | None:
        return self._fatal or self.committer.fatal

    def _raise_fatal(self) -> None:
        if self.fatal_error is not None:
            raise self.fatal_error

    def _shutdown(self) -> None:
        if self._orphans is not None:
            self._orphans.stop()
        log.info("worker_draining", pending=self.committer.pending(),
                 in_flight_batches=self.task.in_flight())
        self._fatal = self._fatal or self.committer.fatal
        failed = self._fatal is not None
        try:
            while not failed and self.task.held():
                self._schedule(force=True)
                self._emit(self.task.collect(block=True))
            self.committer.drain(failed=failed)
        except Exception as exc:
            self._fatal = self._fatal or exc
            log.error("shutdown_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            try:
                self._close_consumer()
                self.committer.close(failed=self._fatal is not None)
            finally:
                try:
                    self.task.close()
                finally:
                    self.heap.release()
                if self.spans is not None:
                    self.spans.close()
                log.info("worker_stopped", **self.stats.totals(), **self.guarantee_totals())

    def _close_consumer(self) -> None:
        try:
            self._consumer.close(timeout_s=10.0)
        except KafkaIOError as exc:
            # The group leave failed (a coordinator lost in a broker stall): what was drained
            # is committed or repeated by the next owner; the group evicts this member by its
            # session timeout. Not worth a non-zero exit and a restart.
            log.error("consumer_close_failed", error=str(exc)[:500])

    # -- schedule / emit -------------------------------------------------------------------
    def _schedule(self, *, force: bool) -> None:
        free = self.cfg.batch.max_in_flight_batches - self.task.in_flight()
        if free > 0 or force:
            self._emit(self.task.schedule(time.monotonic(), int(time.time() * 1e3), free=free,
                                          force=force))

    def _emit(self, answers: list[Answer]) -> None:
        if not answers:
            return
        # Stale: its partition was revoked, lost or rewound since intake; the new owner (or
        # the replay after the rewind) answers it.
        current = self.assignment.is_current
        fresh = [a for a in answers if current((a.ref.topic, a.ref.partition), a.epoch)]
        self.hops.answered(fresh)
        if self.spans is not None:
            self.spans.jobs(fresh)
        self.committer.emit(self._outputs.of_answers(fresh))

    def _batch_done(self, took_ms: float, size: int, profile: str, capacity: int) -> None:
        self.vitals.batch_done(took_ms / 1e3, size, profile, capacity)
        if self.spans is not None:
            self.spans.batch(took_ms / 1e3, size, profile)
        if took_ms > self.cfg.processing.max_batch_ms:
            self.slow_batches += 1
            log.error("batch_over_budget", took_ms=round(took_ms), size=size,
                      max_batch_ms=self.cfg.processing.max_batch_ms,
                      transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)

    # -- rebalance (librdkafka calls these from consume()) ----------------------------------
    def _on_assign(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        self.assignment.owned |= _keys(partitions)
        self._rebalanced("assigned", partitions)
        if self._poison is not None:  # (assigns them itself, once their marks are written)
            self._poison.assigned(partitions)
        self._rejoin.assigned()
        if self._orphans is not None:  # (read here, on the loop thread: see loop/orphans.py)
            self._orphans.note_member(self._consumer.member_id())
        log.info("partitions_assigned", partitions=_names(partitions))

    def _on_revoke(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = _keys(partitions)
        self.assignment.owned -= keys
        self._rebalanced("revoked", partitions)
        log.info("partitions_revoked", partitions=_names(partitions))
        try:
            if self._fatal is None:
                # Queued jobs are dropped uncommitted (the new owner redoes them); batches
                # already computing finish, and the committer makes their outputs durable.
                self.task.remove(keys)
                self._emit(self.task.collect(block=True))
                self.committer.revoked(keys)
        except Exception as exc:  # noqa: BLE001 - never let an exception into librdkafka
            self._callback_failed("revoke_commit", exc)
        finally:
            self._forget(keys)

    def _on_lost(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = _keys(partitions)
        self.assignment.owned -= keys
        self._rebalanced("lost", partitions)
        self._rejoin.lost()
        log.warning("partitions_lost", partitions=_names(partitions))
        try:
            self.task.remove(keys)
            if self._fatal is None:
                self.committer.lost(keys)
        except Exception as exc:  # noqa: BLE001 - never let an exception into librdkafka
            self._callback_failed("lost_abort", exc)
        finally:
            self._forget(keys)  # never committed; late outcomes of theirs are discarded

    def _rebalanced(self, kind: str, partitions: list[ck.TopicPartition]) -> None:
        self.vitals.rebalanced(kind, len(partitions))
        if self._orphans is not None:  # what the watch saw before this proves nothing
            self._orphans.forget()

    def _forget(self, keys: set[TopicPartitionKey]) -> None:
        self.committer.forget(keys)
        self.hold.forget(keys)
        self.vitals.forget(keys)
        self.assignment.bump(keys)
        if self._poison is not None:
            self._poison.forget(keys)

    def _callback_failed(self, where: str, exc: BaseException) -> None:
        # Recoverable Kafka errors are logged; anything else stops the loop with it.
        if (isinstance(exc, TransactionError) and not exc.fatal) or \
                (isinstance(exc, KafkaIOError) and not isinstance(exc, TransactionError)):
            log.warning(f"{where}_failed", error=str(exc))
            return
        log.error(f"{where}_failed", error=str(exc), fatal=True)
        self._fatal = self._fatal or exc


def _keys(partitions: list[ck.TopicPartition]) -> set[TopicPartitionKey]:
    return {(tp.topic, tp.partition) for tp in partitions}


def _names(partitions: list[ck.TopicPartition]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions]


def _kill_on(records: Sequence[SourceRecord], key: bytes) -> None:
    """The test hook's check (only while KTW_TEST_KILL_ON_KEY is set)."""
    if any(r.key == key for r in records):
        os.kill(os.getpid(), signal.SIGKILL)
