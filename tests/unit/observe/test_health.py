from __future__ import annotations

import time

from worker.observe.health import MAX_REASONS, Health
from worker.observe.vitals import Vitals


def _health(v: Vitals, *, fatal: BaseException | None = None,
            unacked: float | None = None) -> Health:
    return Health(v, heartbeat_timeout_s=5, delivery_stall_s=10, fatal=lambda: fatal,
                  oldest_unacked_s=lambda: unacked)


def _ready_vitals() -> Vitals:
    v = Vitals()
    v.warm = v.subscribed = True
    return v


def test_ready_once_warm_and_subscribed_with_or_without_partitions() -> None:
    v = Vitals()
    assert _health(v).ready().reasons == ("engines not warm yet", "not subscribed yet")
    v.warm = v.subscribed = True
    assert _health(v).ready().ok


def test_each_condition_turns_readiness_off_with_its_reason() -> None:
    v = _ready_vitals()
    v.lost = True
    assert "partitions lost" in _health(v).ready().text()
    v = _ready_vitals()
    assert "unacknowledged for 12 s" in _health(v, unacked=12.0).ready().text()
    assert _health(v, unacked=3.0).ready().ok
    assert "fatal error: RuntimeError: boom" in _health(v, fatal=RuntimeError("boom")).ready(
        ).text()
    v.stopping = True
    assert not _health(v).ready().ok


def test_liveness_follows_the_heartbeat() -> None:
    v = _ready_vitals()
    assert _health(v).live().ok
    v.beat = time.monotonic() - 6
    verdict = _health(v).live()
    assert not verdict.ok and "not stepped for 6 s" in verdict.text()
    assert not _health(v).ready().ok


def test_readiness_names_every_reason_that_holds_not_only_the_first() -> None:
    v = Vitals()
    v.warm, v.lost = True, True
    health = Health(v, heartbeat_timeout_s=5, delivery_stall_s=10, fatal=lambda: None,
                    oldest_unacked_s=lambda: None,
                    blocked=(lambda: "output topic results refuses records, retrying: gone",
                             lambda: None,
                             lambda: "batches wait for an outage to end: blob store",
                             lambda: "consumer refused READ on jobs"))
    verdict = health.ready()
    assert verdict.reasons == (
        "not subscribed yet", "partitions lost (no contact with the group coordinator)",
        "output topic results refuses records, retrying: gone",
        "batches wait for an outage to end: blob store", "consumer refused READ on jobs")
    assert verdict.text().splitlines() == list(verdict.reasons)


def test_readiness_reasons_are_bounded_and_count_the_rest() -> None:
    many = [lambda i=i: f"part {i} blocked" for i in range(MAX_REASONS + 4)]
    health = Health(_ready_vitals(), heartbeat_timeout_s=5, delivery_stall_s=10,
                    fatal=lambda: None, oldest_unacked_s=lambda: None, blocked=many)
    reasons = health.ready().reasons
    assert len(reasons) == MAX_REASONS
    assert reasons[:-1] == tuple(f"part {i} blocked" for i in range(MAX_REASONS - 1))
    assert reasons[-1] == "and 5 more reasons"
    exactly = Health(_ready_vitals(), heartbeat_timeout_s=5, delivery_stall_s=10,
                     fatal=lambda: None, oldest_unacked_s=lambda: None,
                     blocked=many[:MAX_REASONS])
    assert exactly.ready().reasons[-1] == f"part {MAX_REASONS - 1} blocked"
