"""Backpressure holds the intake back on held records or on their bytes, takes it up again when
both are low, and while holding back lets one consume() call through per keepalive period."""

from __future__ import annotations

from worker.config import load_config
from worker.loop.backpressure import KEEPALIVE_S, Backpressure
from worker.loop.stats import Stats

MIB = 1024 * 1024


def _bp() -> Backpressure:
    cfg = load_config(None, batch={"high_watermark": 100, "low_watermark": 10,
                                   "high_watermark_bytes": 64 * MIB,
                                   "low_watermark_bytes": 16 * MIB})
    return Backpressure(cfg.batch, Stats())


def test_a_few_large_records_hold_back_by_bytes() -> None:
    bp = _bp()
    bp.update(3, 30 * MIB)
    assert not bp.paused
    bp.update(3, 75 * MIB)  # three 25 MiB jobs: far under the job watermark
    assert bp.paused
    bp.update(0, 20 * MIB)  # no records left by count, but bytes still above low
    assert bp.paused
    bp.update(0, 10 * MIB)
    assert not bp.paused


def test_the_job_count_still_holds_back_on_its_own() -> None:
    bp = _bp()
    bp.update(100, 1 * MIB)
    assert bp.paused
    bp.update(50, 1 * MIB)
    assert bp.paused  # above the low job watermark
    bp.update(10, 1 * MIB)
    assert not bp.paused
    assert bp._stats.pauses == 1


def test_held_back_consume_runs_once_per_keepalive_period_only() -> None:
    bp = _bp()
    assert all(bp.consume_now(t) for t in (0.0, 0.001, 0.002))  # taking records: every step
    bp.update(100, 0)
    # Held back: the step right after may consume (the last call was 2 ms ago: not yet due).
    assert not bp.consume_now(0.003)
    assert not bp.consume_now(0.002 + KEEPALIVE_S * 0.9)
    assert bp.consume_now(0.002 + KEEPALIVE_S)  # serves librdkafka's callbacks
    assert not bp.consume_now(0.003 + KEEPALIVE_S)
    bp.update(0, 0)
    assert bp.consume_now(0.004 + KEEPALIVE_S)  # taken up again: every step
