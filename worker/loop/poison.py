"""The crash-loop breaker: a record that kills the process (a cgroup OOM kill, a crash in a
native decoder, a sticky CUDA error) is dead-lettered after ``processing.poison_max_attempts``
deaths instead of taking down every member the partition moves to, for ever.

Nothing inside a dying process can be trusted to say what killed it, so deaths are counted
where the next owner reads them: in the metadata of the partition's committed offset
(:mod:`worker.loop.commit.marks`), written by a synchronous commit (at-least-once) or inside a
transaction (exactly-once). It survives restarts and follows the partition to another member.

- Every normal commit says ``attempts=1``: a process works from this position. At assignment
  the committed position P and its count k are read (one ``committed()`` call per rebalance);
  a partition with k = 0 gets its ``attempts=1`` mark written before it is handed to the
  consumer, so even a death before the first commit is counted.
- A partition with k >= 1 is *suspect*: a process died while it worked from P. Suspects are
  isolated one at a time, with everything else paused and nothing else in flight: the
  partition takes one record at a time, through the offsets a dead process may have had in
  flight (up to the partition's end, at most ``batch.max_batch_size x
  batch.max_in_flight_batches`` records). Each record taken is charged with this process's
  attempt (the record at P: k + 1; any later one: 2, its own attempt plus the window's first
  death, the only ambiguous one, which may have been its), committed before the task sees it;
  once it is done the next position is committed at rest (1). A death therefore counts
  against exactly the one record in flight, and only while it is in flight: a kill from
  outside while records are fetched, or a process killed again soon after each restart,
  charges nothing new.
- So a record that kills every time is dead-lettered after exactly K deaths wherever it sits
  in the window, while deaths no record causes (a node drained, a kill -9 from outside)
  dead-letter a record only when they hit it K - 1 times in a row while it is alone in
  flight. Past the window the partition is back to normal (``attempts=1``). A culprit past
  the window is found too: its death is counted again from a later position, with a few more
  deaths.
- A suspect read with k >= K is not processed: the record at P is dead-lettered by reference
  with reason ``poison``, and the partition goes on.

A clean handover (revoke, shutdown) commits the position without a mark: rebalances never add
up to a count. Cost in normal operation: nothing per record; per rebalance one
``committed()`` call and one commit; per commit the mark string.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import confluent_kafka as ck
import structlog

from worker.exceptions import KafkaIOError, PoisonRecord, one_line
from worker.loop.commit.marks import attempts_in, marker
from worker.loop.output import Output, OutputBuilder
from worker.tasks.protocol import ConsumedBatch
from worker.wire.dlq import dead_letter_by_reference
from worker.wire.records import SourceRecord, SourceRef, TopicPartitionKey

if TYPE_CHECKING:
    from worker.kafka import Consumer
    from worker.loop.commit.base import Committer

log = structlog.get_logger("worker")

# One assignment's wait for the committed positions and the watermarks (inside the rebalance
# callback: the partitions are not fetched before it returns).
READ_TIMEOUT_S = 10.0
# An isolated partition that gives no record for this long is at its end (its last offsets
# can be transaction markers, which are never delivered): its isolation ends. Long enough for
# the fetch that follows a resume.
IDLE_END_S = 5.0
# Pauses are asserted again this often while isolating: a committer resumes every partition
# after its own wait (exactly-once's outage or hold).
REASSERT_S = 1.0


@dataclasses.dataclass(slots=True)
class _Turn:
    """One suspect partition being isolated."""

    key: TopicPartitionKey
    start: int  # its committed position at assignment
    attempts: int  # deaths counted there (k), before this process's attempt
    end: int  # isolation ends at this offset
    dead_letter: bool  # k reached the limit: the record at ``start`` is dead-lettered
    taken: int | None = None  # offset of its record in flight
    idle_since: float | None = None


class PoisonGuard:
    def __init__(self, max_attempts: int, isolate_max: int, consumer: Consumer,
                 committer: Committer, outputs: OutputBuilder,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_attempts, self.isolate_max = max_attempts, isolate_max
        self._consumer, self._committer, self._outputs = consumer, committer, outputs
        self._clock = clock
        self.active = False  # isolating (or marks owed): steer() runs every step
        self._suspects: dict[TopicPartitionKey, tuple[int, int]] = {}  # -> (position, k)
        self._owed: set[TopicPartitionKey] = set()  # marks to write before they take records
        self._turn: _Turn | None = None
        self._held: SourceRecord | None = None  # taken, its charge not yet in Kafka
        self._paused: set[TopicPartitionKey] = set()
        self._asserted_at = 0.0
        self.dead_lettered = 0
        self.isolated = 0  # partitions isolated, in all

    # -- rebalances (from the consumer's callbacks, on the loop thread) ----------------------
    def assigned(self, partitions: list[ck.TopicPartition]) -> None:
        """Read the new partitions' committed positions and counts, write the marks of the
        ones with none, then assign them (paused while isolating): no record of theirs is
        fetched before their mark is in Kafka. Called from the assign callback, which then
        leaves the assignment to us."""
        fresh: list[TopicPartitionKey] = []
        for key, position, k in self._read(partitions):
            self._committer.track(key, position)
            if k:
                self._suspects[key] = (position, k)
                self._committer.marks.kept[key] = (position, marker(k))
                log.warning("partition_suspect", partition=_name(key), offset=position,
                            attempts=k, max_attempts=self.max_attempts,
                            reason="a process died while working from this offset")
            else:
                fresh.append(key)
        if fresh and not self._committer.commit_marks(fresh):
            self._owed.update(fresh)  # written by steer() before they take records
        self._consumer.incremental_assign(partitions)
        self.active = bool(self._suspects or self._owed or self._turn)
        if self.active:
            self._paused -= {(tp.topic, tp.partition) for tp in partitions}
            self._hold_all()

    def _read(self, partitions: list[ck.TopicPartition]
              ) -> list[tuple[TopicPartitionKey, int, int]]:
        """(partition, committed position, deaths counted there); a partition without a
        commit starts at its low watermark (the consumer's ``auto.offset.reset=earliest``). A
        partition whose position cannot be read is left unguarded until its first commit."""
        try:
            got = self._consumer.committed([ck.TopicPartition(tp.topic, tp.partition)
                                            for tp in partitions], timeout=READ_TIMEOUT_S)
        except KafkaIOError as exc:
            log.warning("poison_guard_unavailable", error=one_line(exc, 300),
                        partitions=[_name((tp.topic, tp.partition)) for tp in partitions])
            return []
        out: list[tuple[TopicPartitionKey, int, int]] = []
        for tp in got:
            key = (tp.topic, tp.partition)
            position = tp.offset
            if tp.error is not None:  # (never guessed: a mark would commit the guess)
                log.warning("poison_guard_unavailable", error=str(tp.error)[:300],
                            partitions=[_name(key)])
                continue
            if position < 0:
                try:
                    position = self._consumer.watermarks(ck.TopicPartition(*key),
                                                         READ_TIMEOUT_S)[0]
                except KafkaIOError as exc:
                    log.warning("poison_guard_unavailable", error=one_line(exc, 300),
                                partitions=[_name(key)])
                    continue
            out.append((key, position, attempts_in(tp.metadata)))
        return out

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Revoked or lost (after the committer released them, or not at all)."""
        keys = set(keys)
        for key in keys:
            self._suspects.pop(key, None)
            self._committer.marks.sticky.pop(key, None)
            self._committer.marks.kept.pop(key, None)
        self._owed -= keys
        self._paused -= keys
        if self._turn is not None and self._turn.key in keys:
            self._turn = None
        if self._held is not None and (self._held.topic, self._held.partition) in keys:
            self._held = None
        self.active = bool(self._suspects or self._owed or self._turn)

    # -- every step while active -----------------------------------------------------------
    def steer(self, pending: int) -> bool:
        """Before the step's consume: write the marks owed, pause what must not run, move the
        isolation on. True: take one record now; False: take none (the step waits instead).

        The isolated partition stays resumed through its turn and the step takes nothing
        while its record is in flight: a resume per record refetched after a delay (about a
        second a record on the 2-core VM)."""
        turn = self._turn
        if turn is not None and turn.taken is not None and not pending:
            turn.taken = None  # its record is done: commit after each
            if turn.dead_letter:
                self._end(turn, "dead-lettered")
                turn = None
            else:
                # Done without a death: the next record rests at a charge of 1, the window's
                # first, ambiguous death (it may have been this next record's), until it is
                # taken. Charges never pile up across records.
                self._committer.marks.sticky[turn.key] = marker(1)
                self._owed.add(turn.key)
        if self._held is not None:  # taken, its charge not yet written: screen() retries
            return self._hold_all()
        if self._owed:
            if not self._committer.commit_marks(self._owed):
                return self._hold_all()
            self._owed.clear()
        if pending:  # something in flight: nothing else may start
            return self._hold_all() if turn is None else False
        if turn is None:
            if not self._suspects:
                return self._done()
            turn = self._turn = self._next_turn()
            if turn is None:
                return self._hold_all()  # the cluster did not answer: tried again next step
        position = self._committer.position(turn.key)
        now = self._clock()
        if position is not None and position >= turn.end:
            self._end(turn, "window done")
            return self._hold_all()
        if turn.idle_since is None:
            turn.idle_since = now
        elif now - turn.idle_since >= IDLE_END_S:
            self._end(turn, "no more records")
            return self._hold_all()
        self._only(turn.key, now)
        return True

    def _next_turn(self) -> _Turn | None:
        """The suspect with the most deaths first (it reaches the limit soonest)."""
        key, (position, k) = min(self._suspects.items(), key=lambda kv: (-kv[1][1], kv[0]))
        try:
            _, high = self._consumer.watermarks(ck.TopicPartition(*key), READ_TIMEOUT_S)
        except KafkaIOError as exc:
            log.warning("poison_guard_unavailable", error=one_line(exc, 300),
                        partitions=[_name(key)])
            return None
        turn = _Turn(key, position, k, min(high, position + self.isolate_max),
                     dead_letter=k >= self.max_attempts)
        # At rest the partition's commits keep the count it had; screen() raises it when the
        # record is taken.
        self._committer.marks.sticky[key] = marker(k)
        del self._suspects[key]
        self.isolated += 1
        log.warning("partition_isolated", partition=_name(key), offset=position,
                    attempts=k, max_attempts=self.max_attempts, until_offset=turn.end,
                    dead_letter=turn.dead_letter)
        return turn

    def _end(self, turn: _Turn, why: str) -> None:
        """Back to normal: its next commit says attempts=1 again (written at once, so that a
        count carried through the window does not stay behind on an idle partition)."""
        self._committer.marks.sticky.pop(turn.key, None)
        self._turn = None
        if not self._committer.commit_marks([turn.key]):
            self._owed.add(turn.key)  # (tried again at the next step)
        log.info("partition_isolation_over", partition=_name(turn.key), why=why,
                 position=self._committer.position(turn.key))

    def _done(self) -> bool:
        self.active = False
        if self._paused:
            self._consumer.resume([ck.TopicPartition(*k) for k in sorted(self._paused)])
            self._paused.clear()
        log.info("poison_guard_idle", isolated=self.isolated, dead_lettered=self.dead_lettered)
        return True

    def _owned(self) -> set[TopicPartitionKey]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def _hold_all(self) -> bool:
        """Everything paused: the step's consume serves the callbacks and takes nothing."""
        now = self._clock()
        owned = self._owned()
        if owned - self._paused or now - self._asserted_at >= REASSERT_S:
            self._consumer.pause([ck.TopicPartition(*k) for k in sorted(owned)])
            self._paused, self._asserted_at = owned, now
        return True

    def _only(self, key: TopicPartitionKey, now: float) -> None:
        others = self._owned() - {key}
        stale = now - self._asserted_at >= REASSERT_S
        if others - self._paused or stale:
            self._consumer.pause([ck.TopicPartition(*k) for k in sorted(others)])
            self._asserted_at = now
        if key in self._paused:  # (once a turn: a resume refetches, after a delay)
            self._consumer.resume([ck.TopicPartition(*key)])
        self._paused = others

    # -- after the step's consume, while active --------------------------------------------
    def screen(self, batch: ConsumedBatch) -> ConsumedBatch:
        """After the step's consume (empty or not): the isolated record taken is charged with
        this process's attempt, committed before the task sees it, so a death counts only
        against the record that was in flight, never one still being fetched (a kill -9 from
        outside soon after a restart would otherwise charge the same record every time). The
        record to dead-letter leaves the batch and goes to the DLQ by reference instead. A
        charge that cannot be written holds its record back until it is."""
        turn = self._turn
        held, self._held = self._held, None
        records = [held, *batch.records] if held is not None else batch.records
        kept: list[SourceRecord] = []
        for rec in records:
            key = (rec.topic, rec.partition)
            if turn is None or key != turn.key:
                # Fetched before a pause took hold: processed, though not alone.
                log.warning("poison_isolation_overlap", partition=_name(key), offset=rec.offset)
                kept.append(rec)
                continue
            turn.taken, turn.idle_since = rec.offset, None
            if turn.dead_letter and rec.offset == turn.start:
                self._committer.emit([self._dead_letter(rec, turn)])
                continue
            turn.dead_letter = False  # (its offset is gone: nothing left to dead-letter)
            charge = turn.attempts + 1 if rec.offset == turn.start else 2
            self._committer.marks.sticky[key] = marker(charge)
            if not self._committer.commit_marks([key]):
                self._held = rec
                continue
            kept.append(rec)
        if held is None and len(kept) == len(records):
            return batch
        return dataclasses.replace(batch, records=kept)

    def _dead_letter(self, rec: SourceRecord, turn: _Turn) -> Output:
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        error = PoisonRecord(
            f"{where} killed the worker process {turn.attempts} times "
            f"(processing.poison_max_attempts={self.max_attempts}); dead-lettered "
            f"by reference without being processed again")
        out = self._outputs
        small = dead_letter_by_reference(rec, error, out.worker_id)
        out.stats.dead_lettered += 1
        out.stats.dead_by_reason[error.reason] += 1
        self.dead_lettered += 1
        log.error("job_dead_lettered", key=rec.key.decode("utf-8", "replace") if rec.key
                  else None, topic=rec.topic, partition=rec.partition, offset=rec.offset,
                  reason=error.reason, error=str(error))
        return Output(SourceRef(rec.topic, rec.partition, rec.offset), out.topics.dlq,
                      small.key, small.value, small.headers, "dlq", (rec, error))


def _name(key: TopicPartitionKey) -> str:
    return f"{key[0]}[{key[1]}]"
