"""Exactly-once: outputs and consumer positions commit together in one Kafka transaction.

Outputs enter the open transaction strictly in offset order per partition
(:class:`OrderedRelease`); a record is finished once its output is in. Every
``commit.interval_ms`` (and on revoke and at shutdown) the transaction commits with the
positions, the lowest unfinished offset per partition (:class:`Transactions` holds the
protocol and the error classes). An aborted transaction (a failed delivery, an abortable error,
lost partitions, a re-delivered offset, or a drill) rewinds every partition to its last
committed position and drops the work in progress, so each output is committed exactly once.

A cluster that stops answering (a broker or coordinator outage) is waited out, never exited:
when the rewind cannot read the committed positions, or a reset's new producer cannot
register its transactional.id, every assigned partition is paused, readiness says why
(:meth:`ExactlyOnce.blocked`), and the step tries again in short attempts with a growing
interval, so the loop keeps stepping (liveness) and a restart, which would meet the same
outage, is never needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import confluent_kafka as ck
import structlog

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError, TransactionError
from worker.kafka import Consumer, Producer, transactional_id, transactional_producer_settings
from worker.kafka.topics import transactional_id_refused
from worker.loop.commit.at_least_once import REFUSED_AS_IS
from worker.loop.commit.base import DropWork
from worker.loop.commit.marks import CommitMarks, marker
from worker.loop.commit.offsets import OffsetTracker
from worker.loop.commit.ordered import OrderedRelease
from worker.loop.commit.transactions import Transactions
from worker.loop.group.assignment import Assignment
from worker.loop.hops import HopTimes
from worker.loop.output import Output, OutputBuilder, by_record, reported, stand_in
from worker.wire.records import SourceRef, TopicPartitionKey

log = structlog.get_logger("worker")

_PURGED = frozenset({ck.KafkaError._PURGE_QUEUE, ck.KafkaError._PURGE_INFLIGHT})
# One attempt's wait for the coordinator's committed positions at a rewind: short, so that an
# outage is waited out in steps that keep the loop (and its liveness heartbeat) going.
COMMITTED_TIMEOUT_S = 5.0
# Between attempts while the cluster does not answer: 0.5, 1, 2, 4, 5, 5 ... s. The cap keeps
# the first result after the cluster's return within a few seconds.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
# Transactions that keep failing (a results topic deleted, a broker refusing writes): after
# the second abort in a row the rewound partitions wait 1, 2, 4 ... 60 s before consuming
# again, instead of redoing the same batch as fast as it fails.
HOLD_FIRST_S = 1.0
HOLD_MAX_S = 60.0


class _Reports:
    """The delivery reports of one emit()'s records, all in one transaction. A success needs
    nothing (the transaction's commit is what makes the record count), so one callable serves
    them all instead of a partial per record; a failure is matched to its outputs by topic,
    key and value."""

    __slots__ = ("acked", "outs", "owner", "sequence")

    def __init__(self, owner: ExactlyOnce, sequence: int) -> None:
        self.owner, self.sequence = owner, sequence
        self.outs: list[Output] = []
        self.acked = 0  # (a count, not which: only a commit that times out asks, see topics)

    def __call__(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        if err is not None:
            self.owner._delivery_failed(self, err, msg)
        else:
            self.acked += 1

    def unacked_topics(self) -> set[str]:
        """The topics of this emit's records when one of them is still unacknowledged."""
        return {o.topic for o in self.outs} if self.acked < len(self.outs) else set()

    def outputs_of(self, msg: ck.Message) -> list[Output]:
        """Every output the report may stand for (:func:`worker.loop.output.by_record`)."""
        return by_record(self.outs).get(reported(msg), [])


class _Outage:
    """What the committer waits for while the cluster does not answer."""

    __slots__ = ("attempts", "next_at", "since", "what")

    def __init__(self, what: str, now: float) -> None:
        self.what, self.since, self.attempts, self.next_at = what, now, 0, now


class ExactlyOnce:
    def __init__(self, cfg: WorkerConfig, consumer: Consumer, assignment: Assignment,
                 drop_work: DropWork, outputs: OutputBuilder | None = None,
                 hops: HopTimes | None = None) -> None:
        self.cfg, self._consumer, self._assignment = cfg, consumer, assignment
        self._hops = hops or HopTimes()
        # When each output of the open transaction was produced: its delivery hop ends when
        # the transaction commits (a read_committed reader sees it from then on).
        self._produced_at: list[float] = []
        self._outputs = outputs
        self._drop_work = drop_work
        self._producer = Producer(transactional_producer_settings(cfg))
        self._txn = Transactions(self._producer, timeout_ms=cfg.kafka.transaction_timeout_ms)
        self._tracker = OffsetTracker()
        # Commit metadata: the crash-loop breaker's attempt counts (worker/loop/poison.py).
        self.marks = CommitMarks(marker(1) if cfg.processing.poison_max_attempts else "")
        self._release = OrderedRelease(self._tracker)
        self.fatal: BaseException | None = None
        self.transactional_id: str | None = transactional_id(cfg)
        self.on_committed: Callable[[dict[TopicPartitionKey, int]], None] | None = None
        self._abort_request: str | None = None
        self._rewind_needed = False
        self._last_commit = time.monotonic()
        self.rewinds = 0
        self._aborts_in_a_row = 0
        self._failing_since: float | None = None
        self._hold_until: float | None = None  # rewound partitions paused until then
        # Sources whose DLQ record a transaction failed on as too large: sent by reference
        # when the rewind brings them back.
        self._too_large: set[SourceRef] = set()
        self._outage: _Outage | None = None
        self._last_abort: str | None = None
        # The open transaction's emits: a commit that times out names the topics its
        # records still wait for (a deleted results topic holds them in librdkafka).
        self._open_reports: list[_Reports] = []

    def start(self) -> None:
        self._producer.open()
        # Fences an earlier incarnation of this instance and aborts its open transaction, so
        # its uncommitted outputs never become visible and its offsets are released.
        try:
            self._txn.init()
        except TransactionError as exc:
            # No broker reports authorized operations on a transactional id, so the start-up
            # check (worker.kafka.topics) leaves WRITE on it to this call, run before the
            # group is joined; its refusal names the id and operation as the check's do.
            refused = transactional_id_refused(exc, transactional_id(self.cfg))
            if refused is None:
                raise
            # librdkafka makes that refusal fatal to the client: start-up waits for the
            # grant (worker.loop.startup) and calls start() again, on a new client.
            self._producer.abandon()
            raise refused from exc

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> None:
        if self._tracker.begin(topic, partition, offset, size):
            # The consumer went backwards on its own (not after our seek): outputs of these
            # offsets may already be in the open transaction. Abort and rewind.
            self.request_abort(f"{topic}[{partition}] re-delivered offset {offset}")

    def emit(self, outs: list[Output]) -> None:
        if self._outage is not None or self._txn.needs_init:
            # No transaction can open: these records are redone after the rewind that ends
            # the wait (their partitions are paused and rewound then).
            if outs:
                self._rewind_needed = True
            return
        now = time.monotonic()
        reports = _Reports(self, self._txn.sequence)
        for out in outs:
            if out.ref in self._too_large:
                out = self._smaller(out)
            for ready in self._release.complete(out):
                if self._txn.failed is not None:
                    break  # doomed: the rewind that follows redoes these records
                try:
                    reports.outs.append(ready)
                    self._txn.produce(ready, reports)
                    self._produced_at.append(now)
                except TransactionError as exc:
                    if exc.fatal:
                        raise
                    self._note_too_large(ready, exc.code)
                    break  # abortable: marked failed; tick() aborts and rewinds
        if reports.outs:
            self._open_reports.append(reports)

    def _smaller(self, out: Output) -> Output:
        """A record its topic refused before the rewind, redone as its stand-in
        (loop/output.stand_in). Its source stays marked until a transaction with the stand-in
        commits (:meth:`_settle_too_large`): when this transaction aborts too (another record
        refused), the next rewind must not redo it at full size, or the aborts can go round
        for good, each one learning some records and forgetting others (seen in CI)."""
        why = "refused by its topic before the rewind"
        return stand_in(out, self.cfg.kafka.client_id, self._outputs, why) or out

    def _note_too_large(self, out: Output, code: int | None) -> None:
        """A DLQ record or result refused as too large: the transaction aborts and the rewind
        redoes the record, which then goes by reference or as the job's dead letter (instead
        of failing the same way forever)."""
        if code not in REFUSED_AS_IS or (code != ck.KafkaError.MSG_SIZE_TOO_LARGE
                                          and out.rejected is None):
            return
        # A refused batch leaves a gap in the idempotent producer's sequence numbers, so
        # later transactions on the client fail (OUT_OF_ORDER_SEQUENCE_NUMBER): abort by reset.
        self._txn.fail("a record too large for its topic", timed_out=True)
        if out.rejected is not None or out.source is not None:
            self._too_large.add(out.ref)
            log.warning("transaction_record_refused", topic=out.topic, kind=out.kind,
                        partition=out.ref.partition, offset=out.ref.offset,
                        bytes=len(out.value or b""), code=code)

    def _delivery_failed(self, reports: _Reports, err: ck.KafkaError, msg: ck.Message
                         ) -> None:
        txn = self._txn
        if reports.sequence != txn.sequence or err.code() in _PURGED:
            return  # a purged record of a transaction being (or already) aborted
        # Only a record refused as too large needs its output (to go smaller after the
        # rewind); any other failure just fails the transaction.
        outs = reports.outputs_of(msg) if err.code() in REFUSED_AS_IS else []
        out = outs[0] if outs else None
        if out is not None:
            self._note_too_large(out, err.code())
        log.warning("transactional_delivery_failed", error=err.str(), topic=msg.topic(),
                    partition=out.ref.partition if out else None,
                    offset=out.ref.offset if out else None, kind=out.kind if out else None,
                    code=err.code())
        txn.fail(f"delivery to {msg.topic()} failed: {err.str()}",
                 timed_out=err.code() == ck.KafkaError._MSG_TIMED_OUT)

    def pending(self) -> int:
        return self._tracker.pending()

    def held_bytes(self) -> int:
        return self._tracker.held_bytes()

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        return self._tracker.uncommitted()

    def tick(self, *, force: bool = False) -> None:
        self._producer.poll(0)
        if self._hold_until is not None and time.monotonic() >= self._hold_until \
                and self._outage is None:
            self._hold_until = None
            self._consumer.resume(self._consumer.assignment())
            log.info("rewind_hold_over", aborts_in_a_row=self._aborts_in_a_row)
        self._settle()
        now = time.monotonic()
        if force or (now - self._last_commit) * 1e3 >= self.cfg.commit.interval_ms:
            self._last_commit = now
            self._commit()
            self._settle()

    def _settle(self) -> None:
        """Abort a failed or abort-requested transaction, then rewind (main loop only)."""
        if self._outage is not None and time.monotonic() < self._outage.next_at:
            return
        if self._txn.needs_init:
            try:
                self._txn.reinit()
            except TransactionError as exc:
                if exc.fatal:
                    raise
                self._wait_out("the transaction coordinator (init_transactions)", exc)
                return
        reason = self._abort_request or self._txn.failed
        if reason is not None:
            self._abort_request = None
            self._abort(reason)
            if self._txn.needs_init:
                return  # waited out above at the next attempt
        if self._rewind_needed:
            self._rewind()

    def _wait_out(self, what: str, exc: BaseException) -> None:
        """The cluster did not answer: pause every assigned partition and try again later."""
        now = time.monotonic()
        if self._outage is None or self._outage.what != what:
            self._outage = _Outage(what, self._outage.since if self._outage else now)
        o = self._outage
        o.attempts += 1
        o.next_at = now + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (o.attempts - 1))
        self._rewind_needed = True
        self._consumer.pause(self._consumer.assignment())
        log.warning("kafka_unavailable", waiting_for=what, attempts=o.attempts,
                    waited_s=round(now - o.since, 1), error=str(exc)[:300])

    def _waited_out(self) -> None:
        if self._outage is not None:
            log.warning("kafka_available_again", waited_for=self._outage.what,
                        attempts=self._outage.attempts,
                        waited_s=round(time.monotonic() - self._outage.since, 1))
            self._outage = None
            if self._hold_until is None:
                self._consumer.resume(self._consumer.assignment())

    def blocked(self) -> str | None:
        """Why outputs cannot be committed now (readiness shows it), or None."""
        o = self._outage
        if o is None:
            if self._aborts_in_a_row >= 2 and self._last_abort is not None:
                return (f"transactions keep failing ({self._aborts_in_a_row} aborts in a row): "
                        f"{self._last_abort[:200]}")
            return None
        return (f"waiting for Kafka: {o.what} did not answer "
                f"({o.attempts} attempts in {time.monotonic() - o.since:.0f} s)")

    def _abort(self, reason: str) -> None:
        """Abort the open transaction now; the rewind follows in the main loop (never inside a
        rebalance callback: consume() may already hold records fetched before the seek)."""
        if not self._txn.open and self._txn.failed is None:
            return  # nothing produced since the last commit: nothing to undo
        log.warning("transaction_abort", reason=reason[:300], records=self._txn.records,
                    age_s=round(self._txn.age_s, 3))
        try:
            self._txn.abort()
            unregistered: TransactionError | None = None
        except TransactionError as exc:
            if exc.fatal:
                raise
            unregistered = exc  # the reset's new client could not register: wait it out
        # Redone after the rewind: their hop starts again then. (A commit that timed out but
        # did land on the coordinator is not redone: its outputs go without a sample.)
        self._produced_at.clear()
        self._open_reports.clear()
        self._rewind_needed = True
        self._aborts_in_a_row += 1
        self._last_abort = reason
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if unregistered is not None:
            self._wait_out("the transaction coordinator (init_transactions)", unregistered)

    def _rewind(self) -> None:
        """Seek every partition back to its last committed position, as the group coordinator
        has it; drop work in progress.

        Not the positions cached here: a commit_transaction that timed out may still have
        committed on the coordinator, and rewinding to the older cached positions would publish
        those records again. A coordinator that cannot answer is never guessed at: the
        partitions stay paused and the rewind is tried again (:meth:`_wait_out`)."""
        self._rewind_needed = False
        self._drop_work(set(self._tracker.partitions()) | self._assignment.owned)
        self._release.clear()
        keys = self._tracker.partitions()
        try:
            asked = self._consumer.committed([ck.TopicPartition(t, p) for t, p in keys],
                                             timeout=COMMITTED_TIMEOUT_S) if keys else []
        except KafkaIOError as exc:
            # Bump now: answers of work begun before the wait are stale whatever comes next.
            self._assignment.bump(keys)
            self._wait_out("the group coordinator (committed positions)", exc)
            return
        coordinator = {(tp.topic, tp.partition): tp.offset for tp in asked if tp.offset >= 0}
        if self.on_committed is not None and coordinator:  # (may be past the last commit seen)
            self.on_committed(coordinator)
        positions: dict[str, int] = {}
        for key in keys:
            target = self._tracker.rewind(key, coordinator.get(key))
            self._assignment.bump([key])
            if target is not None and key in self._assignment:
                # A failed seek would let the consumer run on past the aborted range: fatal
                # (the restart resumes from the committed positions).
                self._consumer.seek(ck.TopicPartition(key[0], key[1], target))
                positions[f"{key[0]}[{key[1]}]"] = target
        self.rewinds += 1
        log.warning("rewound", positions=positions)
        self._waited_out()
        if self._aborts_in_a_row >= 2 and self._hold_until is None:
            hold = min(HOLD_MAX_S, HOLD_FIRST_S * 2 ** (self._aborts_in_a_row - 2))
            self._consumer.pause(self._consumer.assignment())
            self._hold_until = time.monotonic() + hold
            log.warning("rewind_hold", aborts_in_a_row=self._aborts_in_a_row, hold_s=hold)

    def _commit(self, *, release: Iterable[TopicPartitionKey] = (),
                marks: Iterable[TopicPartitionKey] = ()) -> bool:
        """Commit the open transaction with the positions that moved. ``marks``: partitions
        whose position goes in with its mark even when unmoved, in an otherwise empty
        transaction if none is open; ``release``: the same, given up cleanly (no mark).
        False if it did not commit."""
        txn = self._txn
        reason = self._abort_request or txn.failed
        if reason is not None:
            self._abort_request = None
            self._abort(reason)
            return False
        released = set(release) if self.marks.default or self.marks.sticky else set()
        extra = {key: pos for key in (*released, *marks)
                 if (pos := self._tracker.position(key)) is not None}
        if not txn.open:
            # (Nothing produced since the last commit: only marks to write, or nothing.)
            if not extra or self._outage is not None or txn.needs_init:
                return not extra
            txn.begin()
        positions = {**extra, **self._tracker.committable()}
        offsets = self.marks.offsets(positions, released)
        if txn.age_s * 1e3 > self.cfg.kafka.transaction_timeout_ms / 2:
            log.warning("transaction_long", age_s=round(txn.age_s, 1),
                        transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)
        records = txn.records
        try:
            txn.commit(offsets, self._consumer.group_metadata())
        except TransactionError as exc:
            if exc.fatal:
                raise
            # The topics first: readiness shows the reason's first 200 characters.
            waiting = sorted({t for r in self._open_reports for t in r.unacked_topics()})
            self._abort((f"records to {', '.join(waiting)} unacknowledged; "
                         if waiting else "") + f"commit failed: {exc}")
            return False
        self._open_reports.clear()
        self._tracker.mark_committed(positions)
        self._settle_too_large(positions)
        done = time.monotonic()
        self._hops.add_many("delivery", [done - t for t in self._produced_at])
        self._produced_at.clear()
        if self.on_committed is not None:
            self.on_committed(positions)
        self._aborts_in_a_row, self._failing_since = 0, None
        log.debug("transaction_committed", records=records,
                  offsets={f"{t}[{p}]": o for (t, p), o in positions.items()})
        return True

    def track(self, key: TopicPartitionKey, committed: int) -> None:
        self._tracker.start(key, committed)

    def position(self, key: TopicPartitionKey) -> int | None:
        return self._tracker.position(key)

    def commit_marks(self, keys: Iterable[TopicPartitionKey]) -> bool:
        """Commit the open transaction now (an empty one if none is open) with these
        partitions' positions and marks: the breaker's mark must be in Kafka before the record
        it counts is processed. False if it did not commit (tried again by the caller)."""
        if self._outage is not None or self._txn.needs_init or self._rewind_needed:
            return False
        try:
            return self._commit(marks=list(keys))
        except TransactionError as exc:
            if exc.fatal:
                raise
            self._abort(f"commit failed: {exc}")
            return False

    def _settle_too_large(self, positions: dict[TopicPartitionKey, int]) -> None:
        """Forget the marks of sources now committed (below their partition's position)."""
        if self._too_large:
            self._too_large = {r for r in self._too_large
                               if r.offset >= positions.get((r.topic, r.partition), -1)}

    def on_commit(self, err: ck.KafkaError | None, partitions: list[ck.TopicPartition]
                  ) -> None:
        """Offsets commit inside transactions: the consumer never commits on its own."""

    def revoked(self, keys: set[TopicPartitionKey]) -> None:
        # One transaction covers every partition: it commits with all their positions (if
        # that fails it is aborted and the new owner redoes the work).
        self._commit(release=keys)

    def lost(self, keys: set[TopicPartitionKey]) -> None:
        if self._txn.open:
            # Another member may own them already and redo their jobs: the open transaction
            # (which may hold their outputs) must never commit.
            self._abort("partitions lost")

    def forget(self, keys: set[TopicPartitionKey]) -> None:
        self._tracker.drop(keys)
        self._release.drop(keys)
        self._too_large = {r for r in self._too_large if (r.topic, r.partition) not in keys}

    def drain(self, *, failed: bool) -> None:
        if not failed:
            # Commits the last transaction (or aborts a failed one: its work is redone by the
            # partitions' next owner).
            self._commit(release=self._tracker.partitions())

    @property
    def on_wait(self) -> Callable[[], None] | None:
        """Called while a transactional call blocks (the loop's liveness heartbeat)."""
        return self._txn.on_wait

    @on_wait.setter
    def on_wait(self, beat: Callable[[], None] | None) -> None:
        self._txn.on_wait = beat

    def close(self, *, failed: bool) -> None:
        self._txn.close()
        if failed:
            # Nothing of a failed transactional producer may be delivered any more (and
            # flushing a fenced one fails inside its delivery callbacks).
            self._producer.abandon()
        else:
            self._producer.close(self.cfg.commit.drain_timeout_s)

    def request_abort(self, reason: str) -> None:
        """Safe from other threads: the next tick aborts the open transaction and rewinds."""
        self._abort_request = reason

    def unacked_for_s(self) -> float | None:
        """Outputs become visible when their transaction commits: the open one's age, or,
        while transactions keep failing, the time since the first of them failed."""
        if self._failing_since is not None and self._aborts_in_a_row >= 2 \
                and self._tracker.pending():
            return time.monotonic() - self._failing_since
        return self._txn.age_s if self._txn.open else None

    def totals(self) -> dict[str, int]:
        t = self._txn
        return {"rewinds": self.rewinds, "txn_commits": t.commits, "txn_aborts": t.aborts,
                "txn_retries": t.retries, "producer_resets": t.resets}
