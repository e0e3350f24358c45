"""worker.loop.hold: partitions paused when too much is consumed past their committed
position, or when backpressure is overfull; released under half the limit."""

from __future__ import annotations

import confluent_kafka as ck

from worker.config import load_config
from worker.loop.backpressure import Backpressure
from worker.loop.commit.offsets import OffsetTracker
from worker.loop.hold import PartitionHold
from worker.loop.stats import Stats

A, B = ("jobs", 0), ("jobs", 1)


class _Consumer:
    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()

    def pause(self, tps: list[ck.TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[ck.TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}


def test_a_stuck_head_grows_the_span_until_its_partition_is_held_then_released() -> None:
    """One output that cannot be delivered (offset 0 of A) while every record behind it is
    answered: the committed position stays at 0 and the span grows with each record. Nothing
    bounded it (backpressure counts open records only: here just one)."""
    tracker, consumer, clock = OffsetTracker(), _Consumer(), [0.0]
    hold = PartitionHold(consumer.pause, consumer.resume, max_uncommitted=100,
                         clock=lambda: clock[0])
    for off in range(150):
        tracker.begin(*A, off)
        tracker.begin(*B, off)
        if off:
            tracker.finish(*A, off)  # answered; only offset 0 is stuck
        tracker.finish(*B, off)
    tracker.mark_committed(tracker.committable())
    assert tracker.pending() == 1  # what backpressure sees
    spans = tracker.uncommitted()
    assert spans[A] == 150 and spans[B] == 0
    hold.update(spans, {A, B}, overfull=False)
    assert consumer.paused == {A} and hold.reason() is not None and "jobs[0]" in hold.reason()
    # Still above half the limit: stays held.
    hold.update({A: 60, B: 0}, {A, B}, overfull=False)
    assert consumer.paused == {A}
    tracker.finish(*A, 0)  # the output goes through
    tracker.mark_committed(tracker.committable())
    hold.update(tracker.uncommitted(), {A, B}, overfull=False)
    assert consumer.paused == set() and hold.reason() is None and hold.holds == 1


def test_overfull_backpressure_holds_every_partition_and_a_resume_elsewhere_is_undone(
) -> None:
    consumer, clock = _Consumer(), [0.0]
    hold = PartitionHold(consumer.pause, consumer.resume, max_uncommitted=100,
                         clock=lambda: clock[0])
    hold.update({}, {A, B}, overfull=True)
    assert consumer.paused == {A, B}
    consumer.resume([ck.TopicPartition(*A)])  # a committer's own wait ended
    clock[0] += 2.0
    hold.update({}, {A, B}, overfull=True)
    assert consumer.paused == {A, B}
    hold.update({}, {A, B}, overfull=False)
    assert consumer.paused == set()


def test_backpressure_is_overfull_only_held_back_and_a_quarter_over() -> None:
    cfg = load_config(None, batch={"high_watermark": 16, "low_watermark": 4,
                                   "max_batch_size": 8})
    bp = Backpressure(cfg.batch, Stats())
    assert not bp.overfull(40, 0)  # not held back: backpressure itself acts first
    bp.update(16)
    assert bp.paused and not bp.overfull(19, 0) and bp.overfull(20, 0)
