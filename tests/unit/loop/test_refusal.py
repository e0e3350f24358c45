"""A refusal by the broker's ACLs, as the intake sees it and as the broker answers: it lasts
until a record is consumed after it or the broker allows READ again (librdkafka reports a
refused fetch once, then stays silent), whatever the time since."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import confluent_kafka as ck
import pytest
import structlog
import structlog.testing

from worker.loop import refusal as refusal_module
from worker.loop.intake import Intake
from worker.loop.refusal import Refusal
from worker.loop.stats import Stats

TOPIC = ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
GROUP = ck.KafkaError.GROUP_AUTHORIZATION_FAILED
FETCH_REFUSED = "Fetch from broker 1 failed: Broker: Topic authorization failed"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refusal() -> tuple[Refusal, Stats, _Clock]:
    stats, clock = Stats(), _Clock()
    return Refusal(stats, clock), stats, clock


def test_a_refused_fetch_counts_until_a_record_is_consumed_however_long_ago() -> None:
    r, stats, clock = _refusal()
    assert r.reason() is None
    assert r.note(TOPIC, FETCH_REFUSED)
    clock.now += 3600.0  # reported once: silence is not a grant
    assert r.refused() == {"topic": FETCH_REFUSED}
    reason = r.reason()
    assert reason is not None and FETCH_REFUSED in reason and "ACLs" in reason
    stats.consumed += 1  # a record came in after it: the consumer reads again
    assert r.refused() == {} and r.reason() is None


def test_other_consumer_errors_are_no_refusal() -> None:
    r, _, _ = _refusal()
    assert not r.note(ck.KafkaError._TRANSPORT, "Broker transport failure")
    assert not r.note(ck.KafkaError.UNKNOWN_TOPIC_OR_PART, "Unknown topic")
    assert r.reason() is None


def test_the_brokers_answer_clears_only_refusals_reported_before_it_was_asked() -> None:
    r, _, clock = _refusal()
    r.note(GROUP, "JoinGroup failed: Broker: Group authorization failed")
    asked = clock.now - 0.5  # asked before the report: says nothing about it
    r.checked({}, asked)
    assert set(r.refused()) == {"group"}
    clock.now += 1.0
    r.checked({}, clock.now)  # asked after it: READ on the group is allowed again
    assert r.refused() == {}


def test_the_brokers_refusal_counts_without_a_consumer_error() -> None:
    # A refused group: heartbeats fail without an error reaching the application until the
    # session times out; the broker's answer is what finds it.
    r, stats, clock = _refusal()
    # (structlog's capture, not the process's stdout: where the log goes depends on which
    # earlier test configured logging, which made this test fail after tests/unit/tools.)
    with structlog.testing.capture_logs() as logs:
        r.checked({"group": "READ on group g refused"}, clock.now)
        assert r.reason() == "consumer refused by the broker's ACLs: READ on group g refused"
        stats.consumed += 5  # records prefetched before the revocation: the broker says no
        assert set(r.refused()) == {"group"}
        r.checked({}, clock.now + 1)
        assert r.refused() == {}
    events = [e["event"] for e in logs]
    assert "consumer_refused" in events and "consumer_allowed_again" in events


def test_the_watch_asks_while_active_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusal_module, "CHECK_EVERY_S", 0.01)
    monkeypatch.setattr(refusal_module, "RECHECK_S", 0.01)
    r = Refusal(Stats())
    active, stopped, asked = threading.Event(), threading.Event(), threading.Event()
    answers: list[dict[str, str] | None] = [None, {"topic": "READ on topic j refused"}]

    def check() -> dict[str, str] | None:
        asked.set()
        return answers.pop(0) if answers else {}

    r.watch(check, active=active.is_set, stopped=stopped.is_set)
    r.watch(lambda: pytest.fail("a second watch started"), active=lambda: True,
            stopped=lambda: False)
    time.sleep(0.1)
    assert not asked.is_set()  # not subscribed yet: nothing asked
    active.set()
    deadline = time.monotonic() + 5
    while answers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not answers
    time.sleep(0.1)  # a later answer: allowed
    assert r.refused() == {}
    stopped.set()
    assert r._thread is not None
    r._thread.join(2.0)
    assert not r._thread.is_alive()


def test_the_intake_keeps_a_refusal_and_skips_the_error() -> None:
    refused = SimpleNamespace(error=lambda: ck.KafkaError(TOPIC, FETCH_REFUSED))
    consumer: Any = SimpleNamespace(take=lambda n, t: [refused], consume=lambda n, t: [refused])
    assignment: Any = SimpleNamespace(owned=set(), epochs={})
    committer: Any = SimpleNamespace(begin=lambda *a: pytest.fail("an error is no record"))
    intake = Intake(consumer, assignment, committer, Stats())
    batch = intake.consume(10, 0.0, prompt=True)
    assert batch.records == []
    assert intake.refusal.refused() == {"topic": FETCH_REFUSED}
