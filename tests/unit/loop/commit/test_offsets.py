"""worker.loop.commit.offsets.OffsetTracker: commit only up to the lowest offset still in flight."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.loop.commit.offsets import OffsetTracker

TP = ("jobs", 0)


def _begin(t: OffsetTracker, offsets: range | list[int], tp: tuple[str, int] = TP) -> None:
    for o in offsets:
        t.begin(*tp, o)


def _finish(t: OffsetTracker, offsets: range | list[int], tp: tuple[str, int] = TP) -> None:
    for o in offsets:
        assert t.finish(*tp, o), f"finish({o}) refused"


def test_in_order_completion_commits_one_past_each_finished_offset() -> None:
    t = OffsetTracker()
    _begin(t, range(3))
    for o in range(3):
        _finish(t, [o])
        assert t.committable() == {TP: o + 1}


def test_out_of_order_completion_commits_only_up_to_the_lowest_unfinished() -> None:
    t = OffsetTracker()
    _begin(t, range(10))
    _finish(t, range(5, 10))
    assert t.committable() == {TP: 0}
    _finish(t, range(4))
    assert t.committable() == {TP: 4}
    _finish(t, [4])
    assert t.committable() == {TP: 10}


def test_nothing_finished_yet_points_at_the_first_consumed_offset() -> None:
    t = OffsetTracker()
    _begin(t, range(100, 105))
    assert t.committable() == {TP: 100}


def test_untracked_tracker_has_nothing_to_commit() -> None:
    t = OffsetTracker()
    assert t.committable() == {}
    assert t.pending() == 0


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    a, b, c = ("jobs", 0), ("jobs", 1), ("other", 0)
    _begin(t, range(5), a)
    _begin(t, range(100, 103), b)
    _begin(t, range(7, 9), c)
    _finish(t, [0, 1], a)
    _finish(t, [101], b)
    _finish(t, [7, 8], c)
    assert t.committable() == {a: 2, b: 100, c: 9}
    assert t.committable([b]) == {b: 100}
    assert t.pending() == 3 + 2 + 0
    assert t.pending([a]) == 3


def test_same_offset_on_another_partition_is_not_finished() -> None:
    t = OffsetTracker()
    _begin(t, [5], ("jobs", 0))
    _begin(t, [5], ("jobs", 1))
    _finish(t, [5], ("jobs", 0))
    assert t.committable() == {("jobs", 0): 6, ("jobs", 1): 5}


def test_mark_committed_suppresses_repeats_until_the_position_moves() -> None:
    t = OffsetTracker()
    _begin(t, range(4))
    _finish(t, [0, 1])
    positions = t.committable()
    assert positions == {TP: 2}
    t.mark_committed(positions)
    assert t.committable() == {}
    _finish(t, [3])  # out of order: the position does not move
    assert t.committable() == {}
    _finish(t, [2])
    assert t.committable() == {TP: 4}


def test_mark_committed_for_an_unknown_partition_is_ignored() -> None:
    t = OffsetTracker()
    t.mark_committed({("gone", 3): 10})
    assert t.committable() == {}


def test_finish_of_an_unknown_or_repeated_offset_returns_false() -> None:
    t = OffsetTracker()
    _begin(t, [0, 1])
    assert t.finish(*TP, 7) is False
    assert t.finish(*TP, 0) is True
    assert t.finish(*TP, 0) is False
    assert t.committable() == {TP: 1}


def test_finish_on_a_dropped_partition_returns_false_and_does_not_resurrect_it() -> None:
    t = OffsetTracker()
    keep, revoked = ("jobs", 0), ("jobs", 1)
    _begin(t, range(3), keep)
    _begin(t, range(3), revoked)
    t.drop([revoked])
    assert t.finish(*revoked, 0) is False
    assert revoked not in t.committable()
    assert t.committable([revoked]) == {}
    assert t.pending([revoked]) == 0
    assert t.pending() == 3  # the kept partition is untouched
    t.mark_committed({revoked: 1})
    assert revoked not in t.committable()


def test_dropping_an_untracked_partition_is_harmless() -> None:
    t = OffsetTracker()
    _begin(t, [0])
    t.drop([("never", 9)])
    assert t.committable() == {TP: 0}


def test_begin_after_drop_starts_afresh() -> None:
    t = OffsetTracker()
    _begin(t, range(10))
    _finish(t, range(10))
    t.mark_committed(t.committable())
    t.drop([TP])
    _begin(t, [42])  # reassigned later, starting elsewhere
    assert t.committable() == {TP: 42}


def test_rewind_discards_older_bookkeeping() -> None:
    t = OffsetTracker()
    _begin(t, range(10))
    _finish(t, [0, 1, 5])
    t.begin(*TP, 3)  # seek back / re-delivery from 3
    assert t.pending() == 1
    assert t.committable() == {TP: 3}
    assert t.finish(*TP, 4) is False  # begun before the rewind: void
    _begin(t, range(4, 6))
    _finish(t, [3, 4, 5])
    assert t.committable() == {TP: 6}


def test_rewind_after_everything_finished_moves_the_position_back() -> None:
    t = OffsetTracker()
    _begin(t, range(5))
    _finish(t, range(5))
    t.mark_committed(t.committable())
    t.begin(*TP, 2)
    assert t.committable() == {TP: 2}


def test_redelivery_of_the_same_offset_counts_once() -> None:
    t = OffsetTracker()
    _begin(t, [7])
    _begin(t, [7])
    assert t.pending() == 1
    _finish(t, [7])
    assert t.committable() == {TP: 8}


def test_pending_counts_begun_minus_finished() -> None:
    t = OffsetTracker()
    _begin(t, range(6))
    assert t.pending() == 6
    _finish(t, [5, 0, 2])
    assert t.pending() == 3
    _finish(t, [1, 3, 4])
    assert t.pending() == 0


def test_gaps_from_compaction_or_transaction_markers_are_skipped() -> None:
    t = OffsetTracker()
    _begin(t, [10, 12, 15])
    _finish(t, [12])
    assert t.committable() == {TP: 10}
    _finish(t, [10])
    assert t.committable() == {TP: 15}
    _finish(t, [15])
    assert t.committable() == {TP: 16}


# --- properties ---------------------------------------------------------------------------------


def _check_invariant(pos: int, begun: list[int], unfinished: set[int]) -> None:
    if unfinished:
        assert pos == min(unfinished), "not the lowest unfinished offset"
    else:
        assert pos == max(begun) + 1


@settings(max_examples=300, deadline=None, database=None)
@given(
    offsets=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=60,
                     unique=True).map(sorted),
    data=st.data(),
)
def test_any_finish_order_never_commits_past_an_unfinished_offset(
    offsets: list[int], data: st.DataObject
) -> None:
    t = OffsetTracker()
    _begin(t, offsets)
    order = data.draw(st.permutations(offsets))
    unfinished = set(offsets)
    committed = offsets[0]
    t.mark_committed({TP: committed})
    for o in order:
        assert t.finish(*TP, o)
        unfinished.discard(o)
        positions = t.committable()
        if positions:
            assert positions[TP] > committed  # commits only move forward
            committed = positions[TP]
            t.mark_committed(positions)
        _check_invariant(committed, offsets, unfinished)
        assert t.pending() == len(unfinished)


@pytest.mark.parametrize("seed", range(50))
def test_random_interleavings_of_begin_and_finish_keep_the_invariant(seed: int) -> None:
    rng = random.Random(seed)
    t = OffsetTracker()
    next_offset = rng.randrange(100)
    begun: list[int] = []
    unfinished: set[int] = set()
    for _ in range(300):
        if unfinished and rng.random() < 0.5:
            o = rng.choice(sorted(unfinished))
            assert t.finish(*TP, o)
            unfinished.discard(o)
        else:
            next_offset += rng.choice((1, 1, 1, 2, 5))  # gaps now and then
            t.begin(*TP, next_offset)
            begun.append(next_offset)
            unfinished.add(next_offset)
        _check_invariant(t.committable()[TP], begun, unfinished)
        assert t.pending() == len(unfinished)


def test_held_bytes_follow_begin_finish_rewind_and_drop() -> None:
    t = OffsetTracker()
    t.begin("jobs", 0, 0, 1000)
    t.begin("jobs", 0, 1, 2000)
    t.begin("jobs", 1, 0, 500)
    assert t.held_bytes() == 3500
    t.finish("jobs", 0, 1)
    t.finish("jobs", 0, 1)  # twice: counted once
    assert t.held_bytes() == 1500
    t.rewind(("jobs", 0))
    assert t.held_bytes() == 500
    t.begin("jobs", 1, 0, 700)  # re-delivered from the start: older bookkeeping void
    assert t.held_bytes() == 700
    t.drop([("jobs", 1)])
    assert t.held_bytes() == 0


@pytest.mark.parametrize("seed", range(30))
def test_finish_many_leaves_the_tracker_as_one_finish_per_record_does(seed: int) -> None:
    """Batches of delivery reports: several partitions interleaved, repeats, records of a
    dropped partition and offsets never begun."""
    from worker.wire.records import SourceRef

    rng = random.Random(seed)
    one, many = OffsetTracker(), OffsetTracker()
    keys = [("jobs", p) for p in range(3)]
    begun = {k: [o for o in range(40) if rng.random() < 0.8] for k in keys}
    for t in (one, many):
        for k, offsets in begun.items():
            for o in offsets:
                t.begin(*k, o, o + 10)
        t.drop([keys[2]])
    for _ in range(6):
        batch = [SourceRef(*rng.choice(keys), rng.randrange(45)) for _ in range(rng.randrange(30))]
        for ref in batch:
            one.finish(ref.topic, ref.partition, ref.offset)
        many.finish_many(batch)
        assert many.committable() == one.committable()
        assert many.pending() == one.pending() and many.held_bytes() == one.held_bytes()
