"""Backpressure pauses on held records or on their bytes, and resumes when both are low."""

from __future__ import annotations

from worker.config import load_config
from worker.loop.backpressure import Backpressure
from worker.loop.stats import Stats

MIB = 1024 * 1024


class _Consumer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def assignment(self) -> list[object]:
        return ["tp"]

    def pause(self, _tps: list[object]) -> None:
        self.calls.append("pause")

    def resume(self, _tps: list[object]) -> None:
        self.calls.append("resume")


def _bp() -> tuple[Backpressure, _Consumer]:
    cfg = load_config(None, batch={"high_watermark": 100, "low_watermark": 10,
                                   "high_watermark_bytes": 64 * MIB,
                                   "low_watermark_bytes": 16 * MIB})
    consumer = _Consumer()
    return Backpressure(consumer, cfg.batch, Stats()), consumer  # type: ignore[arg-type]


def test_a_few_large_records_pause_by_bytes() -> None:
    bp, consumer = _bp()
    bp.update(3, 30 * MIB)
    assert not bp.paused
    bp.update(3, 75 * MIB)  # three 25 MiB jobs: far under the job watermark
    assert bp.paused and consumer.calls == ["pause"]
    bp.update(0, 20 * MIB)  # no records left by count, but bytes still above low
    assert bp.paused
    bp.update(0, 10 * MIB)
    assert not bp.paused and consumer.calls == ["pause", "resume"]


def test_the_job_count_still_pauses_on_its_own() -> None:
    bp, consumer = _bp()
    bp.update(100, 1 * MIB)
    assert bp.paused
    bp.update(50, 1 * MIB)
    assert bp.paused  # above the low job watermark
    bp.update(10, 1 * MIB)
    assert consumer.calls == ["pause", "resume"]
