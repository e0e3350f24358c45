from __future__ import annotations

import time

from worker.observe.health import Health
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
