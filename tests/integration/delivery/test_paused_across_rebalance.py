"""A partition paused when it was taken away (an outage's wait, a partition hold) comes back
from the rebalance unpaused. librdkafka keeps a partition's pause across a rebalance, so the
worker answered nothing more once its partitions had been lost during a broker stall of 180 s
under exactly-once (bench/NOTES.md)."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from tests.harness.workers import ThreadedWorker, fresh_topics, read_topic, worker_config
from worker.bundled import samples_dir
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_partition_paused_when_it_left_is_consumed_when_it_comes_back(
        kafka_bootstrap: str, mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    with ThreadedWorker(cfg) as tw:
        w = tw.worker
        [first] = produce_folder(cfg, samples_dir(), count=1, prefix="before-")
        read_topic(kafka_bootstrap, topics.results,
                   until=lambda ms: any(m.key() == first.id.encode() for m in ms))
        rebalances = w.vitals.rebalances["assigned"]
        # What the committer's outage wait or the hold does: pause the assignment. Then the
        # group takes the partition away and gives it back (here: a rejoin).
        w.parts.consumer.pause([ck.TopicPartition(topics.jobs, 0)])
        w.parts.consumer.resubscribe()
        deadline = time.monotonic() + 60
        while w.vitals.rebalances["assigned"] == rebalances:
            assert time.monotonic() < deadline, "never assigned again"
            time.sleep(0.1)
        [later] = produce_folder(cfg, samples_dir(), count=1, prefix="after-")
        answered = read_topic(kafka_bootstrap, topics.results, timeout=60,
                              until=lambda ms: any(m.key() == later.id.encode() for m in ms))
        assert any(m.key() == later.id.encode() for m in answered), "paused for good"
