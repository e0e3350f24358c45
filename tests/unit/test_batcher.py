"""worker.batcher.FifoBatcher: full or max-delay releases, FIFO order, removal by predicate.

Time is passed in explicitly (``now``); nothing here sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from worker.batcher import FifoBatcher


@dataclass(frozen=True)
class Item:
    name: str
    consumed_at: float
    partition: int = 0


def _filled(batcher: FifoBatcher[Item], n: int, t0: float = 100.0) -> list[Item]:
    items = [Item(f"i{k}", t0 + k * 0.001, partition=k % 2) for k in range(n)]
    for item in items:
        batcher.add(item)
    return items


def test_max_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_size"):
        FifoBatcher(0, 0.02)


def test_empty_batcher_releases_nothing_even_when_forced() -> None:
    b: FifoBatcher[Item] = FifoBatcher(4, 0.02)
    assert b.take(1e9) is None
    assert b.take(1e9, force=True) is None


def test_partial_young_batch_is_held() -> None:
    b: FifoBatcher[Item] = FifoBatcher(4, 0.02)
    _filled(b, 3)
    assert b.take(100.0) is None
    assert len(b) == 3


def test_full_batch_is_released_at_once() -> None:
    b: FifoBatcher[Item] = FifoBatcher(4, 10.0)
    items = _filled(b, 4)
    assert b.take(100.0) == items
    assert len(b) == 0


def test_only_max_size_items_are_released_per_take() -> None:
    b: FifoBatcher[Item] = FifoBatcher(4, 10.0)
    items = _filled(b, 10)
    assert b.take(100.0) == items[:4]
    assert b.take(100.0) == items[4:8]
    assert b.take(100.0) is None  # two left, young, not full
    assert len(b) == 2


def test_partial_batch_is_released_when_its_oldest_item_reaches_max_delay() -> None:
    b: FifoBatcher[Item] = FifoBatcher(8, 0.020)
    b.add(Item("old", 10.000))
    b.add(Item("young", 10.015))
    assert b.take(10.0199) is None
    assert [i.name for i in b.take(10.020)] == ["old", "young"]


def test_delay_is_measured_from_the_oldest_item_not_the_newest() -> None:
    b: FifoBatcher[Item] = FifoBatcher(8, 0.020)
    b.add(Item("old", 10.000))
    assert b.take(10.010) is None
    b.add(Item("new", 10.019))
    assert b.take(10.021) is not None


def test_zero_max_delay_releases_any_queued_item() -> None:
    b: FifoBatcher[Item] = FifoBatcher(8, 0.0)
    b.add(Item("a", 5.0))
    assert b.take(5.0) == [Item("a", 5.0)]


def test_force_releases_a_young_partial_batch() -> None:
    b: FifoBatcher[Item] = FifoBatcher(8, 60.0)
    items = _filled(b, 3)
    assert b.take(100.0, force=True) == items
    assert len(b) == 0


def test_force_still_caps_at_max_size() -> None:
    b: FifoBatcher[Item] = FifoBatcher(2, 60.0)
    items = _filled(b, 5)
    assert b.take(0.0, force=True) == items[:2]
    assert len(b) == 3


def test_fifo_order_is_preserved_across_batches() -> None:
    b: FifoBatcher[Item] = FifoBatcher(3, 60.0)
    items = _filled(b, 7)
    released: list[Item] = []
    while (batch := b.take(1e9)) is not None:
        released.extend(batch)
    assert released == items


def test_remove_drops_matching_items_and_keeps_the_rest_in_order() -> None:
    b: FifoBatcher[Item] = FifoBatcher(100, 60.0)
    items = _filled(b, 6)  # partitions 0,1,0,1,0,1
    dropped = b.remove(lambda i: i.partition == 1)
    assert dropped == [items[1], items[3], items[5]]
    assert len(b) == 3
    assert b.take(0.0, force=True) == [items[0], items[2], items[4]]


def test_remove_matching_nothing_changes_nothing() -> None:
    b: FifoBatcher[Item] = FifoBatcher(100, 60.0)
    items = _filled(b, 3)
    assert b.remove(lambda i: False) == []
    assert b.take(0.0, force=True) == items


def test_remove_of_the_oldest_item_restarts_the_delay_clock() -> None:
    b: FifoBatcher[Item] = FifoBatcher(100, 0.020)
    b.add(Item("old", 10.000, partition=1))
    b.add(Item("young", 10.015, partition=0))
    b.remove(lambda i: i.partition == 1)
    assert b.take(10.025) is None  # "young" has waited only 10 ms
    assert b.take(10.035) == [Item("young", 10.015, partition=0)]
