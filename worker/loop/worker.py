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

The loop builds nothing: its parts (consumer, committer, intake, outputs, membership, start-up,
observers) come wired from :mod:`worker.loop.build`, so ``step()`` is unit-tested with fakes.
Static membership lives in :mod:`worker.loop.group.membership`, tracing behind the job observer.

Rebalances (cooperative-sticky): on revoke, queued jobs of the revoked partitions are dropped,
batches in flight finish and their outputs are made durable by the committer; on lost, the
task's queued work is dropped and the committer makes sure nothing of theirs is committed.
"""

from __future__ import annotations

import threading
import time

import structlog

from worker.config import WorkerConfig
from worker.exceptions import ProducerFenced, StaticMemberFenced
from worker.loop.build import LoopParts
from worker.loop.group.rebalance import Rebalance
from worker.observe.vitals import process_age_s
from worker.tasks.protocol import Answer, ConsumedBatch, Task

log = structlog.get_logger("worker")
# The longest a step blocks waiting for records while the task holds jobs (see _consume_timeout).
WORK_TICK_S = 0.001
# How often the partition hold (worker/loop/hold.py) looks at the uncommitted spans.
HOLD_CHECK_S = 0.05
# A step that takes no record (the crash-loop breaker's isolated record is in flight).
_NOTHING = ConsumedBatch([], {}, 0.0)


class Worker:
    """The loop over its parts (:class:`worker.loop.build.LoopParts`, wired by
    :func:`worker.loop.build.build_worker`)."""

    def __init__(self, cfg: WorkerConfig, task: Task, parts: LoopParts) -> None:
        self.cfg, self.task, self.topics, self.parts = cfg, task, task.topics, parts
        task.on_batch_done = self._batch_done
        self.committer, self.intake, self.hold = parts.committer, parts.intake, parts.hold
        self.backpressure, self.assignment = parts.backpressure, parts.assignment
        self.stats, self.vitals, self.heap, self.hops = (parts.stats, parts.vitals,
                                                          parts.heap, parts.hops)
        self._poison, self._observer = parts.poison, parts.observer
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self.slow_batches = 0
        self._poll_s = cfg.batch.poll_timeout_ms / 1e3
        self._hold_checked = 0.0
        self._rebalance = Rebalance(task, parts, self._emit,
                                    failed=lambda: self.fatal_error is not None)

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from signal handlers and other threads)."""
        self.vitals.stopping = True
        self._stop.set()

    def guarantee_totals(self) -> dict[str, int]:
        return {"stale_discarded": self.assignment.stale_discarded,
                "slow_batches": self.slow_batches, **self.parts.membership.totals(),
                "partition_holds": self.hold.holds,
                "poison_isolations": self._poison.isolated if self._poison is not None else 0,
                **self.committer.totals()}

    def run(self) -> None:
        if not self.parts.startup.wait_for_topics(self._stop):  # stopped: no client opened
            self.task.close()
            log.info("worker_stopped", waited_for_topics=True)
            return
        if not self.parts.startup.open_while_warming(self._stop):  # stopped: clients closed
            self.task.close()
            log.info("worker_stopped", waited_for_transactional_id=True)
            return
        self.vitals.warm = True
        rb = self._rebalance
        self.parts.consumer.subscribe([self.topics.jobs], on_assign=rb.on_assign,
                                      on_revoke=rb.on_revoke, on_lost=rb.on_lost)
        self.parts.membership.start()
        startup = self.vitals.startup
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
                if self.fatal_error is not None:
                    raise self.fatal_error
        except Exception as exc:
            # Whatever stopped the loop, the shutdown must not drain or commit past it.
            self._fatal = self._fatal or exc
            log.error("worker_failed", error=f"{type(exc).__name__}: {exc}"[:500],
                      fenced=isinstance(exc, ProducerFenced))
            raise
        finally:
            self._shutdown()

    def step(self) -> None:
        self.vitals.beat = now = time.monotonic()
        self.parts.membership.step(now, self.vitals)
        if self.backpressure.consume_now(now):
            pending = self.committer.pending()
            timeout = self._consume_timeout(pending)
            try:
                batch, wants_engine = self._take(pending, timeout)
            except StaticMemberFenced as exc:  # rejoins, or raises: the process stops
                self.parts.membership.fenced(exc, self._rebalance.lose_all)
                batch, wants_engine = _NOTHING, False
            if batch.records:
                if self.parts.before_admit is not None:
                    self.parts.before_admit(batch.records)
                rejected = self.task.admit(batch)
                self.hops.add("intake", time.monotonic() - batch.consumed_at)
                self._emit(rejected)
            elif wants_engine:  # what matters next is a batch finishing
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

    def _take(self, pending: int, timeout: float) -> tuple[ConsumedBatch, bool]:
        """This step's records, and whether to wait on the engine instead. Held back, consume()
        serves librdkafka's callbacks and takes one record; isolation (poison.py) takes one
        at a time; idle, the whole poll timeout is waited, returning when a job arrives."""
        room = 1 if self.backpressure.paused else self.cfg.batch.high_watermark - pending
        guard = self._poison if self._poison is not None and self._poison.active else None
        take = True
        if guard is not None:
            take, room = guard.steer(pending), 1
            if not guard.active:  # (isolation over: the next step is a normal one)
                guard = None
        batch = self.intake.consume(room, timeout, prompt=pending == 0) if take else _NOTHING
        if guard is not None:
            batch = guard.screen(batch)
        return batch, timeout == 0.0 or not take

    def _consume_timeout(self, pending: int) -> float:
        """poll_timeout_ms while nothing consumed is unfinished; 0 while every batch slot is
        busy (the step waits on the engine: _idle); else WORK_TICK_S, so due batches launch
        and delivery reports are taken (a whole poll timeout starves the engine:
        bench/kafka/loop_gaps.py)."""
        if pending == 0:
            return self._poll_s
        if self.task.in_flight() >= self.cfg.batch.max_in_flight_batches:
            return 0.0
        return min(self._poll_s, WORK_TICK_S)

    def _idle(self) -> None:
        """No records wanted: until a batch in flight finishes (at most the poll timeout), or
        WORK_TICK_S for the acknowledgements."""
        if self.task.in_flight():
            self.task.wait(self._poll_s)
        else:
            time.sleep(WORK_TICK_S)

    @property
    def fatal_error(self) -> BaseException | None:
        return self._fatal or self._rebalance.fatal or self.committer.fatal

    def _shutdown(self) -> None:
        self.parts.membership.stop()
        log.info("worker_draining", pending=self.committer.pending(),
                 in_flight_batches=self.task.in_flight())
        self._fatal = self.fatal_error
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
                self.parts.membership.leave()
                self.committer.close(failed=self._fatal is not None)
            finally:
                try:
                    self.task.close()
                finally:
                    self.heap.release()
                self._observer.close()
                log.info("worker_stopped", **self.stats.totals(), **self.guarantee_totals())

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
        self._observer.jobs(fresh)
        self.committer.emit(self.parts.outputs.of_answers(fresh))

    def _batch_done(self, took_ms: float, size: int, profile: str, capacity: int) -> None:
        self.vitals.batch_done(took_ms / 1e3, size, profile, capacity)
        self._observer.batch(took_ms / 1e3, size, profile)
        if took_ms > self.cfg.processing.max_batch_ms:
            self.slow_batches += 1
            log.error("batch_over_budget", took_ms=round(took_ms), size=size,
                      max_batch_ms=self.cfg.processing.max_batch_ms,
                      transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)

