"""At-least-once shutdown: the final commit waits a bounded time for its answer.

A synchronous commit against a coordinator the client lost in a broker stall blocks until the
broker answers (or forever), past the process's shutdown timeout: the worker then dies by its
faulthandler watchdog with exit code 1. The drain commits asynchronously and serves callbacks
for at most SHUTDOWN_COMMIT_WAIT_S; the rebalance in close() commits nothing more.
"""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka as ck
import pytest

from worker.config import load_config
from worker.loop.commit import at_least_once
from worker.loop.commit.at_least_once import AtLeastOnce


class ScriptedConsumer:
    """Answers async commits from serve() (or never); a sync commit is a test failure."""

    def __init__(self, *, answers: bool) -> None:
        self.answers = answers
        self.sent: list[list[tuple[str, int, int]]] = []
        self.on_commit: Any = None
        self._queued: list[list[ck.TopicPartition]] = []

    def commit(self, offsets: list[ck.TopicPartition]) -> None:
        raise AssertionError("a synchronous commit at shutdown can block past its timeout")

    def commit_async(self, offsets: list[ck.TopicPartition]) -> None:
        self.sent.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])
        self._queued.append(offsets)

    def serve(self, timeout: float) -> None:
        if self.answers and self._queued:
            self.on_commit(None, self._queued.pop(0))
        else:
            time.sleep(timeout)


def _committer(consumer: ScriptedConsumer) -> AtLeastOnce:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9"})
    committer = AtLeastOnce(cfg, consumer)  # type: ignore[arg-type]
    committer.start()  # (a producer with nothing to send: flush returns at once)
    consumer.on_commit = committer.on_commit
    committer.begin("jobs", 0, 5)
    committer.begin("jobs", 0, 6)
    committer._tracker.finish("jobs", 0, 5)
    committer._tracker.finish("jobs", 0, 6)
    return committer


def test_drain_commits_asynchronously_and_gives_up_after_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at_least_once, "SHUTDOWN_COMMIT_WAIT_S", 0.3, raising=False)
    consumer = ScriptedConsumer(answers=False)
    committer = _committer(consumer)
    t0 = time.monotonic()
    committer.drain(failed=False)
    took = time.monotonic() - t0
    assert consumer.sent == [[("jobs", 0, 7)]]
    assert 0.3 <= took < 2.0
    committer.revoked({("jobs", 0)})  # close()'s rebalance: no second (sync) commit
    assert consumer.sent == [[("jobs", 0, 7)]]
    committer.close(failed=False)


def test_drain_returns_once_the_commit_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at_least_once, "SHUTDOWN_COMMIT_WAIT_S", 5.0, raising=False)
    consumer = ScriptedConsumer(answers=True)
    committer = _committer(consumer)
    t0 = time.monotonic()
    committer.drain(failed=False)
    assert time.monotonic() - t0 < 1.0
    assert committer._tracker.committable() == {}  # the answer marked the position committed
    committer.close(failed=False)
