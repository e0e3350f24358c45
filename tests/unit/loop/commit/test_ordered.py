"""worker.loop.commit.ordered.OrderedRelease and OffsetTracker.rewind: the exactly-once bookkeeping.

The property that makes a transaction safe to commit with the tracker's positions: what has been
released (produced into the transaction) is always exactly the offsets below the position.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.loop.commit.offsets import OffsetTracker
from worker.loop.commit.ordered import OrderedRelease
from worker.loop.output import Output
from worker.wire.records import SourceRef

TP = ("jobs", 0)


def _out(offset: int, partition: int = 0) -> Output:
    return Output(SourceRef("jobs", partition, offset), "results", str(offset).encode(), b"v",
                  None, "result")


def _released(outs: list[Output]) -> list[int]:
    return [o.ref.offset for o in outs]


def test_an_output_above_an_unfinished_offset_waits_for_it() -> None:
    t = OffsetTracker()
    r = OrderedRelease(t)
    for o in range(4):
        t.begin(*TP, o)
    assert r.complete(_out(2)) == []
    assert r.complete(_out(1)) == []
    assert t.committable() == {TP: 0}, "nothing released, nothing committable"
    assert _released(r.complete(_out(0))) == [0, 1, 2]
    assert t.committable() == {TP: 3}
    assert len(r) == 0
    assert _released(r.complete(_out(3))) == [3]
    assert t.committable() == {TP: 4}


def test_partitions_release_independently() -> None:
    t = OffsetTracker()
    r = OrderedRelease(t)
    for p in (0, 1):
        for o in range(2):
            t.begin("jobs", p, o)
    assert r.complete(_out(1, partition=0)) == []
    assert _released(r.complete(_out(0, partition=1))) == [0]
    assert t.committable() == {("jobs", 0): 0, ("jobs", 1): 1}


def test_stale_outputs_are_never_released() -> None:
    t = OffsetTracker()
    r = OrderedRelease(t)
    t.begin(*TP, 0)
    assert r.complete(_out(7)) == [], "never begun"
    assert r.complete(_out(0, partition=5)) == [], "partition not tracked"
    assert len(r) == 0
    t.rewind(TP)
    assert r.complete(_out(0)) == [], "begun before a rewind: stale"


def test_drop_and_clear_forget_held_outputs() -> None:
    t = OffsetTracker()
    r = OrderedRelease(t)
    for o in range(3):
        t.begin(*TP, o)
    r.complete(_out(1))
    r.complete(_out(2))
    assert len(r) == 2
    assert r.drop([TP]) == 2 and len(r) == 0
    r.complete(_out(2))
    assert r.clear() == 1


def test_rewind_goes_back_to_the_last_committed_position() -> None:
    t = OffsetTracker()
    for o in range(10, 20):
        t.begin(*TP, o)
    for o in range(10, 15):
        t.finish(*TP, o)
    t.mark_committed(t.committable())
    for o in range(15, 18):
        t.finish(*TP, o)
    assert t.committable() == {TP: 18}
    assert t.rewind(TP) == 15
    assert t.pending() == 0 and t.committable() == {}
    # Re-consumed from the rewind point: normal bookkeeping again.
    assert t.begin(*TP, 15) is False
    t.finish(*TP, 15)
    assert t.committable() == {TP: 16}


def test_rewind_without_a_commit_goes_back_to_the_first_consumed_offset() -> None:
    t = OffsetTracker()
    for o in range(40, 45):
        t.begin(*TP, o)
        t.finish(*TP, o)
    assert t.rewind(TP) == 40
    assert t.rewind(("jobs", 9)) is None


def test_begin_reports_an_unexpected_backwards_jump() -> None:
    t = OffsetTracker()
    assert t.begin(*TP, 5) is False
    assert t.begin(*TP, 6) is False
    assert t.begin(*TP, 3) is True


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 2**32 - 1), partitions=st.integers(1, 3))
def test_released_is_always_exactly_the_prefix_below_the_position(n: int, seed: int,
                                                                 partitions: int) -> None:
    rng = random.Random(seed)
    t = OffsetTracker()
    r = OrderedRelease(t)
    offsets = {p: list(range(100, 100 + n)) for p in range(partitions)}
    for p, offs in offsets.items():
        for o in offs:
            t.begin("jobs", p, o)
    finishing = [(p, o) for p, offs in offsets.items() for o in offs]
    rng.shuffle(finishing)
    released: dict[int, list[int]] = {p: [] for p in offsets}
    for p, o in finishing:
        released[p].extend(_released(r.complete(_out(o, partition=p))))
        for q in offsets:
            pos = t.position(("jobs", q))
            assert pos is not None
            # In order, without gaps or repeats, and exactly up to the committable position.
            assert released[q] == list(range(100, pos)), (q, released[q], pos)
    assert all(released[p] == offsets[p] for p in offsets)
    assert len(r) == 0
