"""Consumer.reopen: a fresh client on the same subscription gets the partitions back, and the
retired client's rebalance callbacks never reach the worker."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from tests.harness.workers import fresh_topics, worker_config
from worker.kafka import Consumer, member_consumer_settings

pytestmark = pytest.mark.integration


def test_reopen_rejoins_with_a_new_client(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    consumer = Consumer(member_consumer_settings(worker_config(kafka_bootstrap, topics)))
    calls: list[tuple[str, object, int]] = []

    def record(kind: str):  # type: ignore[no-untyped-def]
        return lambda c, parts: calls.append((kind, c, len(parts)))

    consumer.open()
    consumer.subscribe([topics.jobs], on_assign=record("assign"), on_revoke=record("revoke"),
                       on_lost=record("lost"))

    def wait_assigned(client: object) -> None:
        deadline = time.monotonic() + 60
        while not any(k == "assign" and c is client and n for k, c, n in calls):
            assert time.monotonic() < deadline, calls
            consumer.consume(10, 0.2)

    first = consumer.client
    wait_assigned(first)
    consumer.reopen()
    second = consumer.client
    assert second is not first
    wait_assigned(second)
    # Every callback the worker saw came from the current client at the time.
    assert all(c is first for k, c, _ in calls[:1]) and all(
        c is second for k, c, _ in calls[1:]), calls
    assert isinstance(second, ck.Consumer)
    consumer.close(timeout_s=10.0)


def test_the_cluster_probe_sees_a_broker_that_answers(kafka_bootstrap: str) -> None:
    from worker.loop.group.rejoin import ClusterProbe

    probe = ClusterProbe({"bootstrap.servers": kafka_bootstrap})
    probe.activate()
    deadline = time.monotonic() + 10
    while probe.answering_since is None:
        assert time.monotonic() < deadline, "the probe never saw the broker"
        time.sleep(0.1)
    probe.deactivate()
    assert probe.answering_since is None
