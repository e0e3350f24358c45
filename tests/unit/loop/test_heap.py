"""The collector policy: applied once warm, restored when the last worker in the process stops,
every collection's pause recorded by generation."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker.config import GcSettings
from worker.loop.heap import HeapPolicy


@pytest.fixture(autouse=True)
def python_defaults() -> Iterator[None]:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
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
    assert policy.settle() >= 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.collect(1)
    gc.collect()
    assert policy.pauses["1"].count == 1 and policy.pauses["2"].count == 1
    assert policy.pauses["2"].sum > 0
    policy.release()
    gc.collect()
    assert policy.pauses["2"].count == 1


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
