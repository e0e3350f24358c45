"""The per-partition watermark: out-of-order completion, gaps, what a checkpoint may claim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.tools.replay.ledger import PartitionLedger


def test_watermark_waits_for_the_lowest_open_offset() -> None:
    lg = PartitionLedger.fresh(10, 15)
    for off in range(10, 15):
        lg.begin(off)
    lg.handle(12, "result:ok")
    lg.handle(14, "rejected:schema")
    assert lg.advance(None) == 10 and lg.done == {12: "result:ok", 14: "rejected:schema"}
    lg.handle(10, "result:ok")
    assert lg.advance(None) == 11
    lg.handle(11, "result:ok")
    assert lg.advance(None) == 13, "12 was already handled"
    assert dict(lg.counts) == {"result:ok": 3} and lg.done == {14: "rejected:schema"}
    assert lg.is_done(11) and lg.is_done(14) and not lg.is_done(13)
    assert lg.remaining() == 1 and not lg.finished
    lg.handle(13, "result:error")
    assert lg.advance(None) == 15 and lg.finished and lg.done == {}
    assert dict(lg.totals()) == {"result:ok": 3, "rejected:schema": 1, "result:error": 1}


def test_position_skips_gaps_and_is_clamped_to_the_end() -> None:
    lg = PartitionLedger.fresh(0, 10)
    lg.begin(0)
    lg.handle(0, "result:ok")
    # The consumer returned 0 and then skipped 1..3 (e.g. transaction markers): position 4.
    assert lg.advance(4) == 4
    assert lg.advance(-1001) == 4, "an invalid position never moves the watermark back"
    assert lg.advance(99) == 10 and lg.finished


def test_position_is_ignored_while_records_are_open() -> None:
    lg = PartitionLedger.fresh(0, 10)
    lg.begin(0)
    lg.begin(1)
    lg.handle(1, "result:ok")
    assert lg.advance(2) == 0


def test_handle_is_idempotent() -> None:
    lg = PartitionLedger.fresh(0, 3)
    lg.begin(1)
    lg.handle(1, "result:ok")
    lg.handle(1, "dlq:schema")
    assert lg.done == {1: "result:ok"}
    lg.begin(0)
    lg.handle(0, "result:ok")
    lg.advance(None)
    lg.handle(0, "result:ok")  # below the watermark: already counted
    assert sum(lg.totals().values()) == 2


@given(st.permutations(list(range(20))), st.integers(min_value=0, max_value=19))
def test_any_completion_order_never_claims_unhandled_work(order: list[int], cut: int) -> None:
    lg = PartitionLedger.fresh(100, 120)
    for off in range(100, 120):
        lg.begin(off)
    handled: set[int] = set()
    for i, rel in enumerate(order):
        lg.handle(100 + rel, "result:ok")
        handled.add(100 + rel)
        if i == cut:
            nxt = lg.advance(None)
            assert all(o in handled for o in range(100, nxt))
            assert set(lg.done) <= handled and all(o >= nxt for o in lg.done)
    assert lg.advance(None) == 120 and lg.totals()["result:ok"] == 20
