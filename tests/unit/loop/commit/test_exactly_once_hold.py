"""Transactions that keep failing hold the rewound partitions with a growing wait (before:
abort and rewind as fast as the same batch failed, forever)."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from worker.config import load_config
from worker.loop.commit import exactly_once
from worker.loop.commit.exactly_once import ExactlyOnce
from worker.loop.group.assignment import Assignment


class _Consumer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def committed(self, partitions: list[ck.TopicPartition], timeout: float
                  ) -> list[ck.TopicPartition]:
        return [ck.TopicPartition(tp.topic, tp.partition, 10) for tp in partitions]

    def seek(self, tp: ck.TopicPartition) -> None:
        self.calls.append("seek")

    def assignment(self) -> list[ck.TopicPartition]:
        return [ck.TopicPartition("jobs", 0)]

    def pause(self, _tps: list[ck.TopicPartition]) -> None:
        self.calls.append("pause")

    def resume(self, _tps: list[ck.TopicPartition]) -> None:
        self.calls.append("resume")


class _Txn:
    """The transaction side of a failing commit: open with records, always abortable."""

    open, failed, records, age_s, sequence, needs_init = True, None, 3, 0.1, 0, False
    commits = aborts = retries = resets = 0

    def abort(self) -> bool:
        self.aborts += 1
        return True


def test_second_abort_in_a_row_holds_the_partitions_then_resumes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exactly_once, "HOLD_FIRST_S", 0.2)
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9", "instance_id": "t"},
                      processing={"guarantee": "exactly-once"})
    consumer = _Consumer()
    assignment = Assignment()
    assignment.owned.add(("jobs", 0))
    eo = ExactlyOnce(cfg, consumer, assignment, lambda keys: None)  # type: ignore[arg-type]
    eo._txn = _Txn()  # type: ignore[assignment]
    eo._producer.open()  # (tick polls it; nothing is sent)
    for attempt in range(2):
        eo.begin("jobs", 0, 10 + attempt)
        eo._abort("delivery failed: Broker: Unknown topic or partition")
        eo._rewind()
    assert consumer.calls == ["seek", "seek", "pause"]
    eo.begin("jobs", 0, 10)
    waited = eo.unacked_for_s()
    assert waited is not None and waited >= 0  # readiness sees the failing transactions
    deadline = time.monotonic() + 5
    while "resume" not in consumer.calls:
        assert time.monotonic() < deadline, "never resumed"
        eo.tick()
        time.sleep(0.05)
    assert consumer.calls[-1] == "resume"
