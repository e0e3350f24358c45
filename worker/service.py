"""The worker loop: consume -> decode -> batch -> infer -> produce -> commit.

One step is schedule (release due batches) -> execute (submit, non-blocking) -> update (collect
finished batches, produce results, serve delivery callbacks, commit). The main thread never
waits on the engine, so it keeps polling and ``max.poll.interval.ms`` is never breached; when
too many jobs are held it pauses the assignment instead of blocking (backpressure).

Offsets: a record counts as finished only when its result (or DLQ record) is acknowledged by
the broker; commits carry the lowest unfinished offset per partition (see worker.offsets).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any

import confluent_kafka as ck
import structlog

from engines.backends.base import Runner
from worker.batcher import DynamicBatcher, NoProfileFits
from worker.codec import DecodeLimits, decode_moderation_job, encode_result
from worker.config import WorkerConfig
from worker.dlq import Headers, SourceRecord, dead_letter
from worker.engine_setup import make_runner
from worker.exceptions import (
    ConfigError,
    DeliveryFailed,
    JobRejected,
    KafkaIOError,
    OversizedMessage,
    SchemaViolation,
)
from worker.jobs import RESULT_SCHEMA, ModerationResult, SourceRef
from worker.kafka import Consumer, Producer, consumer_settings, producer_settings
from worker.moderation import Outcome, Pending
from worker.moderation_gpu import make_task
from worker.offsets import OffsetTracker, TopicPartitionKey
from worker.stats import Stats

log = structlog.get_logger("worker")


class Worker:
    def __init__(self, cfg: WorkerConfig, runner: Runner | None = None) -> None:
        if not cfg.kafka.bootstrap_servers:
            raise ConfigError("kafka.bootstrap_servers is empty (set KAFKA_BOOTSTRAP_SERVERS)")
        self.cfg = cfg
        built, plan = make_runner(cfg)
        self.runner = runner or built
        self.task = make_task(cfg, self.runner, plan.spec, plan.profiles)
        self.stats = Stats()
        self._consumer = Consumer(consumer_settings(cfg))
        self._producer = Producer(producer_settings(cfg))
        self._tracker = OffsetTracker()
        self._batcher: DynamicBatcher[Pending] = DynamicBatcher(
            plan.profiles, max_batch_size=cfg.batch.max_batch_size,
            max_delay_s=cfg.batch.max_delay_ms / 1e3, max_pad_fraction=cfg.batch.max_pad_fraction,
        )
        self._limits = DecodeLimits(cfg.limits.max_image_bytes, cfg.limits.max_text_chars)
        self._in_flight: list[Future[list[Outcome]]] = []
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._paused = False
        self._last_commit = time.monotonic()
        self._result_headers_base: Headers = []

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from signal handlers and other threads)."""
        self._stop.set()

    def run(self) -> None:
        self.runner.activate()
        self.task.warm_up(self._batcher.profiles)
        self._result_headers_base = [
            ("ktw.schema", RESULT_SCHEMA.encode()),
            ("ktw.model", self.task.model_id.encode()),
            ("ktw.engine", self.task.engine_hash.encode()),
        ]
        self._producer.open()
        self._consumer.open()
        self._consumer.subscribe(
            [self.cfg.topics.jobs], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("worker_started", topic=self.cfg.topics.jobs, group=self.cfg.kafka.group_id,
                 engine=self.task.engine_hash, client_id=self.cfg.kafka.client_id)
        try:
            while not self._stop.is_set():
                self.step()
                if self._fatal is not None:
                    raise self._fatal
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
        self._backpressure()
        self._maybe_commit(force=False)
        self.stats.maybe_log(log, pending=self._tracker.pending(), paused=self._paused)

    def _shutdown(self) -> None:
        log.info("worker_draining", pending=self._tracker.pending(),
                 in_flight_batches=len(self._in_flight))
        try:
            if self._fatal is None:
                while len(self._batcher) or self._in_flight:
                    self._schedule(force=True)
                    self._collect(block=True)
            undelivered = self._producer.flush(self.cfg.commit.drain_timeout_s)
            if undelivered:
                log.error("undelivered_at_shutdown", count=undelivered)
            self._maybe_commit(force=True)
        finally:
            try:
                self._consumer.close()
                self._producer.close(self.cfg.commit.drain_timeout_s)
            finally:
                self.task.close()
                self.runner.deactivate()
                log.info("worker_stopped", **self.stats.totals())

    # -- intake ------------------------------------------------------------------------------
    def _accept(self, msg: ck.Message) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaIOError(f"fatal consumer error: {err.str()}")
            log.warning("consumer_error", error=err.str(), code=err.code())
            return
        topic, partition, offset = _coordinates(msg)
        self._tracker.begin(topic, partition, offset)
        self.stats.consumed += 1
        value = msg.value()
        ts_type, ts = msg.timestamp()
        headers = msg.headers()
        record = SourceRecord(
            topic, partition, offset, msg.key(), value,
            list(headers.items()) if isinstance(headers, dict) else headers,
            ts if ts_type != ck.TIMESTAMP_NOT_AVAILABLE else None,
        )
        try:
            if value is None:
                raise SchemaViolation("record has no value (tombstone)")
            if len(value) > self.cfg.limits.max_message_bytes:
                raise OversizedMessage(
                    f"record of {len(value)} bytes exceeds limits.max_message_bytes "
                    f"{self.cfg.limits.max_message_bytes}"
                )
            job = decode_moderation_job(value, self._limits)
            self.task.check_policy(job)
        except JobRejected as exc:
            self._dead_letter(record, exc)
            return
        ref = SourceRef(topic, partition, offset)
        try:
            self._batcher.add(Pending(ref, job, time.monotonic(), record))
        except NoProfileFits as exc:
            self._dead_letter(record, SchemaViolation(str(exc), reason="no_profile"))

    # -- schedule / execute / update -------------------------------------------------------
    def _schedule(self, *, force: bool) -> None:
        free = self.cfg.batch.max_in_flight_batches - len(self._in_flight)
        if free <= 0 and not force:
            return
        now_ms = int(time.time() * 1e3)
        due = self._batcher.schedule(time.monotonic(), now_ms, limit=max(free, 0), force=force)
        for p in due.expired:
            self.stats.expired += 1
            log.info("job_expired", job_id=p.job.id, topic=p.ref.topic,
                     partition=p.ref.partition, offset=p.ref.offset)
            self._publish(self.task.expired_result(p, now_ms), p.ref)
        for batch in due.batches:
            self._in_flight.append(self.task.submit(batch))

    def _collect(self, *, block: bool) -> None:
        pending = []
        for fut in self._in_flight:
            if block or fut.done():
                # An exception here is a bug in the task, not a bad job: let it stop the
                # worker without committing those offsets.
                for outcome in fut.result():
                    self._finish(outcome)
            else:
                pending.append(fut)
        self._in_flight = pending

    def _finish(self, outcome: Outcome) -> None:
        p = outcome.pending
        if outcome.rejection is not None:
            self._dead_letter(p.record, outcome.rejection)
        elif outcome.result is not None:
            self._publish(outcome.result, p.ref)

    # -- output ------------------------------------------------------------------------------
    def _publish(self, result: ModerationResult, ref: SourceRef) -> None:
        log.debug("job_result", job_id=result.id, topic=ref.topic, partition=ref.partition,
                  offset=ref.offset, status=result.status.value,
                  verdict=result.verdict.value if result.verdict else None,
                  nsfw=result.scores.get("nsfw"))
        self._producer.produce(
            self.cfg.topics.results, key=result.id.encode(), value=encode_result(result),
            headers=self._result_headers_base, on_delivery=partial(self._delivered, ref),
        )
        self.stats.results += 1

    def _dead_letter(self, src: SourceRecord, error: JobRejected) -> None:
        record = dead_letter(src, error, self.cfg.kafka.client_id)
        ref = SourceRef(src.topic, src.partition, src.offset)
        log.warning("job_dead_lettered",
                    key=src.key.decode("utf-8", "replace") if src.key else None,
                    topic=ref.topic, partition=ref.partition, offset=ref.offset,
                    reason=error.reason, error=str(error)[:300])
        self._producer.produce(
            self.cfg.topics.dlq, key=record.key, value=record.value, headers=record.headers,
            on_delivery=partial(self._delivered, ref),
        )
        self.stats.dead_lettered += 1

    def _delivered(self, ref: SourceRef, err: ck.KafkaError | None, _msg: ck.Message) -> None:
        if err is not None:
            # librdkafka already retried for message.timeout.ms; never commit past this record.
            self._fatal = DeliveryFailed(
                f"delivery for {ref.topic}[{ref.partition}]@{ref.offset} failed: {err.str()}",
            )
            return
        self._tracker.finish(ref.topic, ref.partition, ref.offset)

    # -- offsets, backpressure, rebalance ---------------------------------------------------
    def _maybe_commit(self, *, force: bool, only: Iterable[TopicPartitionKey] | None = None
                      ) -> None:
        now = time.monotonic()
        if not force and (now - self._last_commit) * 1e3 < self.cfg.commit.interval_ms:
            return
        self._last_commit = now
        positions = self._tracker.committable(only)
        if not positions:
            return
        offsets = [ck.TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            self._consumer.commit(offsets)
        except KafkaIOError as exc:
            # Usually a rebalance in progress; the same positions are retried next interval.
            log.warning("commit_failed", error=str(exc), recoverable=exc.recoverable)
            return
        self._tracker.mark_committed(positions)
        log.debug("committed", offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})

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

    def _on_assign(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        try:
            log.info("partitions_assigned", partitions=_names(partitions))
        finally:
            if self._paused and partitions:
                consumer.pause(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        log.info("partitions_revoked", partitions=_names(partitions))
        try:
            # Queued jobs of revoked partitions are dropped uncommitted (the new owner redoes
            # them); batches already computing are finished and delivered, then committed.
            self._batcher.remove(lambda p: (p.ref.topic, p.ref.partition) in keys)
            self._collect(block=True)
            self._producer.flush(self.cfg.commit.drain_timeout_s)
            self._maybe_commit(force=True, only=keys)
        except KafkaIOError as exc:
            log.warning("revoke_commit_failed", error=str(exc))
        finally:
            self._tracker.drop(keys)

    def _on_lost(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        log.warning("partitions_lost", partitions=_names(partitions))
        try:
            self._batcher.remove(lambda p: (p.ref.topic, p.ref.partition) in keys)
        finally:
            # Another member may own them already: never commit here.
            self._tracker.drop(keys)


def _coordinates(msg: ck.Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise KafkaIOError("consumed record without topic/partition/offset")
    return topic, partition, offset


def _names(partitions: list[ck.TopicPartition]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions]
