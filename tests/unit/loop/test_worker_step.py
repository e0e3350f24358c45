"""worker.loop.worker.Worker stepped with fakes, no broker: intake, backpressure, schedule and
collect, revoke and lost, shutdown. The loop builds none of its parts (worker.loop.build), so
each part here is a stand-in that records what the loop asked of it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import pytest

from worker.config import load_config
from worker.exceptions import DeliveryFailed, SchemaViolation, StaticMemberFenced
from worker.loop.backpressure import Backpressure
from worker.loop.build import LoopParts
from worker.loop.group.assignment import Assignment
from worker.loop.heap import HeapPolicy
from worker.loop.hold import PartitionHold
from worker.loop.hops import HopTimes
from worker.loop.output import Output, OutputBuilder
from worker.loop.stats import Stats
from worker.loop.worker import Worker
from worker.observe.spans import JobObserver
from worker.observe.vitals import Vitals
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, source_ref
from worker.wire.records import SourceRecord, TopicPartitionKey

TOPICS = TaskTopics("jobs", "results", "dlq")
P0, P1 = ("jobs", 0), ("jobs", 1)


def _record(partition: int, offset: int, value: bytes = b"ok") -> SourceRecord:
    return SourceRecord("jobs", partition, offset, f"k{partition}-{offset}".encode(), value,
                        None, None)


class FakeIntake:
    """Hands out scripted records, telling the committer of each (as the real intake does)."""

    def __init__(self, committer: FakeCommitter, assignment: Assignment) -> None:
        self.queue: deque[SourceRecord] = deque()
        self.calls: list[tuple[int, float, bool]] = []
        self.error: Exception | None = None  # raised once by the next consume()
        self._committer, self._assignment = committer, assignment

    def consume(self, room: int, timeout: float, *, prompt: bool = False) -> ConsumedBatch:
        self.calls.append((room, timeout, prompt))
        error, self.error = self.error, None
        if error is not None:
            raise error
        out = []
        while self.queue and len(out) < room:
            r = self.queue.popleft()
            self._committer.begin(r.topic, r.partition, r.offset, len(r.value or b""))
            out.append(r)
        return ConsumedBatch(out, dict(self._assignment.epochs), 1.0)


class FakeCommitter:
    fatal: BaseException | None = None
    transactional_id = None
    on_committed = None
    on_wait = None

    def __init__(self) -> None:
        self.open: set[tuple[str, int, int]] = set()
        self.emitted: list[Output] = []
        self.events: list[str] = []

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> None:
        self.open.add((topic, partition, offset))

    def emit(self, outs: list[Output]) -> None:
        self.emitted += outs
        for o in outs:
            self.open.discard((o.ref.topic, o.ref.partition, o.ref.offset))

    def tick(self, *, force: bool = False) -> None:
        """Outputs count as delivered when emitted: nothing to settle."""

    def pending(self) -> int:
        return len(self.open)

    def held_bytes(self) -> int:
        return 0

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        return {}

    def revoked(self, keys: set[TopicPartitionKey]) -> None:
        self.events.append(f"revoked {sorted(keys)}")

    def lost(self, keys: set[TopicPartitionKey]) -> None:
        self.events.append(f"lost {sorted(keys)}")

    def forget(self, keys: set[TopicPartitionKey]) -> None:
        self.open = {o for o in self.open if (o[0], o[1]) not in keys}

    def drain(self, *, failed: bool) -> None:
        self.events.append(f"drain failed={failed}")

    def close(self, *, failed: bool) -> None:
        self.events.append(f"close failed={failed}")

    def totals(self) -> dict[str, int]:
        return {}

    def blocked(self) -> str | None:
        return None


class FakeTask:
    """Queues admitted records; a batch is launched per schedule() and finishes on finish()."""

    topics, model_id, engine_hash = TOPICS, "m", "h"
    on_batch_done = None

    def __init__(self) -> None:
        self.queued: list[tuple[SourceRecord, int]] = []
        self.launched: list[list[tuple[SourceRecord, int]]] = []
        self.done: list[list[tuple[SourceRecord, int]]] = []
        self.removed: list[set[TopicPartitionKey]] = []
        self.closed = False

    def warm_up(self) -> None:
        """No engine to warm."""

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        rejected = []
        for r in batch.records:
            if r.value == b"bad":
                rejected.append(Answer(source_ref(r), r, batch.epoch(r),
                                       rejection=SchemaViolation("bad")))
            else:
                self.queued.append((r, batch.epoch(r)))
        return rejected

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        if self.queued and (free > 0 or force):
            self.launched.append(self.queued)
            self.queued = []
        return []

    def finish(self) -> None:
        self.done += self.launched
        self.launched = []

    def collect(self, *, block: bool) -> list[Answer]:
        if block:
            self.finish()
        done, self.done = self.done, []
        return [Answer(source_ref(r), r, epoch, f"j{r.offset}", "ok", r.key,
                       b"result:" + (r.value or b""), [])
                for batch in done for r, epoch in batch]

    def remove(self, keys: set[TopicPartitionKey]) -> None:
        self.removed.append(keys)
        self.queued = [(r, e) for r, e in self.queued if (r.topic, r.partition) not in keys]

    def held(self) -> int:
        return len(self.queued) + sum(len(b) for b in self.launched + self.done)

    def in_flight(self) -> int:
        return len(self.launched)

    def wait(self, timeout: float) -> None:
        """Batches finish when the test says (finish()): no wait."""

    def ready(self) -> bool:
        return True

    def unavailable(self) -> str | None:
        return None

    def close(self) -> None:
        self.closed = True


class FakeConsumer:
    def __init__(self) -> None:
        self.callbacks: dict[str, Any] = {}
        self.paused: set[TopicPartitionKey] = set()
        self.closed = False

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def pause(self, tps: list[ck.TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[ck.TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}


class FakeMembership:
    def __init__(self, consumer: FakeConsumer) -> None:
        self.events: list[str] = []
        self._consumer = consumer

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")

    def leave(self) -> None:
        self._consumer.closed = True
        self.events.append("leave")

    def step(self, now: float, vitals: Vitals) -> None:
        """No rejoin or orphan in these tests."""

    def rebalanced(self) -> None:
        """Nothing seen before a rebalance to forget."""

    def assigned(self) -> None:
        self.events.append("assigned")

    def lost(self) -> None:
        self.events.append("lost")

    def fenced(self, exc: StaticMemberFenced, lose_all: Callable[[], None]) -> None:
        """As a member no other process holds the instance id of: rejoins."""
        self.events.append("fenced")
        lose_all()

    def totals(self) -> dict[str, int]:
        return {"consumer_reopens": 0, "orphan_rejoins": 0}


class FakeStartup:
    def __init__(self) -> None:
        self.opened = False

    def wait_for_topics(self, stop: threading.Event) -> bool:
        return True

    def open_while_warming(self, stop: threading.Event) -> bool:
        self.opened = True
        return True


def _worker(**batch: Any) -> tuple[Worker, FakeTask, FakeIntake, FakeCommitter, FakeConsumer]:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9"},
                      batch={"high_watermark": 8, "low_watermark": 2, "max_batch_size": 4,
                             "max_in_flight_batches": 1, **batch})
    stats, assignment, committer, consumer = Stats(), Assignment(), FakeCommitter(), FakeConsumer()
    intake = FakeIntake(committer, assignment)
    task = FakeTask()
    parts = LoopParts(
        consumer=consumer, committer=committer, intake=intake,  # type: ignore[arg-type]
        outputs=OutputBuilder(TOPICS, "w", stats), assignment=assignment,
        backpressure=Backpressure(cfg.batch, stats),
        hold=PartitionHold(consumer.pause, consumer.resume, max_uncommitted=1000),
        membership=FakeMembership(consumer), startup=FakeStartup(), stats=stats,
        vitals=Vitals(), heap=HeapPolicy(cfg.gc), hops=HopTimes(), observer=JobObserver())
    return Worker(cfg, task, parts), task, intake, committer, consumer  # type: ignore[arg-type]


def _assign(consumer: FakeConsumer, *keys: TopicPartitionKey) -> None:
    consumer.callbacks["on_assign"](None, [ck.TopicPartition(t, p) for t, p in keys])


def _subscribed(w: Worker, consumer: FakeConsumer) -> None:
    consumer.callbacks = {"on_assign": w._rebalance.on_assign,
                          "on_revoke": w._rebalance.on_revoke,
                          "on_lost": w._rebalance.on_lost}


def test_a_step_takes_records_runs_a_batch_and_emits_results_and_dead_letters() -> None:
    w, task, intake, committer, consumer = _worker()
    _subscribed(w, consumer)
    _assign(consumer, P0)
    intake.queue.extend([_record(0, 0), _record(0, 1, b"bad"), _record(0, 2)])
    w.step()
    # The rejection is emitted at once; the good jobs went into one batch.
    assert [(o.kind, o.ref.offset) for o in committer.emitted] == [("dlq", 1)]
    assert len(task.launched) == 1 and intake.calls[0][2] is True  # idle: a prompt take
    task.finish()
    w.step()
    assert [(o.kind, o.ref.offset) for o in committer.emitted] == [
        ("dlq", 1), ("result", 0), ("result", 2)]
    assert committer.emitted[1].topic == "results" and committer.emitted[0].topic == "dlq"
    assert committer.pending() == 0


def test_with_work_pending_a_step_waits_at_most_a_tick_and_never_while_slots_are_busy(
) -> None:
    w, _task, intake, _committer, consumer = _worker()
    _subscribed(w, consumer)
    _assign(consumer, P0)
    intake.queue.append(_record(0, 0))
    w.step()  # idle: the whole poll timeout, prompt
    assert intake.calls[-1][1] == pytest.approx(0.05) and intake.calls[-1][2]
    w.step()  # the batch holds the only slot: no wait in consume()
    assert intake.calls[-1][1] == 0.0 and not intake.calls[-1][2]


def test_backpressure_holds_the_intake_to_keepalive_takes_of_one_record() -> None:
    w, _task, intake, committer, consumer = _worker()
    _subscribed(w, consumer)
    _assign(consumer, P0)
    intake.queue.extend(_record(0, i) for i in range(20))
    w.step()
    assert committer.pending() == 8  # room was the high watermark
    assert w.backpressure.paused
    calls = len(intake.calls)
    w.step()
    w.step()
    # Held back: at most one keepalive take (every KEEPALIVE_S), of a single record.
    assert all(room == 1 for room, _t, _p in intake.calls[calls:])
    assert len(intake.calls) - calls <= 1 and committer.pending() <= 9


def test_a_revoke_drops_queued_jobs_finishes_those_in_flight_and_lets_the_committer_commit(
) -> None:
    w, task, intake, committer, consumer = _worker(max_in_flight_batches=1)
    _subscribed(w, consumer)
    _assign(consumer, P0, P1)
    intake.queue.extend([_record(0, 0), _record(1, 0)])
    w.step()  # both in the first batch, in flight
    intake.queue.extend([_record(0, 1)])
    w.step()  # queued behind the busy slot
    assert [r.offset for r, _ in task.queued] == [1]
    consumer.callbacks["on_revoke"](None, [ck.TopicPartition("jobs", 0)])
    assert task.removed == [{P0}] and task.queued == []
    # The batch in flight was collected in the callback and its outputs emitted before the
    # committer made them durable.
    assert {(o.ref.partition, o.ref.offset) for o in committer.emitted} == {(0, 0), (1, 0)}
    assert committer.events == ["revoked [('jobs', 0)]"]
    assert P0 not in w.assignment.owned and P1 in w.assignment.owned


def test_answers_of_lost_partitions_are_discarded_as_stale() -> None:
    w, task, intake, committer, consumer = _worker()
    _subscribed(w, consumer)
    _assign(consumer, P0)
    intake.queue.append(_record(0, 0))
    w.step()
    consumer.callbacks["on_lost"](None, [ck.TopicPartition("jobs", 0)])
    assert committer.events == ["lost [('jobs', 0)]"]
    task.finish()
    w.step()  # the batch's answer comes back late: its partition's epoch moved on
    assert committer.emitted == [] and w.assignment.stale_discarded == 1


def test_a_fenced_static_member_loses_every_partition_and_the_loop_goes_on() -> None:
    """Membership decides (worker.loop.group.membership.StaticFencing); the loop drops what the
    fenced client owned as lost, so nothing of it is committed and late answers are stale."""
    w, task, intake, committer, consumer = _worker()
    _subscribed(w, consumer)
    _assign(consumer, P0, P1)
    intake.queue.append(_record(0, 0))
    w.step()
    intake.error = StaticMemberFenced("fatal consumer error: Static consumer fenced")
    w.step()
    assert w.parts.membership.events[-2:] == ["fenced", "lost"]  # type: ignore[attr-defined]
    assert committer.events == ["lost [('jobs', 0), ('jobs', 1)]"]
    assert w.assignment.owned == set() and w.fatal_error is None
    task.finish()
    w.step()
    assert committer.emitted == [] and w.assignment.stale_discarded == 1


def test_run_drains_what_is_held_then_commits_and_closes_in_order() -> None:
    w, task, intake, committer, consumer = _worker()
    intake.queue.extend([_record(0, 0), _record(0, 1)])

    def subscribe(topics: list[str], **callbacks: Any) -> None:
        consumer.callbacks = callbacks
        callbacks["on_assign"](None, [ck.TopicPartition("jobs", 0)])

    consumer.subscribe = subscribe  # type: ignore[method-assign]
    steps = 0
    real_step = w.step

    def step() -> None:
        nonlocal steps
        steps += 1
        real_step()
        if steps == 2:
            w.stop()

    w.step = step  # type: ignore[method-assign]
    w.run()
    assert w.parts.startup.opened and w.vitals.warm  # type: ignore[attr-defined]
    assert [o.ref.offset for o in committer.emitted] == [0, 1]  # drained before the commit
    assert committer.events == ["drain failed=False", "close failed=False"]
    assert consumer.closed and task.closed
    # (The stand-in consumer assigns inside subscribe(); librdkafka does in a later poll.)
    assert w.parts.membership.events == [  # type: ignore[attr-defined]
        "assigned", "start", "stop", "leave"]


def test_a_fatal_committer_stops_the_loop_without_draining_past_it() -> None:
    w, task, intake, committer, consumer = _worker()
    intake.queue.append(_record(0, 0))
    consumer.subscribe = (  # type: ignore[method-assign]
        lambda topics, **cb: cb["on_assign"](None, [ck.TopicPartition("jobs", 0)]))
    committer.fatal = DeliveryFailed("delivery failed for good")
    with pytest.raises(DeliveryFailed):
        w.run()
    assert task.launched and committer.emitted == []  # the batch was never drained
    assert committer.events == ["drain failed=True", "close failed=True"]
    assert consumer.closed and task.closed
