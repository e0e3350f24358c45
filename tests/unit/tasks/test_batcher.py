"""worker.tasks.batcher.DynamicBatcher: fill, delay, deadline, padding, fairness and budget
rules.

Time is passed in explicitly (``now`` monotonic seconds, ``now_ms`` epoch ms); nothing here
sleeps.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from engines.profiles import RangeProfile, StaticProfile
from worker.tasks.batcher import Batch, DynamicBatcher, NoProfileFits

SHAPE = (224, 224, 3)
STATIC = StaticProfile("gpu", SHAPE, (1, 8, 32))
RANGE = RangeProfile("cpu", SHAPE, SHAPE, SHAPE, min_batch=1, opt_batch=8, max_batch=64)
NOW_MS = 1_800_000_000_000


@dataclass(frozen=True)
class Item:
    name: str
    consumed_at: float = 0.0
    partition_key: Hashable = ("jobs", 0)
    deadline_ms: int | None = None
    item_shape: tuple[int, ...] = SHAPE
    weight: int = 1


def _batcher(
    *profiles: StaticProfile | RangeProfile, size: int = 16, delay: float = 0.020,
    pad: float = 0.5,
) -> DynamicBatcher[Item]:
    return DynamicBatcher(profiles or (RANGE,), max_batch_size=size, max_delay_s=delay,
                          max_pad_fraction=pad)


def _add(b: DynamicBatcher[Item], n: int, *, t0: float = 10.0, partition: int = 0,
         prefix: str = "i") -> list[Item]:
    items = [Item(f"{prefix}{k}", t0 + k * 1e-4, ("jobs", partition)) for k in range(n)]
    for item in items:
        b.add(item)
    return items


def _names(batch: Batch[Item]) -> list[str]:
    return [i.name for i in batch.items]


# --- construction and routing -------------------------------------------------------------------


def test_at_least_one_profile_is_required() -> None:
    with pytest.raises(ValueError, match="profile"):
        DynamicBatcher((), max_batch_size=8, max_delay_s=0.01)


def test_max_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher((RANGE,), max_batch_size=0, max_delay_s=0.01)


def test_add_routes_to_the_first_profile_that_fits() -> None:
    small = StaticProfile("small", (64, 64, 3), (1, 4))
    b = _batcher(small, RANGE)
    assert b.add(Item("a", item_shape=(64, 64, 3))) == small
    assert b.add(Item("b")) == RANGE
    assert len(b) == 2


def test_item_no_profile_accepts_is_refused_and_not_queued() -> None:
    b = _batcher(STATIC)
    with pytest.raises(NoProfileFits, match=r"\(3, 224, 224\)"):
        b.add(Item("nchw", item_shape=(3, 224, 224)))
    assert isinstance(NoProfileFits("x"), ValueError)
    assert len(b) == 0


def test_empty_batcher_schedules_nothing_even_when_forced() -> None:
    out = _batcher().schedule(1e9, NOW_MS, limit=4, force=True)
    assert out.batches == [] and out.expired == []


# --- fill ---------------------------------------------------------------------------------------


def test_partial_young_batch_is_held() -> None:
    b = _batcher(size=4)
    _add(b, 3)
    out = b.schedule(10.001, NOW_MS, limit=4)
    assert out.batches == []
    assert len(b) == 3


def test_full_batch_is_released_at_once() -> None:
    b = _batcher(size=4, delay=60.0)
    items = _add(b, 4)
    (batch,) = b.schedule(10.0, NOW_MS, limit=4).batches
    assert batch.items == items
    assert batch.profile == RANGE
    assert len(b) == 0


def test_fill_level_is_the_smaller_of_max_batch_size_and_the_profile_max() -> None:
    b = _batcher(StaticProfile("s", SHAPE, (1, 4)), size=64, delay=60.0)
    items = _add(b, 5)
    (batch,) = b.schedule(10.0, NOW_MS, limit=4).batches
    assert batch.items == items[:4] and batch.padded_size == 4
    assert len(b) == 1


def test_several_full_batches_are_released_up_to_the_limit() -> None:
    b = _batcher(size=4, delay=60.0)
    items = _add(b, 13)
    out = b.schedule(10.0, NOW_MS, limit=2)
    assert [batch.items for batch in out.batches] == [items[0:4], items[4:8]]
    assert len(b) == 5
    out = b.schedule(10.0, NOW_MS, limit=5)
    assert [batch.items for batch in out.batches] == [items[8:12]]  # one young item waits
    assert len(b) == 1


def test_limit_zero_releases_nothing() -> None:
    b = _batcher(size=4)
    _add(b, 8)
    assert b.schedule(1e9, NOW_MS, limit=0, force=True).batches == []
    assert len(b) == 8


# --- delay --------------------------------------------------------------------------------------


def test_partial_batch_is_released_when_its_oldest_item_reaches_max_delay() -> None:
    # Binary-exact times (quarters), so "waited == max_delay" is tested exactly.
    b = _batcher(size=8, delay=0.25)
    b.add(Item("old", 10.0))
    b.add(Item("young", 10.125))
    assert b.schedule(10.2499, NOW_MS, limit=4).batches == []
    (batch,) = b.schedule(10.25, NOW_MS, limit=4).batches
    assert _names(batch) == ["old", "young"]


def test_delay_counts_from_the_oldest_item_of_any_partition() -> None:
    b = _batcher(size=8, delay=0.020)
    b.add(Item("young-p0", 10.015, ("jobs", 0)))
    b.add(Item("old-p1", 10.000, ("jobs", 1)))
    assert len(b.schedule(10.021, NOW_MS, limit=4).batches) == 1


def test_zero_max_delay_releases_any_queued_item() -> None:
    b = _batcher(size=8, delay=0.0)
    b.add(Item("a", 5.0))
    (batch,) = b.schedule(5.0, NOW_MS, limit=1).batches
    assert _names(batch) == ["a"]


def test_force_releases_a_young_partial_batch() -> None:
    b = _batcher(size=8, delay=60.0)
    items = _add(b, 3)
    (batch,) = b.schedule(10.0, NOW_MS, limit=1, force=True).batches
    assert batch.items == items


def test_force_still_caps_at_the_fill_level() -> None:
    b = _batcher(size=2, delay=60.0)
    items = _add(b, 5)
    out = b.schedule(10.0, NOW_MS, limit=10, force=True)
    assert [x.items for x in out.batches] == [items[0:2], items[2:4], items[4:5]]


def test_removing_the_oldest_item_restarts_the_delay_clock() -> None:
    b = _batcher(size=8, delay=0.25)
    b.add(Item("old", 10.0, ("jobs", 1)))
    b.add(Item("young", 10.125, ("jobs", 0)))
    b.remove(lambda i: i.partition_key == ("jobs", 1))
    assert b.schedule(10.3, NOW_MS, limit=1).batches == []  # "old" would be due by now
    (batch,) = b.schedule(10.375, NOW_MS, limit=1).batches
    assert _names(batch) == ["young"]


# --- order and fairness -------------------------------------------------------------------------


def test_fifo_order_is_preserved_within_a_partition_across_batches() -> None:
    b = _batcher(size=3, delay=60.0)
    items = _add(b, 10)
    out = b.schedule(10.0, NOW_MS, limit=10, force=True)
    assert [i for batch in out.batches for i in batch.items] == items


def test_batches_take_partitions_round_robin() -> None:
    b = _batcher(size=4, delay=60.0)
    hot = _add(b, 10, partition=0, prefix="hot")
    quiet = _add(b, 2, t0=11.0, partition=1, prefix="quiet")
    (batch,) = b.schedule(11.0, NOW_MS, limit=1).batches
    assert batch.items == [hot[0], quiet[0], hot[1], quiet[1]]


def test_a_hot_partition_cannot_starve_a_quiet_one_over_several_batches() -> None:
    b = _batcher(size=4, delay=60.0)
    _add(b, 20, partition=0, prefix="hot")
    _add(b, 1, t0=20.0, partition=1, prefix="quiet")
    (first,) = b.schedule(20.0, NOW_MS, limit=1).batches
    assert "quiet0" in _names(first)


def test_per_partition_order_survives_round_robin() -> None:
    b = _batcher(size=5, delay=60.0)
    a = _add(b, 6, partition=0, prefix="a")
    c = _add(b, 6, partition=1, prefix="c")
    out = b.schedule(10.0, NOW_MS, limit=10, force=True)
    taken = [i for batch in out.batches for i in batch.items]
    assert [i for i in taken if i in a] == a
    assert [i for i in taken if i in c] == c


def test_oldest_profile_is_scheduled_first() -> None:
    small = StaticProfile("small", (64, 64, 3), (1, 2))
    b = _batcher(small, RANGE, size=2, delay=60.0)
    b.add(Item("big-new", 12.0))
    b.add(Item("big-new2", 12.1))
    b.add(Item("small-old", 11.0, item_shape=(64, 64, 3)))
    b.add(Item("small-old2", 11.1, item_shape=(64, 64, 3)))
    out = b.schedule(13.0, NOW_MS, limit=1)
    assert [x.profile for x in out.batches] == [small]


# --- deadlines ----------------------------------------------------------------------------------


def test_expired_item_is_returned_as_expired_never_batched() -> None:
    b = _batcher(size=4, delay=0.0)
    late = Item("late", 10.0, deadline_ms=NOW_MS - 1)
    fresh = Item("fresh", 10.0, deadline_ms=NOW_MS + 1_000)
    b.add(late)
    b.add(fresh)
    out = b.schedule(10.0, NOW_MS, limit=4)
    assert out.expired == [late]
    assert [x.items for x in out.batches] == [[fresh]]
    assert len(b) == 0


def test_with_expiry_off_a_late_item_is_batched_like_any_other() -> None:
    b = DynamicBatcher((RANGE,), max_batch_size=4, max_delay_s=0.0, expire_deadlines=False)
    b.add(Item("late", 10.0, deadline_ms=NOW_MS - 1))
    out = b.schedule(10.0, NOW_MS, limit=4)
    assert out.expired == [] and _names(out.batches[0]) == ["late"]


def test_item_exactly_at_its_deadline_is_still_batched() -> None:
    b = _batcher(size=1)
    b.add(Item("edge", 10.0, deadline_ms=NOW_MS))
    out = b.schedule(10.0, NOW_MS, limit=1)
    assert out.expired == [] and _names(out.batches[0]) == ["edge"]


def test_expired_items_do_not_take_a_batch_slot() -> None:
    b = _batcher(size=3, delay=60.0)
    b.add(Item("a", 10.0))
    b.add(Item("late", 10.1, deadline_ms=NOW_MS - 5))
    b.add(Item("b", 10.2))
    b.add(Item("c", 10.3))
    out = b.schedule(11.0, NOW_MS, limit=1)
    assert [i.name for i in out.expired] == ["late"]
    assert _names(out.batches[0]) == ["a", "b", "c"]


def test_a_queue_of_only_expired_items_yields_no_batch() -> None:
    b = _batcher(size=4, delay=0.0)
    for k in range(3):
        b.add(Item(f"late{k}", 10.0, deadline_ms=NOW_MS - 1))
    out = b.schedule(10.0, NOW_MS, limit=4)
    assert out.batches == [] and len(out.expired) == 3
    assert len(b) == 0


# --- padding ------------------------------------------------------------------------------------


def test_due_batch_is_padded_to_the_next_static_size_within_the_waste_limit() -> None:
    b = _batcher(STATIC, size=32, delay=0.020, pad=0.5)
    _add(b, 5)
    (batch,) = b.schedule(11.0, NOW_MS, limit=1).batches
    assert len(batch.items) == 5 and batch.padded_size == 8  # waste 3/8 <= 0.5


def test_too_wasteful_padding_takes_the_largest_full_size_instead() -> None:
    b = _batcher(STATIC, size=32, delay=0.020, pad=0.5)
    items = _add(b, 9)  # 9 -> 32 would waste 23/32
    first = b.schedule(11.0, NOW_MS, limit=1).batches[0]
    assert first.items == items[:8] and first.padded_size == 8
    assert len(b) == 1


def test_exact_static_size_needs_no_padding() -> None:
    b = _batcher(STATIC, size=32, delay=0.020)
    _add(b, 8)
    (batch,) = b.schedule(11.0, NOW_MS, limit=1).batches
    assert (len(batch.items), batch.padded_size) == (8, 8)


def test_range_profile_never_pads_beyond_its_minimum() -> None:
    b = _batcher(RangeProfile("r", SHAPE, SHAPE, SHAPE, 4, 8, 16), size=16, delay=0.0, pad=1.0)
    _add(b, 2)
    (batch,) = b.schedule(11.0, NOW_MS, limit=1).batches
    assert (len(batch.items), batch.padded_size) == (2, 4)
    b2 = _batcher(RANGE, size=64, delay=0.0)
    _add(b2, 13)
    (batch,) = b2.schedule(11.0, NOW_MS, limit=1).batches
    assert (len(batch.items), batch.padded_size) == (13, 13)


def test_padded_size_always_holds_the_items() -> None:
    for n in range(1, 40):
        b = _batcher(STATIC, size=32, delay=0.0, pad=0.5)
        _add(b, n)
        for batch in b.schedule(11.0, NOW_MS, limit=100).batches:
            assert batch.padded_size in STATIC.batch_sizes
            assert len(batch.items) <= batch.padded_size
            waste = (batch.padded_size - len(batch.items)) / batch.padded_size
            assert waste <= 0.5 or len(batch.items) < STATIC.batch_sizes[1], (n, batch)


def test_full_batch_also_respects_max_pad_fraction() -> None:
    b = _batcher(STATIC, size=16, delay=60.0, pad=0.25)
    _add(b, 16)
    (batch, *_rest) = b.schedule(10.0, NOW_MS, limit=1).batches
    waste = (batch.padded_size - len(batch.items)) / batch.padded_size
    assert waste <= 0.25


# --- removal ------------------------------------------------------------------------------------


def test_remove_drops_matching_items_and_keeps_the_rest_in_order() -> None:
    b = _batcher(size=100, delay=60.0)
    keep = _add(b, 3, partition=0, prefix="keep")
    gone = _add(b, 3, partition=1, prefix="gone")
    dropped = b.remove(lambda i: i.partition_key == ("jobs", 1))
    assert dropped == gone
    assert len(b) == 3
    (batch,) = b.schedule(10.0, NOW_MS, limit=1, force=True).batches
    assert batch.items == keep


def test_remove_across_profiles() -> None:
    small = StaticProfile("small", (64, 64, 3), (1, 8))
    b = _batcher(small, RANGE, delay=60.0)
    b.add(Item("s", item_shape=(64, 64, 3), partition_key="revoked"))
    b.add(Item("r", partition_key="revoked"))
    b.add(Item("k", partition_key="kept"))
    assert {i.name for i in b.remove(lambda i: i.partition_key == "revoked")} == {"s", "r"}
    out = b.schedule(10.0, NOW_MS, limit=5, force=True)
    assert [i.name for x in out.batches for i in x.items] == ["k"]


def test_remove_matching_nothing_changes_nothing() -> None:
    b = _batcher(size=100, delay=60.0)
    items = _add(b, 3)
    assert b.remove(lambda i: False) == []
    (batch,) = b.schedule(10.0, NOW_MS, limit=1, force=True).batches
    assert batch.items == items


# --- budget -------------------------------------------------------------------------------------


def _budgeted(budget: int = 16, size: int = 16, delay: float = 60.0) -> DynamicBatcher[Item]:
    return DynamicBatcher((RANGE,), max_batch_size=size, max_delay_s=delay,
                          weight=lambda i: i.weight, max_weight=budget)


def _weighed(b: DynamicBatcher[Item], weights: list[int], *, deadline_ms: int | None = None
             ) -> list[Item]:
    items = [Item(f"w{k}", 10.0 + k * 1e-4, weight=w, deadline_ms=deadline_ms)
             for k, w in enumerate(weights)]
    for item in items:
        b.add(item)
    return items


def test_light_jobs_fill_a_batch_up_to_the_budget() -> None:
    b = _budgeted(budget=16, size=16)
    items = _weighed(b, [1] * 16)
    (batch,) = b.schedule(10.0, NOW_MS, limit=4).batches
    assert batch.items == items


def test_a_batch_never_weighs_more_than_the_budget_and_the_next_job_waits_in_order() -> None:
    b = _budgeted(budget=16)
    items = _weighed(b, [8, 4, 8, 2, 1])
    out = b.schedule(10.0, NOW_MS, limit=4, force=True)
    # 8 + 4 = 12; the next (8) would make 20: it starts the next batch, the 2 is not pulled
    # ahead of it.
    assert [batch.items for batch in out.batches] == [items[0:2], items[2:5]]
    assert len(b) == 0


def test_a_profile_is_due_once_its_queued_jobs_weigh_the_budget() -> None:
    b = _budgeted(budget=16, size=16)
    _weighed(b, [8])
    assert b.schedule(10.0, NOW_MS, limit=4).batches == []  # young, light: held
    _weighed(b, [8])
    (batch,) = b.schedule(10.0, NOW_MS, limit=4).batches  # two jobs, far from size 16
    assert [i.weight for i in batch.items] == [8, 8]


def test_a_job_heavier_than_the_budget_goes_alone() -> None:
    b = _budgeted(budget=4)
    items = _weighed(b, [6, 1])
    out = b.schedule(10.0, NOW_MS, limit=4, force=True)
    assert [batch.items for batch in out.batches] == [items[0:1], items[1:2]]


def test_expired_jobs_weigh_nothing_in_the_batch() -> None:
    b = _budgeted(budget=8)
    late = _weighed(b, [8], deadline_ms=NOW_MS - 1)
    fresh = _weighed(b, [4, 4])
    out = b.schedule(10.0, NOW_MS, limit=4, force=True)
    assert out.expired == late
    assert [batch.items for batch in out.batches] == [fresh]


def test_removal_takes_its_weight_off_the_queue() -> None:
    b = _budgeted(budget=16)
    _weighed(b, [8, 8])
    b.remove(lambda i: i.name == "w1")
    assert b.schedule(10.0, NOW_MS, limit=4).batches == []  # 8 of 16 left: not due


def test_weight_and_max_weight_go_together() -> None:
    with pytest.raises(ValueError, match="go together"):
        DynamicBatcher((RANGE,), max_batch_size=4, max_delay_s=0.01, max_weight=4)
    with pytest.raises(ValueError, match="max_weight"):
        DynamicBatcher((RANGE,), max_batch_size=4, max_delay_s=0.01,
                       weight=lambda i: 1, max_weight=0)
