"""worker.tasks.protocol.BatchedTask: the loop's view of a one-batcher task (admit, step, collect,
remove, held), with a scripted core; no model and no broker."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from engines.profiles import RangeProfile
from worker.exceptions import JobRejected, SchemaViolation
from worker.tasks.batcher import Batch, DynamicBatcher
from worker.tasks.protocol import Answer, BatchedTask, TaskTopics
from worker.wire.moderation_jobs import Status
from worker.wire.records import SourceRecord, SourceRef

SHAPE = (4,)
PROFILE = RangeProfile("r", SHAPE, SHAPE, SHAPE, min_batch=1, opt_batch=4, max_batch=4)
TOPICS = TaskTopics("jobs", "results", "dlq")
NOW_MS = 1_800_000_000_000


@dataclass
class Item:
    ref: SourceRef
    record: SourceRecord
    epoch: int
    consumed_at: float
    deadline_ms: int | None = None
    item_shape: tuple[int, ...] = SHAPE

    @property
    def partition_key(self) -> tuple[str, int]:
        return (self.ref.topic, self.ref.partition)


@dataclass
class Result:
    id: str
    status: Status


@dataclass
class Outcome:
    pending: Item
    result: Result | None = None
    rejection: JobRejected | None = None


@dataclass
class ScriptedCore:
    """Answers each batch on ``finish()``: value b"bad" is rejected, the rest get a result."""

    model_id: str = "m"
    engine_hash: str = "h"
    futures: list[tuple[Future[list[Outcome]], Batch[Item]]] = field(default_factory=list)

    def warm_up(self) -> None: ...

    def ready(self) -> bool:
        return True

    def pending(self, record: SourceRecord, epoch: int, consumed_at: float) -> Item:
        shape = (8,) if record.value == b"too-big" else SHAPE
        return Item(SourceRef(record.topic, record.partition, record.offset), record, epoch,
                    consumed_at, deadline_ms=NOW_MS - 1 if record.value == b"late" else None,
                    item_shape=shape)

    def submit(self, batch: Batch[Item]) -> Future[list[Outcome]]:
        fut: Future[list[Outcome]] = Future()
        self.futures.append((fut, batch))
        return fut

    def finish(self) -> None:
        for fut, batch in self.futures:
            if not fut.done():
                fut.set_result([
                    Outcome(p, rejection=SchemaViolation("bad", reason="bad_image"))
                    if p.record.value == b"bad" else Outcome(p, Result(f"j{p.ref.offset}",
                                                                       Status.OK))
                    for p in batch.items])

    def expired_result(self, p: Item, now_ms: int) -> Result:
        return Result(f"j{p.ref.offset}", Status.EXPIRED)

    def encode(self, result: Result) -> tuple[bytes, list[tuple[str, bytes]]]:
        return f"{result.id}:{result.status.value}".encode(), [("ktw.schema", b"s")]

    def close(self) -> None: ...


def _record(offset: int, value: bytes = b"ok", partition: int = 0) -> SourceRecord:
    return SourceRecord("jobs", partition, offset, None, value, None, None)


def _task(delay_s: float = 0.0) -> tuple[BatchedTask[Item], ScriptedCore]:
    core = ScriptedCore()
    batcher: DynamicBatcher[Item] = DynamicBatcher((PROFILE,), max_batch_size=4,
                                                   max_delay_s=delay_s)
    return BatchedTask(TOPICS, core, batcher), core


def test_a_job_no_profile_fits_is_rejected_for_the_dlq() -> None:
    task, _ = _task()
    with pytest.raises(SchemaViolation) as info:
        task.admit(_record(0, b"too-big"), 0, 1.0)
    assert info.value.reason == "no_profile" and task.held() == 0


def test_batches_run_off_the_loop_and_answers_carry_epoch_key_value_and_headers() -> None:
    task, core = _task()
    for off, value in enumerate([b"ok", b"bad", b"ok"]):
        task.admit(_record(off, value), 7, 1.0)
    assert task.held() == 3
    assert task.step(2.0, NOW_MS, free=2, force=False) == []
    assert task.in_flight() == 1 and task.held() == 3, "computing jobs are still held"
    assert task.collect(block=False) == [], "nothing finished yet: no answer, no wait"
    sizes: list[int] = []
    task.on_batch_done = lambda _ms, n: sizes.append(n)
    core.finish()
    answers = task.collect(block=False)
    assert sizes == [3] and task.held() == 0 and task.in_flight() == 0
    by_offset = {a.ref.offset: a for a in answers}
    assert by_offset[0] == Answer(SourceRef("jobs", 0, 0), _record(0), 7, "j0", "ok", b"j0",
                                  b"j0:ok", [("ktw.schema", b"s")])
    assert by_offset[1].rejection is not None and by_offset[1].rejection.reason == "bad_image"
    assert by_offset[1].value is None and by_offset[1].record.value == b"bad"
    assert by_offset[2].epoch == 7 and not by_offset[2].expired


def test_free_slots_cap_submissions_and_force_flushes_a_partial_batch() -> None:
    task, core = _task(delay_s=60.0)
    task.admit(_record(0), 0, 1.0)
    task.step(2.0, NOW_MS, free=1, force=False)
    assert task.in_flight() == 0, "one job of four, within its delay: not due yet"
    task.step(2.0, NOW_MS, free=0, force=True)
    assert task.in_flight() == 0, "no free slot: even a forced step submits nothing"
    task.step(2.0, NOW_MS, free=1, force=True)
    assert task.in_flight() == 1 and len(core.futures[0][1].items) == 1 and task.held() == 1


def test_expired_jobs_are_answered_at_step_without_reaching_the_core() -> None:
    task, core = _task()
    task.admit(_record(0, b"late"), 3, 1.0)
    answers = task.step(2.0, NOW_MS, free=2, force=False)
    assert [a.expired for a in answers] == [True] and answers[0].value == b"j0:expired"
    assert answers[0].epoch == 3 and core.futures == [] and task.held() == 0


def test_remove_drops_only_the_named_partitions_queued_jobs() -> None:
    task, _ = _task(delay_s=60.0)
    task.admit(_record(0, partition=0), 0, 1.0)
    task.admit(_record(0, partition=1), 0, 1.0)
    task.remove({("jobs", 1)})
    assert task.held() == 1
    task.step(2.0, NOW_MS, free=1, force=True)
    task.core.finish()  # type: ignore[attr-defined]
    assert [a.ref.partition for a in task.collect(block=True)] == [0]


def test_a_failing_batch_raises_out_of_collect() -> None:
    task, core = _task()
    task.admit(_record(0), 0, 1.0)
    task.step(2.0, NOW_MS, free=1, force=False)
    core.futures[0][0].set_exception(RuntimeError("task bug"))
    with pytest.raises(RuntimeError, match="task bug"):
        task.collect(block=True)
