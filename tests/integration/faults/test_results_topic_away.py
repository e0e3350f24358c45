"""The results topic deleted for 90 s while jobs keep arriving, then created again, under
either guarantee: the worker process stays alive (no exit, no liveness failure), readiness is
off with a reason naming the topic while it is gone, and once it is back every job is answered
(exactly once under exactly-once, read_committed; at least once under at-least-once) and the
committed positions reach the end of the jobs topic.

The shorter test in test_unavailable_outputs.py brings the topic back as soon as the first
deliveries are retried; an outage that outlasts the committers' backoffs (at-least-once's 60 s
cap, exactly-once's 60 s rewind hold) and librdkafka's metadata caching is what a deleted and
re-provisioned topic looks like in production."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from tests.harness.faults import good_job
from tests.harness.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    produce_records,
    read_topic,
    worker_config,
    worker_env,
)
from tests.integration.observe.http_support import get, until
from worker.devkit.local_kafka.admin import create_topics, delete_topics
from worker.devkit.local_kafka.config import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AWAY_S = 90.0
SEND_EVERY_S = 5.0
PARTITIONS = 2


def _send(bootstrap: str, topic: str, keys: list[str]) -> None:
    produce_records(bootstrap, topic, [(k.encode(), good_job(k), None) for k in keys])


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_results_topic_gone_for_90_s_is_waited_out_and_every_job_answered(
        kafka_bootstrap: str, tmp_path: Path, mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = WorkerProcess(worker_env(cfg, KTW_METRICS__PORT=str(port),
                                    KTW_METRICS__HOST="127.0.0.1"), tmp_path / "w.log")
    sent: list[str] = []

    def send(keys: list[str]) -> None:
        _send(kafka_bootstrap, topics.jobs, keys)
        sent.extend(keys)

    try:
        send([f"before-{i}" for i in range(4)])
        first = read_topic(kafka_bootstrap, topics.results,
                           until=lambda m: set(sent) <= set(keys_of(m)), timeout=120)
        assert set(sent) <= set(keys_of(first)), proc.log_tail()
        until(lambda: get(base + "/readyz")[0] == 200, 30, "ready before the outage")

        delete_topics(kafka_bootstrap, [topics.results])
        gone_at = time.monotonic()
        refusals: list[str] = []  # /readyz bodies that name the missing topic
        i = 0
        while (away := time.monotonic() - gone_at) < AWAY_S:
            send([f"away-{i}-{p}" for p in range(PARTITIONS)])  # jobs keep arriving
            i += 1
            assert proc.proc.poll() is None, f"the worker exited after {away:.0f} s away\n" \
                                             + proc.log_tail()
            assert get(base + "/healthz")[0] == 200, proc.log_tail()
            status, body = get(base + "/readyz")
            if status == 503 and topics.results in body:
                refusals.append(body)
            time.sleep(SEND_EVERY_S)
        assert refusals, f"readiness never named {topics.results}\n{proc.log_tail()}"
        status, body = get(base + "/readyz")
        assert status == 503 and topics.results in body, (status, body)
        assert committed(kafka_bootstrap, topics.group, topics.jobs, PARTITIONS) != end_offsets(
            kafka_bootstrap, topics.jobs, PARTITIONS), "committed past unanswered jobs"

        create_topics(kafka_bootstrap, [topics.results], partitions=1)  # back
        send([f"after-{i}" for i in range(4)])
        # (The answers given before the outage went with the deleted topic.)
        want = {k for k in sent if not k.startswith("before-")}
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: want <= set(keys_of(m)), timeout=120)
        got = collections.Counter(keys_of(results))
        assert want <= set(got), (sorted(want - set(got)), proc.log_tail())
        if mode == "exactly-once":
            assert set(got) == want and max(got.values()) == 1, got.most_common(3)
        until(lambda: get(base + "/readyz")[0] == 200, 60, "ready again once the topic is back")
        assert proc.proc.poll() is None, proc.log_tail()
    finally:
        if proc.proc.poll() is None:
            proc.terminate()
        code = proc.wait(90)
    assert code == 0, proc.log_tail()
    assert committed(kafka_bootstrap, topics.group, topics.jobs, PARTITIONS) == end_offsets(
        kafka_bootstrap, topics.jobs, PARTITIONS)
