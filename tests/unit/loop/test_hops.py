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


def test_answered_records_queue_engine_and_output_of_answers_the_engine_ran() -> None:
    from types import SimpleNamespace as A

    hops = HopTimes()
    ran = [A(consumed_at=1.0, batched_at=1.5, done_at=2.0 + i) for i in range(3)]
    rejected = A(consumed_at=1.0, batched_at=0.0, done_at=0.0)  # never reached the engine
    hops.answered([*ran, rejected])
    s = hops.summary()
    assert set(s) == {"queue", "engine", "output"}
    assert s["queue"]["n"] == s["engine"]["n"] == s["output"]["n"] == 3
    assert s["queue"]["p50_ms"] == 500.0 and s["engine"]["p99_ms"] == 2500.0
    # The histograms count what the windows hold.
    assert sum(hops.buckets["engine"].counts) == 3
    assert abs(hops.buckets["engine"].sum - (0.5 + 1.5 + 2.5)) < 1e-9
