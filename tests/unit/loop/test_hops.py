"""worker.loop.hops.HopTimes: bounded windows, p50 / p99 in milliseconds."""

from __future__ import annotations

from worker.loop.hops import HOPS, HopTimes


def test_summary_gives_p50_and_p99_in_ms_per_hop_with_samples() -> None:
    hops = HopTimes()
    for i in range(1, 101):  # 1..100 ms
        hops.add("engine", i / 1e3)
    hops.add("delivery", 0.004)
    s = hops.summary()
    assert set(s) == {"engine", "delivery"}  # hops without samples are left out
    assert s["engine"]["n"] == 100
    assert s["engine"]["p50_ms"] == 51.0 and s["engine"]["p99_ms"] == 100.0
    assert s["delivery"] == {"n": 1, "p50_ms": 4.0, "p99_ms": 4.0}


def test_windows_keep_only_the_most_recent_samples() -> None:
    hops = HopTimes(keep=10)
    for i in range(100):
        hops.add("queue", float(i))
    s = hops.summary()["queue"]
    assert s["n"] == 10 and s["p50_ms"] == 95_000.0  # samples 90..99 s remain


def test_every_hop_the_loop_reports_is_known() -> None:
    assert HOPS == ("intake", "queue", "engine", "output", "delivery")
