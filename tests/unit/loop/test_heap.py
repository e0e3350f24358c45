"""The collector policy: applied once warm, restored when the last worker in the process stops,
every collection's pause recorded by generation."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker.config import GcSettings
from worker.loop import heap
from worker.loop.heap import HeapPolicy


@pytest.fixture(autouse=True)
def python_defaults(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no holder (whatever ran before in this process) and leaves the
    collector as it found it, even when it fails between settle and release."""
    before = gc.get_threshold()
    monkeypatch.setattr(heap, "_holders", 0)
    monkeypatch.setattr(heap, "_frozen", False)
    monkeypatch.setattr(heap, "_saved_threshold", None)
    hooks = list(gc.callbacks)
    yield
    if heap._holders:  # a test stopped half-way: undo what its settle applied
        gc.unfreeze()
    gc.callbacks[:] = hooks
    gc.set_threshold(*before)


def test_settle_freezes_the_heap_and_raises_the_young_threshold_until_release() -> None:
    before = gc.get_threshold()
    policy = HeapPolicy(GcSettings(young_threshold=12_345))
    policy.settle()
    assert gc.get_freeze_count() > 1000  # the interpreter and pytest, at least
    assert gc.get_threshold() == (12_345, *before[1:])
    policy.release()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_side_by_side_workers_restore_python_only_when_the_last_one_stops() -> None:
    before = gc.get_threshold()
    first, second = HeapPolicy(GcSettings()), HeapPolicy(GcSettings(young_threshold=99))
    first.settle()
    second.settle()  # the first one's settings stand
    assert gc.get_threshold()[0] == GcSettings().young_threshold
    first.release()
    assert gc.get_threshold()[0] == GcSettings().young_threshold
    assert gc.get_freeze_count() > 0
    second.release()
    second.release()  # twice is harmless
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_every_collection_is_recorded_by_generation_and_not_after_release() -> None:
    policy = HeapPolicy(GcSettings(freeze_after_warm_up=False, young_threshold=0))
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    gc.disable()  # only the collections below (explicit ones still run and call the hooks)
    try:
        assert policy.settle() >= 0
        assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
        gc.collect(1)
        gc.collect()
        assert policy.pauses["1"].count == 1 and policy.pauses["2"].count == 1
        assert policy.pauses["0"].count == 0 and policy.pauses["2"].sum > 0
        policy.release()
        gc.collect()
        assert policy.pauses["2"].count == 1
    finally:
        gc.enable()


def test_a_collection_already_running_when_the_hook_arrives_is_not_recorded() -> None:
    # Its stop comes without a start: recording it would add the whole uptime as a pause.
    policy = HeapPolicy(GcSettings(freeze_after_warm_up=False, young_threshold=0))
    policy._on_gc("stop", {"generation": 2})
    assert policy.pauses["2"].count == 0
    policy._on_gc("start", {"generation": 2})
    policy._on_gc("stop", {"generation": 2})
    assert policy.pauses["2"].count == 1 and policy.pauses["2"].sum < 1.0


def test_a_settle_that_fails_half_way_leaves_no_policy_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = gc.set_threshold
    wanted = GcSettings().young_threshold

    def refuse(*threshold: int) -> None:  # the new value refused, the old one restored
        if threshold[0] == wanted:
            raise OverflowError("threshold too large")
        real(*threshold)

    before = gc.get_threshold()
    monkeypatch.setattr(gc, "set_threshold", refuse)
    policy = HeapPolicy(GcSettings())
    with pytest.raises(OverflowError):
        policy.settle()
    assert heap._holders == 0 and gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_a_frozen_heap_leaves_full_collections_less_to_walk() -> None:
    # What the freeze is for: the objects alive once warm are no longer walked.
    keep = [[i] for i in range(200_000)]  # a warm heap's worth of tracked containers
    policy = HeapPolicy(GcSettings(young_threshold=0))
    policy.settle()
    try:
        frozen = gc.get_freeze_count()
        assert frozen >= len(keep)
        assert sum(len(gc.get_objects(g)) for g in range(3)) < frozen / 10
    finally:
        policy.release()
    assert sum(len(gc.get_objects(g)) for g in range(3)) >= len(keep)
