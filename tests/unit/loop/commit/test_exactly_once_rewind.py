"""Exactly-once rewinds to the positions the group coordinator has, not cached ones.

A commit_transaction that timed out may have committed on the coordinator all the same. The
abort and rewind that follow used the positions cached by the worker (older), so the records
between the two were consumed and published again: a duplicate under exactly-once.
"""

from __future__ import annotations

import confluent_kafka as ck

from worker.config import load_config
from worker.exceptions import KafkaIOError
from worker.loop.commit.exactly_once import ExactlyOnce
from worker.loop.group.assignment import Assignment


class CoordinatorConsumer:
    def __init__(self, committed: dict[tuple[str, int], int] | None) -> None:
        self._committed = committed
        self.seeks: list[tuple[str, int, int]] = []

    def committed(self, partitions: list[ck.TopicPartition], timeout: float
                  ) -> list[ck.TopicPartition]:
        if self._committed is None:
            raise KafkaIOError("committed offsets unavailable: timed out")
        return [ck.TopicPartition(tp.topic, tp.partition,
                                  self._committed.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def seek(self, tp: ck.TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def _committer(consumer: CoordinatorConsumer) -> ExactlyOnce:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9", "instance_id": "t"},
                      processing={"guarantee": "exactly-once"})
    assignment = Assignment()
    assignment.owned |= {("jobs", 0), ("jobs", 1)}
    eo = ExactlyOnce(cfg, consumer, assignment, lambda keys: None)  # type: ignore[arg-type]
    for p in (0, 1):
        for off in range(10, 20):
            eo.begin("jobs", p, off)
    # What this worker believes was committed last: 12 on both partitions.
    eo._tracker.mark_committed({("jobs", 0): 12, ("jobs", 1): 12})
    return eo


def test_rewind_seeks_to_the_coordinators_positions() -> None:
    # The timed-out commit did land for partition 0 (up to 17); partition 1 kept 12.
    consumer = CoordinatorConsumer({("jobs", 0): 17, ("jobs", 1): 12})
    eo = _committer(consumer)
    eo._rewind()
    assert sorted(consumer.seeks) == [("jobs", 0, 17), ("jobs", 1, 12)]
    assert eo._tracker.committable() == {}  # 17 is now what this worker knows as committed


def test_no_commit_on_the_coordinator_rewinds_to_the_first_offset_consumed() -> None:
    consumer = CoordinatorConsumer({})
    eo = _committer(consumer)
    eo._tracker.drop([("jobs", 1)])
    eo.begin("jobs", 1, 10)
    eo._rewind()
    assert ("jobs", 1, 10) in consumer.seeks


def test_a_coordinator_that_does_not_answer_is_waited_out_then_rewound() -> None:
    """A coordinator outage at the rewind pauses the partitions, readiness says why, and the
    rewind is tried again later; it used to raise, a fatal exit (and a restart meeting the same
    outage: CI's 30 s broker stall under exactly-once)."""
    consumer = PausingConsumer()
    eo = _committer(consumer)
    eo._rewind()
    assert consumer.seeks == [] and consumer.paused
    reason = eo.blocked()
    assert reason is not None and "group coordinator" in reason
    assert eo._rewind_needed
    eo._settle()  # too early: the next attempt is not due yet
    assert consumer.asked == 1
    eo._outage.next_at = 0.0  # type: ignore[union-attr]
    eo._settle()
    assert consumer.asked == 2 and eo.blocked() is not None  # still down: still waiting
    consumer._committed = {("jobs", 0): 17, ("jobs", 1): 12}  # the coordinator is back
    eo._outage.next_at = 0.0  # type: ignore[union-attr]
    eo._settle()
    assert sorted(consumer.seeks) == [("jobs", 0, 17), ("jobs", 1, 12)]
    assert eo.blocked() is None and consumer.resumed and not eo._rewind_needed


def test_outputs_during_the_wait_are_not_produced() -> None:
    consumer = PausingConsumer()
    eo = _committer(consumer)
    eo._rewind()
    eo._rewind_needed = False
    eo.emit([object()])  # type: ignore[list-item]
    assert eo._rewind_needed  # redone after the rewind; nothing went into a transaction
    assert not eo._txn.open


class PausingConsumer(CoordinatorConsumer):
    def __init__(self) -> None:
        super().__init__(None)
        self.asked, self.paused, self.resumed = 0, False, False

    def committed(self, partitions: list[ck.TopicPartition], timeout: float
                  ) -> list[ck.TopicPartition]:
        self.asked += 1
        return super().committed(partitions, timeout)

    def assignment(self) -> list[ck.TopicPartition]:
        return [ck.TopicPartition("jobs", 0), ck.TopicPartition("jobs", 1)]

    def pause(self, _tps: list[ck.TopicPartition]) -> None:
        self.paused = True

    def resume(self, _tps: list[ck.TopicPartition]) -> None:
        self.resumed = True
