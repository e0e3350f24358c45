"""Start-up waits out a transactional id the broker's ACLs refuse (exactly-once's
``init_transactions``) as it waits out a refused topic: readiness off naming the id and the
operation, tried again with a growing interval, the consumer opened once it is granted; a
stop ends the wait with the clients closed, and ``kafka.topics_wait_s`` bounds it. Before,
the refusal raised out of start-up (exit 2, a crash loop under a supervisor)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import structlog.testing

from worker.config import load_config
from worker.exceptions import TopicNotAuthorized
from worker.loop.startup import Startup
from worker.observe.vitals import Vitals

REFUSAL = ("the broker's ACLs do not let this client WRITE on transactional id ktw.g.t: "
           "grant it")


class _Committer:
    """Refused ``refusals`` times, then started."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.starts, self.closed = refusals, 0, False

    def start(self) -> None:
        self.starts += 1
        if self.starts <= self.refusals:
            raise TopicNotAuthorized(REFUSAL)

    def on_commit(self, *_: Any) -> None:
        """Unused."""

    def close(self, *, failed: bool) -> None:
        self.closed = True


class _Consumer:
    def __init__(self) -> None:
        self.opened = self.closed = False

    def open(self, on_commit: Any = None) -> None:
        self.opened = True

    def close(self, timeout_s: float) -> None:
        self.closed = True


class _Task:
    topics = None

    def warm_up(self) -> None:
        """Warm at once."""


class _Stop(threading.Event):
    """Records each wait instead of sleeping; set after ``stop_after`` waits."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.stop_after = stop_after
        self.reasons: list[str | None] = []
        self.vitals: Vitals | None = None

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        self.reasons.append(self.vitals.waiting if self.vitals else None)
        return self.stop_after is not None and len(self.waits) >= self.stop_after


def _startup(refusals: int, **kafka: Any) -> tuple[Startup, _Committer, _Consumer, Vitals]:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9", **kafka})
    committer, consumer, vitals = _Committer(refusals), _Consumer(), Vitals()
    startup = Startup(cfg, _Task(), consumer, committer, vitals,  # type: ignore[arg-type]
                      check=lambda: None)
    return startup, committer, consumer, vitals


def test_a_refused_transactional_id_is_waited_out_then_the_consumer_opens() -> None:
    startup, committer, consumer, vitals = _startup(refusals=3)
    stop = _Stop()
    stop.vitals = vitals
    with structlog.testing.capture_logs() as logs:
        assert startup.open_while_warming(stop)
    assert committer.starts == 4 and consumer.opened
    assert stop.waits == [1.0, 2.0, 4.0]
    assert all(r is not None and "WRITE on transactional id ktw.g.t" in r
               for r in stop.reasons), stop.reasons
    assert vitals.waiting is None and vitals.warm
    refused = [e for e in logs if e["event"] == "transactional_id_refused"]
    assert [e["attempt"] for e in refused] == [1, 2, 3]  # once per attempt


def test_a_stop_during_the_wait_closes_the_clients() -> None:
    startup, committer, consumer, _ = _startup(refusals=10)
    assert not startup.open_while_warming(_Stop(stop_after=2))
    assert committer.starts == 2 and not consumer.opened and committer.closed


def test_the_wait_gives_up_after_topics_wait_s_with_the_refusal() -> None:
    startup, committer, consumer, _ = _startup(refusals=10, topics_wait_s=0)
    with pytest.raises(TopicNotAuthorized, match=r"WRITE on transactional id ktw\.g\.t"):
        startup.open_while_warming(_Stop())
    assert committer.starts == 1 and committer.closed and not consumer.opened


def test_a_granted_transactional_id_opens_everything_in_the_thread() -> None:
    startup, committer, consumer, vitals = _startup(refusals=0)
    stop = _Stop()
    assert startup.open_while_warming(stop)
    assert committer.starts == 1 and consumer.opened and stop.waits == []
    assert "clients_s" in vitals.startup
