"""The replay loop: assigned consumer -> the live worker's task -> idempotent producer.

Scoring goes through the task the live worker would serve with this config
(:func:`worker.tasks.registry.make_task`: open_nsfw, image-and-text policies, or
generation), admitting each consumed batch as the live loop does, so a replayed result is what
the live worker would answer now. Deadlines are ignored (no job expires): the question a replay
asks is what the model says, not whether the answer would have been in time. Rejected
records are counted by reason, and sent to a DLQ topic only with ``--dlq-topic``.

Progress is checkpointed to the state file every ``checkpoint_interval_s`` and at the end;
only acknowledged deliveries count as handled. See :mod:`worker.tools.replay.scan` for why a resume
after any interruption produces no duplicate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import confluent_kafka as ck
import structlog

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.exceptions import DeliveryFailed, JobRejected
from worker.kafka import Producer, is_fatal, source_record
from worker.tasks.protocol import Answer, ConsumedBatch, Task
from worker.tools.replay.exceptions import ReplayError
from worker.tools.replay.headers import REPLAY_ID, source_headers
from worker.tools.replay.kafka import Admin, admin_settings, replay_consumer_settings
from worker.tools.replay.kafka import replay_producer_settings as producer_conf
from worker.tools.replay.ledger import PartitionLedger
from worker.tools.replay.progress import ReplayProgress
from worker.tools.replay.ratelimit import RateLimiter
from worker.tools.replay.scan import recover_written
from worker.tools.replay.start import ReplayRequest, bind_engine, load_or_create
from worker.tools.replay.state import ReplayState, save_state
from worker.wire.dlq import dead_letter
from worker.wire.records import SourceRecord

log = structlog.get_logger("replay")


@dataclass
class ReplaySummary:
    replay_id: str
    topic: str
    to_topic: str
    engine: str
    ranges: dict[int, tuple[int, int]]
    counts: Counter[str]
    resumed: bool
    recovered: int  # found already written by an interrupted run, not produced again
    handled_this_run: int
    elapsed_s: float
    finished: bool
    state: ReplayState = field(repr=False)


# A replay starts at full speed, so every record is scored on the same path. A task that
# serves while it settles (the GPU moderation task decodes on the CPU until nvJPEG is warm)
# would score the first records on another decoder, and near a threshold that can change the
# verdict.
SETTLE_S = 120.0


def _settle(task: Task, timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while not task.ready():
        if time.monotonic() >= deadline:
            log.warning("replay_task_not_settled", waited_s=timeout_s,
                        note="replaying anyway; the first records may take a slower path")
            return
        if stop.wait(0.01):  # stop() while settling: the loop drains at once
            return


class ReplayRunner:
    def __init__(self, cfg: WorkerConfig, req: ReplayRequest, runner: Runner | None = None
                 ) -> None:
        self.cfg, self.req = cfg, req
        self._stop = threading.Event()
        self._admin = Admin(admin_settings(cfg))
        # Validation and state first: a bad request fails before the model is even loaded.
        self.state, self.resumed = load_or_create(cfg, self._admin, req)
        # ``runner``: an open_nsfw runner shared with the caller (tests), left active.
        from worker.tasks.registry import make_task

        self._task: Task = make_task(cfg, ignore_deadlines=True, runner=runner)
        self._fatal: BaseException | None = None
        self._admitted = 0
        self._handled = 0
        self._positions: dict[int, int] = {}
        self._paused: set[int] = set()

    def stop(self) -> None:
        """Drain, checkpoint and return early (safe from signal handlers and other threads)."""
        self._stop.set()

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> ReplaySummary:
        started = time.monotonic()
        task = self._task
        try:
            task.warm_up()
            _settle(task, SETTLE_S, self._stop)
            bind_engine(self.state, model=task.model_id, engine=task.engine_hash,
                        resumed=self.resumed)
            recovered = 0
            if self.resumed and not self.state.finished:
                conf = replay_consumer_settings(self.cfg, self.state.replay_id)
                recovered = recover_written(self._admin, conf, self.state)
            save_state(self.req.state_file, self.state)
            log.info("replay_started", replay_id=self.state.replay_id, topic=self.req.topic,
                     to_topic=self.req.to_topic, resumed=self.resumed, recovered=recovered,
                     engine=task.engine_hash, ranges=_ranges(self.state))
            if not self.state.finished:
                self._loop()
        finally:
            task.close()
        summary = ReplaySummary(
            self.state.replay_id, self.req.topic, self.req.to_topic, self.state.engine,
            _ranges(self.state), self.state.totals(), self.resumed, recovered, self._handled,
            time.monotonic() - started, self.state.finished, self.state,
        )
        log.info("replay_stopped", replay_id=summary.replay_id, finished=summary.finished,
                 handled=summary.handled_this_run, counts=dict(summary.counts))
        return summary

    def _loop(self) -> None:
        consumer = ck.Consumer(replay_consumer_settings(self.cfg, self.state.replay_id))
        producer = Producer(producer_conf(self.cfg))
        producer.open()
        todo = {p: lg for p, lg in self.state.partitions.items() if not lg.finished}
        limiter = RateLimiter(self.req.rate)
        total = sum(lg.end - lg.start for lg in self.state.partitions.values())
        progress = ReplayProgress(f"replay {self.req.topic}", total, self._done(),
                                  enabled=self.req.progress)
        last_checkpoint = time.monotonic()
        try:
            consumer.assign([ck.TopicPartition(self.req.topic, p, lg.next)
                             for p, lg in todo.items()])
            with progress:
                while not self._finished_reading(todo) or self._busy():
                    self._step(consumer, producer, limiter, todo)
                    if time.monotonic() - last_checkpoint >= self.req.checkpoint_interval_s:
                        self._checkpoint()
                        last_checkpoint = time.monotonic()
                    progress.update(self._done())
                self._drain(producer)
                progress.update(self._done())
        except ck.KafkaException as exc:
            raise ReplayError(f"replay consumer failed: {exc}") from exc
        finally:
            try:
                consumer.close()
                left = producer.close(self.cfg.commit.drain_timeout_s)
                if left:
                    log.error("replay_undelivered_at_exit", count=left)
            finally:
                self._checkpoint()  # only acknowledged work is in it: always safe to save

    # -- one step ----------------------------------------------------------------------------
    def _step(self, consumer: ck.Consumer, producer: Producer, limiter: RateLimiter,
              todo: dict[int, PartitionLedger]) -> None:
        want = 0 if self._finished_reading(todo) else self._room()
        budget = limiter.available(want)
        msgs = consumer.consume(budget, timeout=0.05) if budget > 0 else []
        consumed_at = time.monotonic()
        records = [r for r in map(self._accept, msgs) if r is not None]
        limiter.take(len(records))
        if records:
            # One epoch for every partition: a replay never loses a partition mid-run.
            for answer in self._task.admit(ConsumedBatch(records, {}, consumed_at)):
                self._answer(answer, producer)
        self._track_positions(consumer, todo)
        self._submit(producer, force=budget == 0 or len(msgs) < budget)
        if budget == 0:  # nothing to read now: wait for the engine or the broker, not spin
            pause = min(limiter.wait_s(), 0.05) if want > 0 else 0.05
            if self._task.in_flight():
                self._task.wait(pause)
            else:
                producer.poll(pause)
        self._collect(producer, block=False)
        producer.poll(0)
        if self._fatal is not None:
            raise self._fatal

    def _track_positions(self, consumer: ck.Consumer, todo: dict[int, PartitionLedger]) -> None:
        """Remember where each partition's reading stands; pause those past their end so the
        consumer stops fetching records the range does not want."""
        reading = [p for p in todo if p not in self._paused]
        if not reading:
            return
        for tp in consumer.position([ck.TopicPartition(self.req.topic, p) for p in reading]):
            self._positions[tp.partition] = tp.offset
            if tp.offset >= todo[tp.partition].end:
                consumer.pause([ck.TopicPartition(self.req.topic, tp.partition)])
                self._paused.add(tp.partition)

    def _room(self) -> int:
        if self._stop.is_set():
            return 0
        room = self.cfg.batch.high_watermark - sum(
            len(lg.open) for lg in self.state.partitions.values())
        if self.req.max_records is not None:
            room = min(room, self.req.max_records - self._admitted)
        return max(0, min(room, 1000))

    def _finished_reading(self, todo: dict[int, PartitionLedger]) -> bool:
        if self._stop.is_set() or (self.req.max_records is not None
                                   and self._admitted >= self.req.max_records):
            return True
        return all(self._positions.get(p, -1) >= self.state.partitions[p].end for p in todo)

    def _busy(self) -> bool:
        return bool(self._task.held() or any(lg.open for lg in self.state.partitions.values()))

    def _done(self) -> int:
        return sum(lg.end - lg.start - lg.remaining() for lg in self.state.partitions.values())

    # -- intake ------------------------------------------------------------------------------
    def _accept(self, msg: ck.Message) -> SourceRecord | None:
        """The record of ``msg`` if the replay still has to answer it (its offset begun)."""
        err = msg.error()
        if err is not None:
            if is_fatal(err):
                raise ReplayError(f"fatal consumer error: {err.str()}")
            log.warning("replay_consumer_error", error=err.str())
            return None
        p, off = msg.partition(), msg.offset()
        if p is None or off is None:
            raise ReplayError("consumed a record without partition/offset")
        ledger = self.state.partitions[p]
        if off >= ledger.end or ledger.is_done(off) or off in ledger.open:
            return None  # past the range, or answered before an interruption
        ledger.begin(off)
        self._admitted += 1
        return source_record(msg, self.req.topic, p, off)

    def _reject(self, record: SourceRecord, error: JobRejected, producer: Producer) -> None:
        kind = f"rejected:{error.reason}"
        log.debug("replay_rejected", topic=record.topic, partition=record.partition,
                  offset=record.offset, reason=error.reason, error=str(error)[:300])
        if self.req.dlq_topic is None:
            self.state.partitions[record.partition].handle(record.offset, kind)
            self._handled += 1
            return
        dl = dead_letter(record, error, self.cfg.kafka.client_id)
        producer.produce(
            self.req.dlq_topic, key=dl.key, value=dl.value,
            headers=[*dl.headers, (REPLAY_ID, self.state.replay_id.encode())],
            on_delivery=partial(self._acked, record.partition, record.offset,
                                f"dlq:{error.reason}"),
        )

    # -- execute / output --------------------------------------------------------------------
    def _submit(self, producer: Producer, *, force: bool) -> None:
        free = self.cfg.batch.max_in_flight_batches - self._task.in_flight()
        if free <= 0 or not self._task.held():
            return
        # Deadlines are ignored (ignore_deadlines): nothing expires, but answer whatever
        # schedule returns.
        for answer in self._task.schedule(time.monotonic(), int(time.time() * 1e3), free=free,
                                          force=force):
            self._answer(answer, producer)

    def _collect(self, producer: Producer, *, block: bool) -> None:
        for answer in self._task.collect(block=block):
            self._answer(answer, producer)

    def _answer(self, a: Answer, producer: Producer) -> None:
        if a.rejection is not None:
            self._reject(a.record, a.rejection, producer)
            return
        assert a.value is not None
        producer.produce(
            self.req.to_topic, key=a.key, value=a.value,
            headers=[*(a.headers or []), *source_headers(self.state.replay_id, a.ref)],
            on_delivery=partial(self._acked, a.ref.partition, a.ref.offset,
                                f"result:{a.status}"),
        )

    def _acked(self, partition: int, offset: int, kind: str, err: ck.KafkaError | None,
               msg: ck.Message) -> None:
        if err is not None:
            self._fatal = DeliveryFailed(
                f"delivery of the answer to {self.req.topic}[{partition}]@{offset} failed: "
                f"{err.str()}")
            return
        self.state.partitions[partition].handle(offset, kind)
        self._handled += 1
        topic, out_p, out_off = msg.topic(), msg.partition(), msg.offset()
        if topic is not None and out_p is not None and out_off is not None:
            marks = self.state.scan_from.setdefault(topic, {})
            marks[out_p] = max(marks.get(out_p, 0), out_off + 1)

    def _drain(self, producer: Producer) -> None:
        while self._task.held():
            self._submit(producer, force=True)
            self._collect(producer, block=True)
        left = producer.flush(self.cfg.commit.drain_timeout_s)
        if self._fatal is not None:
            raise self._fatal
        if left:
            raise DeliveryFailed(f"{left} replay results still undelivered after "
                                 f"{self.cfg.commit.drain_timeout_s} s")

    def _checkpoint(self) -> None:
        for p, ledger in self.state.partitions.items():
            ledger.advance(self._positions.get(p))
        self.state.finished = all(lg.finished for lg in self.state.partitions.values())
        save_state(self.req.state_file, self.state)


def _ranges(state: ReplayState) -> dict[int, tuple[int, int]]:
    return {p: (lg.start, lg.end) for p, lg in sorted(state.partitions.items())}
