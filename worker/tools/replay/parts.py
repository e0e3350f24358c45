"""The replay's parts for the worker loop (:class:`worker.loop.worker.Worker`).

A replay is the live loop over the live rooms (intake, the task, the output builder) with
four parts of its own, because what it reads, where it writes and what it calls done differ:

- :class:`RangeReader`, its consumer: no group. ``subscribe()`` assigns each unfinished
  partition at its watermark; it hands the intake only records the replay still has to
  answer (in range, not answered before an interruption), within ``--rate`` and
  ``--max-records``; a partition read to its end is paused; once reading is over it calls
  ``on_end`` (the runner stops the loop, which drains what was taken).
- :class:`ReplayOutputs`, the live output builder pointed at the replay's topics: results
  to ``--to-topic`` with the source record's headers, dead letters to ``--dlq-topic`` with
  the replay id, or (without it) a rejection only counted.
- :class:`ReplayCommitter`, its committer: an idempotent producer of its own (no
  transaction, no group); a record counts as handled when its output is acknowledged; the
  replay's commit is a checkpoint of the state file, never an offset commit.
- :class:`ReplayStartup` (warm-up, settle, engine check, resume scan, clients) and
  :class:`NoGroup` (no membership to keep: leaving closes the reader).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import DeliveryFailed, JobRejected, KafkaIOError
from worker.kafka import Consumer, Producer
from worker.kafka.admin import Admin
from worker.kafka.clients import RebalanceCallback
from worker.loop.commit.marks import CommitMarks
from worker.loop.output import Output, OutputBuilder
from worker.loop.stats import Stats
from worker.observe.vitals import Vitals
from worker.tasks.protocol import Answer, Task, TaskTopics
from worker.tools.replay.headers import REPLAY_ID, source_headers
from worker.tools.replay.kafka import replay_consumer_settings, replay_producer_settings
from worker.tools.replay.progress import ReplayProgress
from worker.tools.replay.ratelimit import RateLimiter
from worker.tools.replay.scan import recover_written
from worker.tools.replay.start import ReplayRequest, bind_engine
from worker.tools.replay.state import ReplayState, save_state
from worker.wire.records import SourceRecord, SourceRef, TopicPartitionKey

log = structlog.get_logger("replay")

# A replay starts at full speed, so every record is scored on the same path. A task that
# serves while it settles (the GPU moderation task decodes on the CPU until nvJPEG is warm)
# would score the first records on another decoder, and near a threshold that can change the
# verdict.
SETTLE_S = 120.0
# A rejected record the replay only counts (no --dlq-topic): an output nothing produces.
COUNTED = "rejected"


class RangeReader(Consumer):
    """The replay's consumer (see the module): the loop's consumer part, reading a range."""

    def __init__(self, cfg: WorkerConfig, state: ReplayState, rate: float | None,
                 max_records: int | None) -> None:
        super().__init__(replay_consumer_settings(cfg, state.replay_id))
        self.topic, self._ledgers = state.topic, state.partitions
        self._todo = sorted(p for p, lg in state.partitions.items() if not lg.finished)
        self._rate, self._max_records = rate, max_records
        # --rate counts from the first read: tokens saved up while the task warmed up (or the
        # loop settled its heap) would be a burst.
        self._limiter: RateLimiter | None = None
        self.positions: dict[int, int] = {}  # per partition: one past the last record read
        self._past_end: set[int] = set()  # read to the end of the range: paused
        self.admitted = 0
        self.on_end: Callable[[], None] = lambda: None

    def subscribe(self, topics: Sequence[str], *, on_assign: RebalanceCallback,
                  on_revoke: RebalanceCallback, on_lost: RebalanceCallback) -> None:
        """The range instead of a group's share: no group, so no rebalance callback runs."""
        self.assign([ck.TopicPartition(self.topic, p, self._ledgers[p].next)
                     for p in self._todo])

    @property
    def finished(self) -> bool:
        """Nothing more to read: every partition at its end, or ``--max-records`` taken."""
        if self._max_records is not None and self.admitted >= self._max_records:
            return True
        return all(self.positions.get(p, -1) >= self._ledgers[p].end for p in self._todo)

    def consume(self, num_messages: int, timeout: float) -> list[ck.Message]:
        return self._read(super().consume, num_messages, timeout)

    def take(self, max_records: int, wait_s: float) -> list[ck.Message]:
        return self._read(super().take, max_records, wait_s)

    def resume(self, partitions: list[ck.TopicPartition]) -> None:
        # A partition read to its end stays paused, whoever releases it (the partition hold).
        super().resume([tp for tp in partitions if tp.partition not in self._past_end])

    def _read(self, read: Callable[[int, float], list[ck.Message]], n: int, timeout: float
              ) -> list[ck.Message]:
        if self.finished:
            self.on_end()
            return []
        if self._max_records is not None:
            n = min(n, self._max_records - self.admitted)
        if self._limiter is None:
            self._limiter = RateLimiter(self._rate)
        limiter = self._limiter
        budget = limiter.available(n)
        if budget <= 0:  # --rate: wait for the next token (at most the loop's wait)
            time.sleep(min(timeout, limiter.wait_s()))
            return []
        msgs = [m for m in read(budget, timeout) if self._wanted(m)]
        taken = sum(1 for m in msgs if m.error() is None)
        limiter.take(taken)
        self.admitted += taken
        self._track_positions()
        return msgs

    def _wanted(self, msg: ck.Message) -> bool:
        """Errors go on to the intake (which logs them, or stops on a fatal one); a record
        only if the replay still has to answer it."""
        p, off = msg.partition(), msg.offset()
        if msg.error() is not None or p is None or off is None:
            return True
        ledger = self._ledgers.get(p)
        # Past the range, answered before an interruption, or already taken.
        return ledger is not None and not (off >= ledger.end or ledger.is_done(off)
                                           or off in ledger.open)

    def _track_positions(self) -> None:
        reading = [p for p in self._todo if p not in self._past_end]
        if not reading:
            return
        ended = []
        for tp in self.position([ck.TopicPartition(self.topic, p) for p in reading]):
            self.positions[tp.partition] = tp.offset
            if tp.offset >= self._ledgers[tp.partition].end:
                ended.append(ck.TopicPartition(self.topic, tp.partition))
                self._past_end.add(tp.partition)
        # No more fetching of records the range does not want.
        self.pause(ended)


class ReplayOutputs(OutputBuilder):
    """The live output builder, pointed at the replay's topics (see the module)."""

    def __init__(self, cfg: WorkerConfig, req: ReplayRequest, replay_id: str,
                 stats: Stats) -> None:
        # The replay's dead letters are the live ones, in full (no inline size limit).
        super().__init__(TaskTopics(req.topic, req.to_topic, req.dlq_topic or ""),
                         cfg.kafka.client_id, stats)
        self.replay_id = replay_id
        self._statuses: dict[tuple[int, int], str] = {}  # answered, not yet acknowledged

    def of_answers(self, answers: list[Answer]) -> list[Output]:
        outs = super().of_answers(answers)
        for a, out in zip(answers, outs, strict=True):
            if out.kind == "result":
                out.headers = [*(out.headers or []), *source_headers(self.replay_id, a.ref)]
                self._statuses[(a.ref.partition, a.ref.offset)] = a.status
        return outs

    def dead_letter(self, src: SourceRecord, error: JobRejected) -> Output:
        ref = SourceRef(src.topic, src.partition, src.offset)
        if not self.topics.dlq:
            log.debug("replay_rejected", topic=src.topic, partition=src.partition,
                      offset=src.offset, reason=error.reason, error=str(error)[:300])
            return Output(ref, "", None, None, None, COUNTED, (src, error))
        out = super().dead_letter(src, error)
        out.headers = [*(out.headers or []), (REPLAY_ID, self.replay_id.encode())]
        return out

    def kind(self, out: Output) -> str:
        """What the ledger counts the output's record as, once it is done with."""
        if out.rejected is not None:
            prefix = "dlq" if out.kind == "dlq" else "rejected"
            return f"{prefix}:{out.rejected[1].reason}"
        return f"result:{self._statuses.pop((out.ref.partition, out.ref.offset), '')}"


class ReplayCommitter:
    """The replay's committer (see the module); it follows
    :class:`worker.loop.commit.base.Committer`, the group's calls doing nothing (no group)."""

    transactional_id: str | None = None
    on_committed: Callable[[dict[TopicPartitionKey, int]], None] | None = None
    on_wait: Callable[[], None] | None = None

    def __init__(self, cfg: WorkerConfig, req: ReplayRequest, state: ReplayState,
                 outputs: ReplayOutputs, reader: RangeReader, progress: ReplayProgress) -> None:
        self.fatal: BaseException | None = None
        self.marks = CommitMarks()
        self._req, self._state, self._outputs = req, state, outputs
        self._reader, self._progress = reader, progress
        self._drain_s = cfg.commit.drain_timeout_s
        self._producer = Producer(replay_producer_settings(cfg))
        self._checkpointed = time.monotonic()
        self.handled = 0  # this run

    # -- what the loop calls -----------------------------------------------------------------
    def start(self) -> None:
        self._producer.open()

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> None:
        self._state.partitions[partition].begin(offset)

    def emit(self, outs: list[Output]) -> None:
        for out in outs:
            kind = self._outputs.kind(out)
            if out.kind == COUNTED:
                self._handle(out.ref.partition, out.ref.offset, kind)
                continue
            self._producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                                   on_delivery=partial(self._acked, out.ref, kind))

    def tick(self, *, force: bool = False) -> None:
        self._producer.poll(0)
        now = time.monotonic()
        if force or now - self._checkpointed >= self._req.checkpoint_interval_s:
            self.checkpoint()
            self._checkpointed = now
        self._progress.update(self.done())

    def pending(self) -> int:
        return sum(len(lg.open) for lg in self._state.partitions.values())

    def drain(self, *, failed: bool) -> None:
        if failed:
            return
        left = self._producer.flush(self._drain_s)
        if self.fatal is not None:
            raise self.fatal
        if left:
            raise DeliveryFailed(f"{left} replay results still undelivered after "
                                 f"{self._drain_s} s")

    def close(self, *, failed: bool) -> None:
        try:
            left = self._producer.close(self._drain_s)
            if left:
                log.error("replay_undelivered_at_exit", count=left)
        finally:
            self.checkpoint()  # only acknowledged work is in it: always safe to save
            self._progress.update(self.done())

    # -- the replay's own --------------------------------------------------------------------
    def checkpoint(self) -> None:
        for p, ledger in self._state.partitions.items():
            ledger.advance(self._reader.positions.get(p))
        self._state.finished = all(lg.finished for lg in self._state.partitions.values())
        save_state(self._req.state_file, self._state)

    def done(self) -> int:
        return sum(lg.end - lg.start - lg.remaining() for lg in self._state.partitions.values())

    def _handle(self, partition: int, offset: int, kind: str) -> None:
        self._state.partitions[partition].handle(offset, kind)
        self.handled += 1

    def _acked(self, ref: SourceRef, kind: str, err: ck.KafkaError | None,
               msg: ck.Message) -> None:
        if err is not None:
            self.fatal = DeliveryFailed(f"delivery of the answer to {ref.topic}[{ref.partition}]"
                                        f"@{ref.offset} failed: {err.str()}")
            return
        self._handle(ref.partition, ref.offset, kind)
        topic, out_p, out_off = msg.topic(), msg.partition(), msg.offset()
        if topic is not None and out_p is not None and out_off is not None:
            marks = self._state.scan_from.setdefault(topic, {})
            marks[out_p] = max(marks.get(out_p, 0), out_off + 1)

    # -- a group's calls: the replay has no group, so none of these has anything to do -------
    def held_bytes(self) -> int:
        return 0

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        return {}  # (nothing is committed: the partition hold never holds a replay back)

    # A replay owns no group: no offset is ever committed (its progress is the state file's
    # checkpoint), and no partition is revoked, lost or rewound under it.
    def on_commit(self, err: ck.KafkaError | None, partitions: list[ck.TopicPartition]
                  ) -> None:
        """No consumer commit is ever made."""

    def revoked(self, keys: set[TopicPartitionKey]) -> None:
        """Never called: no group assigns the range."""

    def lost(self, keys: set[TopicPartitionKey]) -> None:
        """Never called: no group assigns the range."""

    def forget(self, keys: set[TopicPartitionKey]) -> None:
        """Nothing is kept per partition beyond the checkpoint."""

    def request_abort(self, reason: str) -> None:
        """No transaction to abort."""

    def track(self, key: TopicPartitionKey, committed: int) -> None:
        """The crash-loop breaker's hook: a replay has no committed positions to guard."""

    def position(self, key: TopicPartitionKey) -> int | None:
        return None

    def commit_marks(self, keys: Iterable[TopicPartitionKey]) -> bool:
        return False

    def totals(self) -> dict[str, int]:
        return {"replay_handled": self.handled}

    def unacked_for_s(self) -> float | None:
        return None

    def blocked(self) -> str | None:
        return None


def _settle(task: Task, timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while not task.ready():
        if time.monotonic() >= deadline:
            log.warning("replay_task_not_settled", waited_s=timeout_s,
                        note="replaying anyway; the first records may take a slower path")
            return
        if stop.wait(0.01):  # stopped while settling: the loop drains at once
            return


class ReplayStartup:
    """Before the first step: the task warmed up and settled, the engine checked against a
    resumed state, what an interrupted run wrote found, the state saved, the clients opened.
    The topics were checked when the request was (:mod:`worker.tools.replay.start`)."""

    def __init__(self, cfg: WorkerConfig, req: ReplayRequest, state: ReplayState,
                 resumed: bool, task: Task, admin: Admin, committer: ReplayCommitter,
                 reader: RangeReader, stopping: threading.Event) -> None:
        self._cfg, self._req, self._state, self._resumed = cfg, req, state, resumed
        self._task, self._admin, self._committer, self._reader = task, admin, committer, reader
        self._stopping = stopping
        self.recovered = 0
        self.opened = False

    def wait_for_topics(self, stop: threading.Event) -> bool:
        return True

    def open_while_warming(self, stop: threading.Event) -> bool:
        task, state = self._task, self._state
        task.warm_up()
        _settle(task, SETTLE_S, self._stopping)
        bind_engine(state, model=task.model_id, engine=task.engine_hash, resumed=self._resumed)
        if self._resumed and not state.finished:
            conf = replay_consumer_settings(self._cfg, state.replay_id)
            self.recovered = recover_written(self._admin, conf, state)
        save_state(self._req.state_file, state)
        log.info("replay_started", replay_id=state.replay_id, topic=self._req.topic,
                 to_topic=self._req.to_topic, resumed=self._resumed, recovered=self.recovered,
                 engine=task.engine_hash,
                 ranges={p: (lg.start, lg.end) for p, lg in sorted(state.partitions.items())})
        try:
            self._committer.start()
            self._reader.open()
        except BaseException:
            with contextlib.suppress(Exception):
                self._reader.close(timeout_s=1.0)
            with contextlib.suppress(Exception):
                self._committer.close(failed=True)
            raise
        self.opened = True
        return True


class NoGroup:
    """The replay's membership: it has no group, so nothing to rejoin or watch; leaving
    closes the reader."""

    def __init__(self, reader: RangeReader) -> None:
        self._reader = reader

    def leave(self) -> None:
        try:
            self._reader.close(timeout_s=10.0)
        except KafkaIOError as exc:  # it committed nothing: nothing is lost
            log.warning("replay_consumer_close_failed", error=str(exc)[:300])

    def start(self) -> None:
        """No group to watch."""

    def stop(self) -> None:
        """No group to watch."""

    def step(self, now: float, vitals: Vitals) -> None:
        """No group to rejoin."""

    def rebalanced(self) -> None:
        """Never called: no group."""

    def assigned(self) -> None:
        """Never called: no group."""

    def lost(self) -> None:
        """Never called: no group."""

    def totals(self) -> dict[str, int]:
        return {}


def owned(state: ReplayState) -> set[TopicPartitionKey]:
    """The partitions the loop treats as this member's: every partition of the range."""
    return {(state.topic, p) for p in state.partitions}

