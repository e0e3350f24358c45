"""worker.loop.poison and worker.loop.commit.marks: the crash-loop breaker's counting.

Deaths are counted in the offset commits' metadata; these tests drive the guard with a
scripted consumer and committer and read what each commit would write. The broker test is
tests/integration/faults/test_poison.py.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest

from worker.config import load_config
from worker.exceptions import ConfigError
from worker.loop.commit import marks as marks_module
from worker.loop.commit.at_least_once import AtLeastOnce
from worker.loop.commit.marks import CommitMarks, attempts_in, marker
from worker.loop.commit.offsets import OffsetTracker
from worker.loop.output import Output, OutputBuilder
from worker.loop.poison import PoisonGuard
from worker.loop.stats import Stats
from worker.tasks.protocol import ConsumedBatch, TaskTopics
from worker.wire.records import SourceRecord, TopicPartitionKey

A, B = ("jobs", 0), ("jobs", 1)
K = 3


class Consumer:
    """The guard's view of the consumer: committed offsets with metadata, watermarks,
    assignment, pause and resume."""

    def __init__(self, committed: dict[TopicPartitionKey, tuple[int, str]],
                 high: int = 100) -> None:
        self.committed_at = committed
        self.high = high
        self.assigned: set[TopicPartitionKey] = set()
        self.paused: set[TopicPartitionKey] = set()

    def committed(self, tps: list[ck.TopicPartition], timeout: float) -> list[ck.TopicPartition]:
        out = []
        for tp in tps:
            offset, meta = self.committed_at.get((tp.topic, tp.partition), (-1001, ""))
            out.append(ck.TopicPartition(tp.topic, tp.partition, offset, metadata=meta))
        return out

    def watermarks(self, tp: ck.TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self.high

    def incremental_assign(self, tps: list[ck.TopicPartition]) -> None:
        self.assigned |= {(tp.topic, tp.partition) for tp in tps}

    def assignment(self) -> list[ck.TopicPartition]:
        return [ck.TopicPartition(*k) for k in sorted(self.assigned)]

    def pause(self, tps: list[ck.TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[ck.TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}


class Committer:
    """Commits land in ``kafka`` (partition -> (offset, metadata)), as the broker keeps them."""

    def __init__(self, consumer: Consumer) -> None:
        self.marks = CommitMarks(marker(1))
        self.tracker = OffsetTracker()
        self.kafka = consumer.committed_at
        self.emitted: list[Output] = []
        self.fail = False

    def track(self, key: TopicPartitionKey, committed: int) -> None:
        self.tracker.start(key, committed)

    def position(self, key: TopicPartitionKey) -> int | None:
        return self.tracker.position(key)

    def commit_marks(self, keys: Any) -> bool:
        if self.fail:
            return False
        positions = {k: p for k in keys if (p := self.tracker.position(k)) is not None}
        for tp in self.marks.offsets(positions):
            self.kafka[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")
        self.tracker.mark_committed(positions)
        return True

    def emit(self, outs: list[Output]) -> None:
        self.emitted.extend(outs)


def _record(key: TopicPartitionKey, offset: int) -> SourceRecord:
    return SourceRecord(key[0], key[1], offset, f"job-{offset}".encode(), b"value", [], None)



class At:
    """A committed (offset, metadata) whose mark records ``attempts``, whichever process wrote
    it (each Process has a writer token of its own)."""

    def __init__(self, offset: int, attempts: int) -> None:
        self.offset, self.attempts = offset, attempts

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple) or len(other) != 2:
            return NotImplemented
        m = re.fullmatch(r"ktw\.attempts=(\d+)(?:;by=[0-9a-f]+)?", other[1])
        return other[0] == self.offset and m is not None and int(m.group(1)) == self.attempts

    def __repr__(self) -> str:
        return f"At({self.offset}, attempts={self.attempts})"

class Process:
    """One worker process's guard over the same 'Kafka' (the committed offsets)."""

    def __init__(self, kafka: dict[TopicPartitionKey, tuple[int, str]], high: int = 100,
                 isolate_max: int = 512) -> None:
        # A new process: its marks carry a token of their own (marks written before it, by
        # the process that died, are foreign to it).
        marks_module.WRITER = secrets.token_hex(6)
        self.consumer = Consumer(kafka, high)
        self.committer = Committer(self.consumer)
        self.stats = Stats()
        outputs = OutputBuilder(TaskTopics("jobs", "results", "dlq"), "w-1", self.stats)
        self.clock = [0.0]
        self.guard = PoisonGuard(K, isolate_max, self.consumer, self.committer,  # type: ignore[arg-type]
                                 outputs, clock=lambda: self.clock[0])

    def assign(self, *keys: TopicPartitionKey) -> None:
        self.guard.assigned([ck.TopicPartition(*k) for k in keys])

    def take(self, key: TopicPartitionKey) -> list[SourceRecord]:
        """The step: steer, then consume one record of the one resumed partition."""
        assert self.guard.steer(self._pending())
        assert key not in self.consumer.paused and self.consumer.paused == \
            self.consumer.assigned - {key}, "the isolated partition runs alone"
        offset = self.committer.tracker.position(key)
        assert offset is not None
        self.committer.tracker.begin(*key, offset)
        batch = ConsumedBatch([_record(key, offset)], {}, 0.0)
        return list(self.guard.screen(batch).records)

    def finish(self, key: TopicPartitionKey, offset: int) -> None:
        self.committer.tracker.finish(*key, offset)

    def _pending(self) -> int:
        return self.committer.tracker.pending()


def test_marks_parse_ours_and_read_anything_else_as_no_attempts() -> None:
    assert attempts_in("ktw.attempts=2") == 2
    assert attempts_in("ktw.attempts=2;by=0123abcd") == 2  # another process's mark
    assert attempts_in(marker(2)) == 1  # this process's own attempt was no death
    for other in (None, "", "ktw.attempts=", "ktw.attempts=x", "some tool's note",
                  "ktw.attempts=2 and more"):
        assert attempts_in(other) == 0


def test_commits_carry_the_mark_sticky_marks_win_released_partitions_carry_none() -> None:
    marks = CommitMarks(marker(1))
    marks.sticky[B] = marker(2)
    got = {(tp.topic, tp.partition): (tp.offset, tp.metadata)
           for tp in marks.offsets({A: 5, B: 7})}
    assert got == {A: At(5, 1), B: At(7, 2)}
    released = marks.offsets({A: 5, B: 7}, {A, B})
    assert [tp.metadata for tp in released] == ["", ""]
    assert [tp.metadata for tp in CommitMarks().offsets({A: 5})] == [""]  # breaker off


def test_assignment_writes_attempt_one_before_the_partition_is_fetched() -> None:
    """Without the mark at assignment a process that dies before its first commit leaves no
    count: the old code restarted into the same record for ever."""
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (7, "")}
    p = Process(kafka)
    p.assign(A, B)
    assert kafka == {A: At(7, 1), B: At(0, 1)}  # B: no commit, low watermark
    assert p.consumer.assigned == {A, B} and not p.guard.active and not p.consumer.paused


def test_a_death_is_counted_and_the_isolated_partition_runs_alone_one_record_at_a_time(
        ) -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (10, marker(1)), B: (3, "")}
    p = Process(kafka, high=13)
    p.assign(A, B)
    assert p.guard.active and p.consumer.paused == {A, B}  # nothing fetched yet
    assert kafka[B] == At(3, 1)
    assert kafka[A] == At(10, 1)  # at rest: nothing charged until the record is taken
    assert p.take(A)  # charged with this attempt before the task sees it
    assert kafka[A] == At(10, 2)
    assert not p.guard.steer(1)  # in flight: no second record
    p.finish(A, 10)
    assert p.guard.steer(0) and kafka[A] == At(11, 1)  # committed after each, at rest
    p.take(A)  # the next record's charge: its attempt and the window's first death
    assert kafka[A] == At(11, 2)
    p.finish(A, 11)
    p.take(A)
    p.finish(A, 12)
    assert p.guard.steer(0)  # the window's end: back to normal, attempt 1 again
    assert kafka[A] == At(13, 1) and not p.committer.marks.sticky
    assert p.guard.steer(0) and not p.guard.active and not p.consumer.paused


def test_k_deaths_at_one_record_dead_letter_it_by_reference() -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (10, marker(1))}
    for attempt in (2, 3):  # two processes die at offset 10, each alone in flight
        p = Process(kafka)
        p.assign(A)
        p.take(A)
        assert kafka[A] == At(10, attempt)
    p = Process(kafka)
    p.assign(A)
    assert p.take(A) == []  # not processed again
    assert kafka[A] == At(10, 3)  # no attempt written: it is not attempted
    (out,) = p.committer.emitted
    headers = dict(out.headers or [])
    assert out.topic == "dlq" and out.ref.offset == 10
    assert headers["ktw.dlq.error.reason"] == b"poison"
    assert headers["ktw.dlq.value"] == b"reference"
    assert b"3 times" in (headers["ktw.dlq.error.message"] or b"")
    assert json.loads(out.value or b"")["offset"] == 10
    assert p.stats.dead_by_reason["poison"] == 1
    p.finish(A, 10)  # its dead letter is delivered
    p.guard.steer(0)
    assert kafka[A] == At(11, 1)  # the partition goes on, its count reset


def test_a_charge_that_cannot_be_written_holds_the_record_back() -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (10, marker(2))}
    p = Process(kafka)
    p.assign(A)
    p.committer.fail = True
    assert p.take(A) == []  # taken from Kafka, not given to the task
    assert kafka[A] == At(10, 2)
    assert p.guard.steer(1) and p.consumer.paused == {A}  # nothing more is taken meanwhile
    p.committer.fail = False
    (rec,) = p.guard.screen(ConsumedBatch([], {}, 0.0)).records  # the next step
    assert rec.offset == 10 and kafka[A] == At(10, 3)


def test_a_death_before_the_record_is_taken_charges_nothing() -> None:
    """A process killed soon after each restart (while its record is still being fetched)
    must not charge the record: the old order (count raised at assignment) dead-lettered
    innocent records in the kill -9 drill."""
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (10, marker(2))}
    for _ in range(5):
        p = Process(kafka)
        p.assign(A)
        assert p.guard.steer(0)  # its turn begins, the partition is resumed ... and it dies
        assert kafka[A] == At(10, 2)


def test_suspects_take_turns_most_deaths_first_and_never_count_each_others_deaths() -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (0, marker(1)), B: (5, marker(2))}
    p = Process(kafka)
    p.assign(A, B)
    p.take(B)
    assert kafka == {A: At(0, 1), B: At(5, 3)}  # A's count untouched


def test_an_idle_partition_ends_its_isolation() -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (4, marker(1))}
    p = Process(kafka, high=9)
    p.assign(A)
    assert p.guard.steer(0) and p.guard.active
    p.clock[0] += 10.0  # nothing arrived (the last offsets were transaction markers)
    p.guard.steer(0)
    assert kafka[A] == At(4, 1) and not p.committer.marks.sticky


def test_a_revoked_isolated_partition_is_forgotten() -> None:
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (4, marker(1))}
    p = Process(kafka)
    p.assign(A)
    p.take(A)
    p.guard.forget([A])
    assert not p.guard.active and not p.committer.marks.sticky


@pytest.fixture
def alo() -> Iterator[Any]:
    class Sync:
        def __init__(self) -> None:
            self.commits: list[list[tuple[int, int, str]]] = []

        def commit(self, offsets: list[ck.TopicPartition]) -> None:
            self.commits.append([(tp.partition, tp.offset, tp.metadata or "")
                                 for tp in offsets])

    consumer = Sync()
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9"})
    committer = AtLeastOnce(cfg, consumer)  # type: ignore[arg-type]
    committer.start()  # (a producer with nothing to send: flush returns at once)
    yield committer, consumer
    committer.close(failed=False)


def test_at_least_once_commits_carry_attempt_one_and_a_revoke_clears_it(alo: Any) -> None:
    """A clean handover must not count: the revoke commits the unmoved position without
    its mark (the old code committed nothing then)."""
    committer, consumer = alo
    committer.track(A, 4)
    committer.begin(*A, 4)
    committer._tracker.finish(*A, 4)
    committer._commit(force=True)
    assert consumer.commits == [[(0, 5, marker(1))]]
    committer.revoked({A})
    assert consumer.commits[-1] == [(0, 5, "")]


def test_deaths_at_different_records_never_add_up_to_a_dead_letter() -> None:
    """Kills from outside (a node drained, kill -9) land on whatever record is in flight:
    each process here gets one record done and dies at the next. A count carried through the
    window would reach K and dead-letter an innocent record."""
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {A: (0, marker(1))}
    for offset in range(6):
        p = Process(kafka)
        p.assign(A)
        assert p.take(A)  # the record at `offset`, at attempt 3 at most
        p.finish(A, offset)
        assert p.take(A)  # the next one; the process dies with it in flight
        assert kafka[A] == (offset + 1, marker(2))
    p = Process(kafka)
    p.assign(A)
    assert p.take(A) and not p.committer.emitted  # processed, not dead-lettered


def test_one_attempt_is_refused() -> None:
    with pytest.raises(ConfigError, match="poison_max_attempts"):
        load_config(None, processing={"poison_max_attempts": 1})
    assert load_config(None, processing={"poison_max_attempts": 0}).processing \
        .poison_max_attempts == 0


def test_a_release_hands_over_a_count_not_yet_resolved_and_clears_the_rest() -> None:
    marks = CommitMarks(marker(1))
    marks.kept[A] = (10, marker(2))  # read at assignment, the record at 10 never finished
    marks.kept[B] = (3, marker(2))  # ... this one did: the position moved on
    released = marks.offsets({A: 10, B: 4}, {A, B})
    assert [(tp.partition, tp.metadata) for tp in released] == [At(0, 2), (1, "")]


def test_a_partition_this_process_lost_and_regains_is_not_suspect() -> None:
    """A broker stall past the session timeout loses the partitions; the same process gets
    them back and finds its own attempts=1 mark. That was no death: it used to come back
    suspect (isolated record by record, slowing the recovery, and repeated stalls could add up
    to a poison verdict on an innocent record)."""
    kafka: dict[TopicPartitionKey, tuple[int, str]] = {}
    p = Process(kafka)
    kafka[A] = (10, marker(1))  # written by this very process before it lost A
    kafka[B] = (5, "ktw.attempts=1;by=0123abcd")  # another process's: it died there
    p.assign(A, B)
    assert p.guard.active and set(p.guard._suspects) == {B}
