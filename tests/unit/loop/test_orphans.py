"""The orphan watch's decisions (worker/loop/orphans.py); the real group is in
tests/integration/delivery/test_orphaned_partitions.py."""

from __future__ import annotations

from typing import Any

from worker.loop.orphans import ESCALATE_CHECKS, MIN_GAP_S, OrphanWatch, orphaned


def _watch() -> OrphanWatch:
    return OrphanWatch({"bootstrap.servers": "unused:9"}, "g", "jobs", lambda: "m-1")


def test_orphaned_is_what_no_member_holds_of_that_topic() -> None:
    members = [[("jobs", 3), ("jobs", 4), ("other", 0)], [("jobs", 5)], []]
    assert orphaned(6, "jobs", members) == {0, 1, 2}
    assert orphaned(3, "jobs", [[("jobs", 0), ("jobs", 1), ("jobs", 2)]]) == set()
    assert orphaned(2, "jobs", []) == {0, 1}


def test_the_first_member_rejoins_after_two_checks_in_a_row() -> None:
    w = _watch()
    w.observe({0}, first=True)
    assert not w.due(0.0)
    w.observe({0}, first=True)
    assert w.due(0.0) and w.rejoins == 1
    assert not w.due(0.0), "once per finding"


def test_a_clean_check_starts_the_count_again() -> None:
    w = _watch()
    w.observe({0}, first=True)
    w.observe(set(), first=True)
    w.observe({0}, first=True)
    assert not w.due(0.0)


def test_other_members_rejoin_only_when_the_orphans_last() -> None:
    w = _watch()
    for _ in range(ESCALATE_CHECKS - 1):
        w.observe({2}, first=False)
    assert not w.due(0.0)
    w.observe({2}, first=False)
    assert w.due(0.0)


def test_rejoins_are_spaced_by_the_minimum_gap() -> None:
    w = _watch()
    w.observe({1}, first=True)
    w.observe({1}, first=True)
    assert w.due(100.0)
    w.observe({1}, first=True)
    w.observe({1}, first=True)
    assert not w.due(100.0 + MIN_GAP_S - 1)
    assert w.due(100.0 + MIN_GAP_S)
    assert w.rejoins == 2


def test_a_failing_check_resets_the_count_and_the_watch_goes_on(monkeypatch: Any) -> None:
    import time

    import confluent_kafka as ck

    from worker.loop import orphans

    monkeypatch.setattr(orphans, "CHECK_EVERY_S", 0.01)
    monkeypatch.setattr(orphans, "AdminClient", lambda settings: object())
    w = _watch()
    w.observe({0}, first=True)

    def fail(admin: object) -> tuple[set[int], bool]:
        raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT))

    monkeypatch.setattr(w, "_check", fail)
    w.start()
    deadline = time.monotonic() + 5
    while w.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert w.failures >= 3
    w.observe({0}, first=True)
    assert not w.due(0.0), "the check before the failures no longer counts"
