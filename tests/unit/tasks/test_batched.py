"""worker.tasks.batched.BatchedTask: the loop's view of a one-batcher task (admit, schedule,
collect, remove, held), through a scripted subclass; no model and no broker."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

import pytest

from engines.profiles import RangeProfile
from worker.exceptions import JobRejected, SchemaViolation
from worker.tasks.batched import BatchedTask
from worker.tasks.batcher import Batch, DynamicBatcher
from worker.tasks.protocol import Answer, ConsumedBatch, Task, TaskTopics, source_ref
from worker.wire.moderation_jobs import Status
from worker.wire.records import SourceRecord, SourceRef

SHAPE = (4,)
PROFILE = RangeProfile("r", SHAPE, SHAPE, SHAPE, min_batch=1, opt_batch=4, max_batch=4)
TOPICS = TaskTopics("jobs", "results", "dlq")
NOW_MS = 1_800_000_000_000
MAX_BYTES = 64


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


class ScriptedTask(BatchedTask[Item]):
    """Answers each batch on ``finish()``: value b"bad" is rejected, the rest get a result;
    b"refused" is refused at intake."""

    model_id = "m"

    def __init__(self) -> None:
        self.futures: list[tuple[Future[list[Outcome]], Batch[Item]]] = []
        self.unencodable = ""  # a result id whose encode() fails

    @property
    def engine_hash(self) -> str:
        return "h"

    def warm_up(self) -> None: ...

    def intake(self, record: SourceRecord, value: bytes, epoch: int, consumed_at: float
               ) -> Item:
        if value == b"refused":
            raise SchemaViolation("refused", reason="refused")
        shape = (8,) if value == b"too-big" else SHAPE
        return Item(source_ref(record), record, epoch, consumed_at,
                    deadline_ms=NOW_MS - 1 if value == b"late" else None, item_shape=shape)

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

    def encode(self, result: Result) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
        if result.id == self.unencodable:
            raise TypeError("can not serialize 'set' object")
        return f"{result.id}:{result.status.value}".encode(), [("ktw.schema", b"s")]

    def close(self) -> None: ...


def _record(offset: int, value: bytes | None = b"ok", partition: int = 0) -> SourceRecord:
    return SourceRecord("jobs", partition, offset, None, value, None, None)


def _batch(*records: SourceRecord, epoch: int = 0) -> ConsumedBatch:
    return ConsumedBatch(records, {(r.topic, r.partition): epoch for r in records}, 1.0)


def _task(delay_s: float = 0.0) -> ScriptedTask:
    task = ScriptedTask()
    batcher: DynamicBatcher[Item] = DynamicBatcher((PROFILE,), max_batch_size=4,
                                                   max_delay_s=delay_s)
    task.serve(TOPICS, batcher, max_message_bytes=MAX_BYTES)
    return task


def test_a_served_task_is_the_loops_task() -> None:
    task: Task = _task()
    assert task.topics == TOPICS and task.model_id == "m" and task.engine_hash == "h"
    assert task.ready() and task.held() == 0 and task.in_flight() == 0


def test_an_unserved_task_says_so() -> None:
    with pytest.raises(RuntimeError, match="serve"):
        ScriptedTask().held()


def test_a_job_no_profile_fits_is_rejected_for_the_dlq() -> None:
    task = _task()
    [answer] = task.admit(_batch(_record(0, b"too-big"), epoch=4))
    assert answer.rejection is not None and answer.rejection.reason == "no_profile"
    assert answer.epoch == 4 and answer.value is None and task.held() == 0


def test_admit_answers_rejections_at_once_and_queues_the_rest() -> None:
    task = _task()
    answers = task.admit(_batch(_record(0, None), _record(1, b"x" * (MAX_BYTES + 1)),
                                _record(2, b"refused"), _record(3), epoch=2))
    assert [(a.ref.offset, a.rejection.reason if a.rejection else None) for a in answers] == [
        (0, "schema"), (1, "oversized"), (2, "refused")]
    assert all(a.epoch == 2 and a.value is None for a in answers)
    assert task.held() == 1


def test_batches_run_off_the_loop_and_answers_carry_epoch_key_value_and_headers() -> None:
    task = _task()
    assert task.admit(_batch(*(_record(off, value) for off, value in
                               enumerate([b"ok", b"bad", b"ok"])), epoch=7)) == []
    assert task.held() == 3
    assert task.schedule(2.0, NOW_MS, free=2, force=False) == []
    assert task.in_flight() == 1 and task.held() == 3, "computing jobs are still held"
    assert task.collect(block=False) == [], "nothing finished yet: no answer, no wait"
    sizes: list[int] = []
    task.on_batch_done = lambda _ms, n, _profile, _cap: sizes.append(n)
    task.finish()
    answers = task.collect(block=False)
    assert sizes == [3] and task.held() == 0 and task.in_flight() == 0
    by_offset = {a.ref.offset: a for a in answers}
    assert by_offset[0] == Answer(SourceRef("jobs", 0, 0), _record(0), 7, "j0", "ok", b"j0",
                                  b"j0:ok", [("ktw.schema", b"s")])
    assert by_offset[1].rejection is not None and by_offset[1].rejection.reason == "bad_image"
    assert by_offset[1].value is None and by_offset[1].record.value == b"bad"
    assert by_offset[2].epoch == 7 and not by_offset[2].expired


def test_free_slots_cap_submissions_and_force_flushes_a_partial_batch() -> None:
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0)))
    task.schedule(2.0, NOW_MS, free=1, force=False)
    assert task.in_flight() == 0, "one job of four, within its delay: not due yet"
    task.schedule(2.0, NOW_MS, free=0, force=True)
    assert task.in_flight() == 0, "no free slot: even a forced schedule submits nothing"
    task.schedule(2.0, NOW_MS, free=1, force=True)
    assert task.in_flight() == 1 and len(task.futures[0][1].items) == 1 and task.held() == 1


def test_expired_jobs_are_answered_at_schedule_without_reaching_the_engine() -> None:
    task = _task()
    task.admit(_batch(_record(0, b"late"), epoch=3))
    answers = task.schedule(2.0, NOW_MS, free=2, force=False)
    assert [a.expired for a in answers] == [True] and answers[0].value == b"j0:expired"
    assert answers[0].epoch == 3 and task.futures == [] and task.held() == 0


def test_remove_drops_only_the_named_partitions_queued_jobs() -> None:
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0, partition=0), _record(0, partition=1)))
    task.remove({("jobs", 1)})
    assert task.held() == 1
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.finish()
    assert [a.ref.partition for a in task.collect(block=True)] == [0]


def test_a_sticky_device_error_raises_out_of_collect() -> None:
    """A CUDA error that poisons the context fails every later call: splitting cannot help, so
    it stops the worker (without committing the batch's jobs)."""
    task = _task()
    task.admit(_batch(_record(0), _record(1)))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.futures[0][0].set_exception(RuntimeError("CUDA error: an illegal memory access"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        task.collect(block=True)


def _run_until_answered(task: ScriptedTask, poison: bytes) -> list[Answer]:
    """Finish every submitted batch, failing those holding ``poison``, until nothing is held."""
    answers: list[Answer] = []
    for _ in range(50):
        for fut, batch in task.futures:
            if fut.done():
                continue
            if any(p.record.value == poison for p in batch.items):
                fut.set_exception(TypeError(f"task bug on {poison!r}"))
        task.finish()
        answers += task.collect(block=True)
        if task.held() == 0:
            return answers
    raise AssertionError("never drained")


def test_a_batch_one_job_breaks_is_split_until_that_job_is_dead_lettered_alone() -> None:
    """Before: any exception out of a batch stopped the worker, and every restart (and every
    member taking the partition over) stopped on the same job."""
    task = _task(delay_s=60.0)
    values = [b"ok", b"ok", b"poison", b"ok"]
    task.admit(_batch(*(_record(off, v) for off, v in enumerate(values)), epoch=2))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    answers = _run_until_answered(task, b"poison")
    by_offset = {a.ref.offset: a for a in answers}
    assert sorted(by_offset) == [0, 1, 2, 3] and len(answers) == 4  # each answered once
    assert [by_offset[o].value for o in (0, 1, 3)] == [b"j0:ok", b"j1:ok", b"j3:ok"]
    bad = by_offset[2]
    assert bad.rejection is not None and bad.rejection.reason == "internal_error"
    assert "failed on this job alone 2 times: TypeError: task bug" in str(bad.rejection)
    assert bad.epoch == 2 and bad.record.value == b"poison"
    # 4 jobs, then halves of 2, then the poisoned one alone twice: 1 + 2 + 2 + 1 batches.
    assert len(task.futures) == 6 and task._failed_alone == {}


def test_a_transient_failure_costs_a_retry_not_a_dead_letter() -> None:
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0)))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.futures[0][0].set_exception(OSError("blob store timed out"))
    assert task.collect(block=True) == [] and task.held() == 1  # retried alone
    task.finish()
    [answer] = task.collect(block=True)
    assert answer.rejection is None and answer.value == b"j0:ok"


def test_a_result_that_does_not_encode_dead_letters_its_job_and_nothing_else() -> None:
    """One result the task cannot serialise (a bug) used to raise out of collect() and stop the
    worker, on every restart at the same offset; now its job goes to the DLQ, named."""
    task = _task()
    task.unencodable = "j1"
    task.admit(_batch(_record(0), _record(1), _record(2), epoch=5))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.finish()
    by_offset = {a.ref.offset: a for a in task.collect(block=True)}
    assert by_offset[0].value == b"j0:ok" and by_offset[2].value == b"j2:ok"
    bad = by_offset[1]
    assert bad.rejection is not None and bad.rejection.reason == "internal_error"
    assert "TypeError: can not serialize 'set' object" in str(bad.rejection)
    assert bad.value is None and bad.epoch == 5 and bad.record.value == b"ok"


def test_a_memory_error_is_isolated_like_any_failure() -> None:
    # One image whose decode runs out of memory must not stop the worker (it would meet the
    # same record after every restart): its batch is retried, down to the job alone.
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0)))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.futures[0][0].set_exception(MemoryError())
    assert task.collect(block=True) == [] and task.held() == 1  # retried alone


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
])
def test_an_outage_waits_and_runs_the_whole_batch_again_never_dead_letters(
        error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk or a device out of memory is not the jobs' fault. It was split down to single
    jobs, each run twice, then dead-lettered ``internal_error`` (or, in the engine, answered
    ``status: error``): a transient condition became a permanent answer. Now the whole batch
    waits, runs again with a growing backoff, however many times, and readiness says why."""
    from worker.tasks import batched

    monkeypatch.setattr(batched, "TRANSIENT_FIRST_S", 0.0)
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0), _record(1), _record(2)))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    for _ in range(5):
        fut, batch = task.futures[-1]
        assert len(batch.items) == 3  # never split
        fut.set_exception(error)
        assert task.collect(block=True) == []
        assert task.held() == 3 and task.in_flight() == 1  # it keeps its slot
        reason = task.unavailable()
        assert reason is not None and str(error)[:20] in reason
        task.schedule(time.monotonic(), NOW_MS, free=0, force=False)  # relaunched when due
    assert len(task.futures) == 6
    task.finish()
    answers = task.collect(block=True)
    assert sorted(a.value for a in answers) == [b"j0:ok", b"j1:ok", b"j2:ok"]
    assert task.unavailable() is None and task.held() == 0


def test_a_waiting_batch_is_dropped_at_shutdown_and_on_revoke() -> None:
    task = _task(delay_s=60.0)
    task.admit(_batch(_record(0, partition=0), _record(1, partition=1)))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    task.futures[0][0].set_exception(OSError(28, "No space left on device"))
    task.collect(block=True)
    task.remove({("jobs", 0)})
    assert task.held() == 1  # the revoked partition's job left the waiting batch
    task.schedule(2.0, NOW_MS, free=1, force=True)  # the drain: not waited for, not answered
    assert task.held() == 0 and len(task.futures) == 1


def test_a_batch_whose_every_job_fails_alone_waits_as_an_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing can be pinned on one job when each fails alone (a broken engine): dead-lettering
    them all would answer a whole batch for the engine's fault. The batch waits instead."""
    from worker.tasks import batched

    monkeypatch.setattr(batched, "TRANSIENT_FIRST_S", 60.0)
    task = _task(delay_s=60.0)
    task.admit(_batch(*(_record(off, b"poison") for off in range(3))))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    for _ in range(10):
        for fut, _ in task.futures:
            if not fut.done():
                fut.set_exception(TypeError("engine broken"))
        assert task.collect(block=True) == []
    assert task.held() == 3 and len(task._waiting) == 1
    assert len(task._waiting[0][2].items) == 3
    reason = task.unavailable()
    assert reason is not None and "every job of the batch failed alone" in reason


def test_several_batchers_batch_their_kinds_apart() -> None:
    class Kinds(ScriptedTask):
        def kind_of(self, p: Item) -> str:
            return "even" if p.ref.offset % 2 == 0 else "odd"

    task = Kinds()
    task.serve(TOPICS, {k: DynamicBatcher((PROFILE,), max_batch_size=4, max_delay_s=60.0)
                        for k in ("even", "odd")}, max_message_bytes=MAX_BYTES)
    task.admit(_batch(*(_record(off) for off in range(4))))
    task.schedule(2.0, NOW_MS, free=1, force=True)
    assert [[p.ref.offset for p in b.items] for _f, b in task.futures] == [[0, 2]]
    task.schedule(2.0, NOW_MS, free=1, force=True)
    assert [[p.ref.offset for p in b.items] for _f, b in task.futures][1] == [1, 3]
    task.finish()
    assert sorted(a.ref.offset for a in task.collect(block=True)) == [0, 1, 2, 3]


def test_beside_a_yielding_task_each_batch_claims_the_gpu_until_its_outcome() -> None:
    from worker.tasks.gpu_share import GpuShare

    share = GpuShare(max_wait_s=1.0)
    task = _task()
    task.share_gpu(share, yields=False)
    task.admit(_batch(_record(0), _record(1), _record(2), _record(3)))
    task.schedule(time.monotonic(), NOW_MS, free=2, force=True)
    assert task.in_flight() == 1 and share.claims == 1
    task.finish()
    assert share.claims == 0
    task.yield_gpu()  # (not a yielding task: never waits)
    assert share.yields == 0


def test_a_yielding_task_claims_nothing_and_waits_for_claims() -> None:
    from worker.tasks.gpu_share import GpuShare

    share = GpuShare(max_wait_s=0.05)
    task = _task()
    task.share_gpu(share, yields=True)
    task.admit(_batch(_record(0), _record(1), _record(2), _record(3)))
    task.schedule(time.monotonic(), NOW_MS, free=2, force=True)
    assert task.in_flight() == 1 and share.claims == 0
    share.claim()
    task.yield_gpu()
    assert share.yields == 1
