"""At-least-once: a record is finished when its output is acknowledged by the broker; commits
carry, per partition, the lowest unfinished offset (:class:`OffsetTracker`), so out-of-order
completion never commits past unanswered work and a crash can only repeat work.

The steady loop commits asynchronously: a synchronous commit would hold the loop (and every
batch behind it) until the coordinator answers, up to a minute while the broker stalls. The
outcome arrives through librdkafka's commit report (:meth:`AtLeastOnce.on_commit`, served from
``consume()``); one async commit is outstanding at a time. Revoke commits synchronously: those
positions must be stored before the partitions move on. Shutdown commits with a bounded wait
(:data:`SHUTDOWN_COMMIT_WAIT_S`): a sync commit against a coordinator the client lost after a
broker stall can block past the process's shutdown timeout, and a commit that does not land
only means the next owner repeats those records.

Delivery reports are aggregated per :meth:`AtLeastOnce.emit` (:class:`_Sent`): every record of
one call reports to the same callable, and the batch's offsets finish together once its last
report is in. A callable per record (a ``functools.partial`` naming its output) and the work
done in each report cost 2-3 us per record on the 2-core VM, a tenth of the whole per-record
host cost (bench/NOTES.md, "fourteenth session"). The price: a batch's offsets wait for its
slowest record, so a record held up to ``message.timeout.ms`` (a partition leader away) holds
the acknowledged records of its batch too, and if their partitions move on meanwhile the next
owner repeats them (never loses them).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import DeliveryFailed, KafkaIOError
from worker.kafka import Consumer, Producer, producer_settings
from worker.loop.commit.marks import CommitMarks, marker
from worker.loop.commit.offsets import OffsetTracker
from worker.loop.hops import HopTimes
from worker.loop.output import Output, OutputBuilder, by_record, reported, stand_in
from worker.wire.records import TopicPartitionKey

# Output topics a readiness reason names before it counts the rest.
MAX_TOPICS_NAMED = 3

log = structlog.get_logger("worker")

# An async commit unanswered this long is presumed lost: the next interval sends another.
ASYNC_COMMIT_STALE_S = 60.0
# How long shutdown waits for its final commit to be answered.
SHUTDOWN_COMMIT_WAIT_S = 10.0
# A delivery that failed after librdkafka's own retries (message.timeout.ms: the topic is
# missing, not authorised, or its brokers are gone) is produced again after 1, 2, 4 ... 60 s.
# Its offset stays unfinished meanwhile, so nothing is committed past it, and the records held
# behind it fill the backpressure watermark, which pauses consumption: the worker waits for
# the topic instead of exiting into a restart loop.
RETRY_FIRST_S = 1.0
# The topic refused this record as it is (too large; no key for a compacted topic): retrying
# it cannot help, a smaller stand-in (a by-reference dead letter, always keyed) can.
REFUSED_AS_IS = frozenset({ck.KafkaError.MSG_SIZE_TOO_LARGE, ck.KafkaError.INVALID_RECORD})
RETRY_MAX_S = 60.0


class _Sent:
    """The records of one emit() in flight. librdkafka reports each record to this object;
    the last report queues it for :meth:`AtLeastOnce._settle`. A report names the record, not
    the output, so the outputs of failed reports are found through
    :func:`worker.loop.output.by_record` (:meth:`failures`)."""

    __slots__ = ("failed", "left", "outs", "owner", "produced_at")

    def __init__(self, owner: AtLeastOnce, outs: list[Output], produced_at: float) -> None:
        self.owner, self.outs, self.produced_at = owner, outs, produced_at
        self.left = len(outs)
        self.failed: list[tuple[ck.KafkaError, ck.Message]] = []

    def __call__(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        if err is None:
            self.owner._acked = True  # readiness: the broker is taking records
            if self.owner._failing:
                self.owner._failing.pop(msg.topic() or "", None)
        else:
            self.failed.append((err, msg))
        self.left -= 1
        if not self.left:
            self.owner._settled.append(self)

    def not_sent(self, n: int) -> None:
        """The batch's last ``n`` records were never produced (emit() raised): they will not
        report, and their offsets must stay open."""
        del self.outs[len(self.outs) - n:]
        self.left -= n
        if not self.left:
            self.owner._settled.append(self)

    def failures(self) -> tuple[list[tuple[Output, ck.KafkaError]], list[ck.Message]]:
        """The outputs of the failed reports (every output a report may stand for: sent
        again, a repeat is allowed, a loss is not), and the reports that match none. Indexed:
        a topic that went away fails every record of every batch."""
        index = by_record(self.outs)
        found: dict[int, tuple[Output, ck.KafkaError]] = {}
        unmatched: list[ck.Message] = []
        for err, msg in self.failed:
            same = index.get(reported(msg))
            if not same:
                unmatched.append(msg)
                continue
            for o in same:
                found.setdefault(id(o), (o, err))
        return list(found.values()), unmatched


class AtLeastOnce:
    def __init__(self, cfg: WorkerConfig, consumer: Consumer, hops: HopTimes | None = None,
                 outputs: OutputBuilder | None = None) -> None:
        self.cfg, self._consumer, self._outputs = cfg, consumer, outputs
        self._hops = hops or HopTimes()
        self._producer = Producer(producer_settings(cfg))
        self._tracker = OffsetTracker()
        # Commit metadata: the crash-loop breaker's attempt counts (worker/loop/poison.py).
        self.marks = CommitMarks(marker(1) if cfg.processing.poison_max_attempts else "")
        self.fatal: BaseException | None = None
        self.transactional_id: str | None = None
        # Never called: the consumer commits, and its statistics see its commits.
        self.on_committed: Callable[[dict[TopicPartitionKey, int]], None] | None = None
        self.on_wait: Callable[[], None] | None = None  # (no call here blocks past its budget)
        self._last_commit = time.monotonic()
        self._commit_sent: float | None = None  # when the unanswered async commit was sent
        self._unanswered = 0  # async commits sent and not yet reported
        self._closing = False  # drained: the rebalance in close() need not commit again
        self._in_flight = 0  # produced, delivery not reported yet
        self._settled: deque[_Sent] = deque()  # emit() batches whose every record reported
        self._acked = False  # a record was acknowledged since the last tick
        self._progress_at = time.monotonic()  # last delivery report, or first produce after idle
        self._again: list[Output] = []  # DLQ records refused as too large, by reference
        self._retries: list[tuple[float, int, Output]] = []  # (due, sequence, output): a heap
        self._retry_seq = 0
        self.retries = 0
        self._failing: dict[str, str] = {}  # output topic -> its last error, until one is acked

    def start(self) -> None:
        self._producer.open()

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> None:
        self._tracker.begin(topic, partition, offset, size)

    def emit(self, outs: list[Output]) -> None:
        if not outs:
            return
        now = time.monotonic()
        if not self._in_flight:
            self._progress_at = now
        self._in_flight += len(outs)
        sent = _Sent(self, list(outs), now)
        raw = self._producer.client.produce
        for i, out in enumerate(sent.outs):
            try:  # librdkafka's own call: the wrapper's frame costs per record
                raw(out.topic, value=out.value, key=out.key, headers=out.headers,
                    on_delivery=sent)
            except (BufferError, ck.KafkaException):
                if not self._produce_slow(sent, i, out):
                    break

    def _produce_slow(self, sent: _Sent, i: int, out: Output) -> bool:
        """Record ``i`` of the batch through the wrapper (waits for room in the queue, wraps
        errors); one refused before sending (over the producer's limit) is replaced by its
        stand-in. If it cannot be produced, neither are the ones after it: they leave the
        batch, their offsets stay open, and they are produced again after a backoff, like a
        failed delivery (the client refuses a topic it knows to be missing or not authorised
        before sending: a deleted results topic, a revoked WRITE). False when the rest of
        the batch left it."""
        produce = self._producer.produce
        try:
            try:
                produce(out.topic, key=out.key, value=out.value, headers=out.headers,
                        on_delivery=sent)
                return True
            except KafkaIOError as exc:
                small = self._smaller(out, exc.code, str(exc))
                if small is None:
                    raise
            produce(small.topic, key=small.key, value=small.value, headers=small.headers,
                    on_delivery=sent)
            sent.outs[i] = small
            return True
        except KafkaIOError as exc:
            rest = sent.outs[i:]
            self._in_flight -= len(rest)
            sent.not_sent(len(rest))
            if exc.code == ck.KafkaError._FATAL:  # the idempotent producer cannot go on
                raise
            now = time.monotonic()
            for o in rest:
                self._retry_later(o, str(exc), now)
            return False
        except BaseException:
            self._in_flight -= len(sent.outs) - i
            sent.not_sent(len(sent.outs) - i)
            raise

    def _smaller(self, out: Output, code: int | None, why: str) -> Output | None:
        """The stand-in for an output its topic refused as it is (loop/output.stand_in); a
        result only when it was too large (results always have a key)."""
        if code not in REFUSED_AS_IS or (code != ck.KafkaError.MSG_SIZE_TOO_LARGE
                                          and out.rejected is None):
            return None
        return stand_in(out, self.cfg.kafka.client_id, self._outputs, why)

    def _settle(self) -> None:
        """Finish the offsets of every batch whose records all reported; failed records are
        sent again (smaller, or after a backoff) and keep their offsets open."""
        now = time.monotonic()
        if self._acked:
            self._acked = False
            self._progress_at = now
        finish_many = self._tracker.finish_many
        while self._settled:  # one at a time: a raise below leaves the rest queued
            sent = self._settled.popleft()
            self._in_flight -= len(sent.outs)
            failures, unmatched = sent.failures() if sent.failed else ([], [])
            if unmatched:  # which output failed is unknown: finish none of the batch
                self.fatal = DeliveryFailed(
                    f"{len(unmatched)} failed deliveries match no output of their batch "
                    f"(first: {unmatched[0].topic()} key={unmatched[0].key()!r})")
                continue
            if failures:
                failed = {id(o) for o, _ in failures}
                refs = [o.ref for o in sent.outs if id(o) not in failed]
            else:
                refs = [o.ref for o in sent.outs]
            finish_many(refs)
            if refs:
                self._hops.add_many("delivery", [now - sent.produced_at] * len(refs))
            for out, err in failures:
                self._failed(out, err, now)

    def _failed(self, out: Output, err: ck.KafkaError, now: float) -> None:
        ref = out.ref
        smaller = self._smaller(out, err.code(), err.str())
        if smaller is not None:
            # The topic takes smaller records than the jobs topic: send what fits instead (at
            # the next tick: never produce from inside a delivery report).
            self._again.append(smaller)
            return
        if err.fatal():  # the idempotent producer cannot go on: stop, commit nothing past it
            self.fatal = DeliveryFailed(
                f"delivery for {ref.topic}[{ref.partition}]@{ref.offset} failed: {err.str()}")
            return
        self._retry_later(out, err.str(), now)

    def _retry_later(self, out: Output, error: str, now: float) -> None:
        """Produce ``out`` again after a growing backoff; its offset stays open meanwhile."""
        ref = out.ref
        out.attempt += 1
        wait_s = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (out.attempt - 1))
        self._failing[out.topic] = error
        log.warning("delivery_failed_retrying", topic=out.topic, kind=out.kind,
                    source=f"{ref.topic}[{ref.partition}]@{ref.offset}", error=error,
                    attempt=out.attempt, retry_in_s=wait_s)
        self._retry_seq += 1
        self._in_flight += 1  # still waiting for the broker: readiness counts it
        heapq.heappush(self._retries, (now + wait_s, self._retry_seq, out))

    def pending(self) -> int:
        return self._tracker.pending()

    def held_bytes(self) -> int:
        return self._tracker.held_bytes()

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        return self._tracker.uncommitted()

    def unacked_for_s(self) -> float | None:
        return time.monotonic() - self._progress_at if self._in_flight > 0 else None

    def blocked(self) -> str | None:
        # Not only while retries wait in the heap: a due retry goes back in flight, where a
        # topic that is still gone holds it until it fails again (message.timeout.ms), and
        # readiness must keep naming the topic meanwhile.
        if not self._failing or not (self._retries or self._in_flight):
            return None
        # Every failing topic (a results topic and a DLQ topic can be gone at once), the first
        # to fail first, bounded so the reason stays a line.
        named = [f"output topic {topic} refuses records, retrying: {error[:200]}"
                 for topic, error in list(self._failing.items())[:MAX_TOPICS_NAMED]]
        more = len(self._failing) - len(named)
        return "; ".join(named) + (f"; and {more} more output topics" if more else "")

    def tick(self, *, force: bool = False) -> None:
        self._producer.poll(0)
        self._settle()
        if self._again:
            again, self._again = self._again, []
            self.emit(again)
        if self._retries and self._retries[0][0] <= time.monotonic():
            self._retry_due()
        self._commit(force=force)

    def _retry_due(self) -> None:
        due: list[Output] = []
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            due.append(heapq.heappop(self._retries)[2])
        self._in_flight -= len(due)  # emit() counts them again
        self.retries += len(due)
        self.emit(due)

    def _commit(self, *, force: bool, only: Iterable[TopicPartitionKey] | None = None,
                release: bool = False) -> None:
        now = time.monotonic()
        if not force and (now - self._last_commit) * 1e3 < self.cfg.commit.interval_ms:
            return
        self._last_commit = now
        if not force and self._commit_sent is not None \
                and now - self._commit_sent < ASYNC_COMMIT_STALE_S:
            return  # the previous commit is still unanswered: don't queue more behind it
        positions = self._releasing(only) if release else self._tracker.committable(only)
        if not positions:
            return
        offsets = self.marks.offsets(positions, set(positions) if release else frozenset())
        try:
            if not force:
                self._consumer.commit_async(offsets)
                self._commit_sent = now  # on_commit marks them once accepted
                self._unanswered += 1
                return
            self._consumer.commit(offsets)
        except KafkaIOError as exc:
            # Usually a rebalance in progress; the same positions are retried next interval.
            log.warning("commit_failed", error=str(exc), recoverable=exc.recoverable)
            return
        self._tracker.mark_committed(positions)
        log.debug("committed", offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})

    def on_commit(self, err: ck.KafkaError | None, partitions: list[ck.TopicPartition]
                  ) -> None:
        """Marks accepted positions, so the tracker only offers positions that moved on since
        (a failure is retried at the next interval)."""
        self._commit_sent = None
        self._unanswered = max(0, self._unanswered - 1)
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

    def _releasing(self, keys: Iterable[TopicPartitionKey] | None = None
                   ) -> dict[TopicPartitionKey, int]:
        """Positions to commit when giving partitions up cleanly: the ones that moved, and,
        while commits carry marks, the unmoved ones too, whose mark must go (a clean handover
        is no crash: see worker/loop/commit/marks.py)."""
        positions = self._tracker.committable(keys)
        if self.marks.default or self.marks.sticky:
            for key in self._tracker.partitions() if keys is None else keys:
                pos = self._tracker.position(key)
                if pos is not None:
                    positions.setdefault(key, pos)
        return positions

    def track(self, key: TopicPartitionKey, committed: int) -> None:
        self._tracker.start(key, committed)

    def position(self, key: TopicPartitionKey) -> int | None:
        return self._tracker.position(key)

    def commit_marks(self, keys: Iterable[TopicPartitionKey]) -> bool:
        """Commit these partitions' positions with their marks now, synchronously (the
        breaker's mark must be in Kafka before the record it counts is processed); False if
        the coordinator did not take it."""
        positions = {k: pos for k in keys if (pos := self._tracker.position(k)) is not None}
        if not positions:
            return True
        try:
            self._consumer.commit(self.marks.offsets(positions))
        except KafkaIOError as exc:
            log.warning("commit_failed", error=str(exc), recoverable=exc.recoverable,
                        marks=True)
            return False
        self._tracker.mark_committed(positions)
        return True

    def revoked(self, keys: set[TopicPartitionKey]) -> None:
        self._flush()
        if self._closing:
            return  # drain() committed (or gave up on a coordinator that does not answer)
        self._commit(force=True, only=keys, release=True)

    def lost(self, keys: set[TopicPartitionKey]) -> None:
        """Never commit lost partitions; their late outcomes are discarded."""

    def forget(self, keys: set[TopicPartitionKey]) -> None:
        self._tracker.drop(keys)
        if self._retries:  # their new owner answers them
            kept = [r for r in self._retries if (r[2].ref.topic, r[2].ref.partition) not in keys]
            self._in_flight -= len(self._retries) - len(kept)
            heapq.heapify(kept)
            self._retries = kept
            # A topic no retry waits for any more is no longer known to refuse (it is again
            # at its next failure); otherwise readiness could stay off for a topic no record
            # is sent to.
            waiting = {r[2].topic for r in kept}
            self._failing = {t: e for t, e in self._failing.items() if t in waiting}

    def _flush(self) -> int:
        undelivered = self._producer.flush(self.cfg.commit.drain_timeout_s)
        self._settle()
        if self._again:  # refused as too large during the flush: send them by reference
            again, self._again = self._again, []
            self.emit(again)
            undelivered = self._producer.flush(self.cfg.commit.drain_timeout_s)
            self._settle()
        return undelivered

    def drain(self, *, failed: bool) -> None:
        undelivered = self._flush()
        if undelivered:
            log.error("undelivered_at_shutdown", count=undelivered)
        # Only delivered records count as finished: committing them is safe even after a
        # failure.
        self._commit_bounded(SHUTDOWN_COMMIT_WAIT_S)
        self._closing = True

    def _commit_bounded(self, wait_s: float) -> None:
        """An async commit of every advanced position, and callbacks served until it (and any
        earlier one) is answered or ``wait_s`` passed."""
        positions = self._releasing()
        if positions:
            try:
                self._consumer.commit_async(self.marks.offsets(positions, set(positions)))
            except KafkaIOError as exc:
                log.warning("commit_failed", error=str(exc), recoverable=exc.recoverable)
                return
            self._unanswered += 1
        deadline = time.monotonic() + wait_s
        while self._unanswered and time.monotonic() < deadline:
            self._consumer.serve(0.1)
        if self._unanswered:
            log.warning("commit_unanswered_at_shutdown", waited_s=wait_s,
                        offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})

    def close(self, *, failed: bool) -> None:
        self._producer.close(self.cfg.commit.drain_timeout_s)

    def request_abort(self, reason: str) -> None:
        """No transaction to abort under at-least-once."""

    def totals(self) -> dict[str, int]:
        return {"rewinds": 0, "delivery_retries": self.retries}
