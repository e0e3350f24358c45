"""A job reaching an idle worker is taken when it arrives, not when the poll timeout ends."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from tests.harness.workers import ThreadedWorker, fresh_topics, read_topic, worker_config
from worker.bundled import samples_dir
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration
POLL_TIMEOUT_MS = 10_000


def test_an_idle_worker_answers_without_waiting_out_its_poll_timeout(
        kafka_bootstrap: str) -> None:
    # librdkafka's consume(n, timeout) returns at n records or at the timeout, so with the old
    # intake a lone job waited for the end of the idle worker's poll window (here most of
    # it: the job comes ~1.5 s after the window opened, so it waited ~8.5 s); a long timeout
    # makes that wait plain, and the bound below leaves a loaded CI machine room.
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    cfg = worker_config(kafka_bootstrap, topics, batch={
        "max_batch_size": 8, "max_delay_ms": 1, "poll_timeout_ms": POLL_TIMEOUT_MS})
    latencies: dict[str, float] = {}
    with ThreadedWorker(cfg):
        for i in range(4):  # the first one warms up (group join, engine load): not counted
            time.sleep(0.5)  # the previous result acknowledged: nothing pending, worker idle
            sent_at = time.time()
            [job] = produce_folder(cfg, samples_dir(), count=1, prefix=f"idle{i}-")
            [result] = [m for m in read_topic(kafka_bootstrap, topics.results,
                                              until=lambda ms, k=job.id: _has(ms, k))
                        if m.key() == job.id.encode()]
            kind, created_ms = result.timestamp()
            assert kind == ck.TIMESTAMP_CREATE_TIME
            if i:  # the job's send to the worker's produce call of its result
                latencies[job.id] = created_ms / 1e3 - sent_at
    assert len(latencies) == 3
    assert sorted(latencies.values())[1] < 3.0, latencies  # the median of three


def _has(msgs: list[ck.Message], key: str) -> bool:
    return any(m.key() == key.encode() for m in msgs)
