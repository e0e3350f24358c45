"""Exactly-once when a transaction's commit times out on the client but took effect on the
coordinator: the broker's answer to EndTxn is held back (a Kafka-aware delaying proxy between
worker and broker) longer than the worker waits for it. The worker gives up, resets its
producer and rewinds; counted with read_committed, every job is answered exactly once. Before
the rewind asked the coordinator for the committed positions, it rewound to the positions it
had cached before that commit, and the committed records were processed and published again.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.faults import TopicWatcher, good_job, key_counts, read_all
from tests.harness.tcp_proxy import END_TXN, DelayingProxy
from tests.harness.workers import (
    Topics,
    WorkerProcess,
    produce_records,
    worker_config,
    worker_env,
)
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.admin import create_topics
from worker.devkit.local_kafka.config import free_port

pytestmark = pytest.mark.integration

JOBS = 400
# Longer than the worker waits for a commit (min(10 s, transaction timeout / 4)).
HOLD_S = 14.0


@pytest.mark.timeout(300)
def test_a_commit_that_timed_out_but_committed_is_not_published_twice(tmp_path: Path) -> None:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("starts its own broker behind a proxy; KAFKA_BOOTSTRAP_SERVERS points at "
                    "an external cluster")
    proxy_port, bound_port = free_port(), free_port()
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    keys = [f"job-{i:04d}" for i in range(JOBS)]
    broker = LocalKafka(workdir=tmp_path / "kafka",
                        extra_listeners={"PROXIED": (bound_port, proxy_port)})
    with broker as kafka, DelayingProxy(proxy_port, bound_port) as proxy:
        direct = kafka.bootstrap_servers
        create_topics(direct, [topics.jobs, topics.results, topics.dlq], partitions=3)
        produce_records(direct, topics.jobs, [(k.encode(), good_job(k), None) for k in keys])
        cfg = worker_config(f"127.0.0.1:{proxy_port}", topics,
                            processing={"guarantee": "exactly-once"},
                            kafka={"session_timeout_ms": 45000})
        with TopicWatcher(direct, topics.results) as watcher:
            env = worker_env(cfg, KTW_KAFKA__INSTANCE_ID="held", KTW_BATCH__MAX_BATCH_SIZE="8")
            proc = WorkerProcess(env, tmp_path / "worker.log")

            def alive() -> bool:
                return proc.proc.poll() is None

            try:
                assert watcher.wait_for(set(keys[:1]), 120, alive=alive), \
                    proc.log_text()[-3000:]
                _hold_commits(proxy, watcher, keys)
                assert watcher.wait_for(set(keys), 200, alive=alive), \
                    proc.log_text()[-3000:]
            finally:
                proc.terminate()
                proc.wait(90)
        text = proc.log_text()
        counts = key_counts(read_all(direct, topics.results, isolation="read_committed"))
    assert proxy.held.get(END_TXN, 0) >= 1, "no commit was held back: the test proved nothing"
    assert "commit_transaction still failing" in text, text[-3000:]
    assert "rewound" in text
    duplicated = {k: n for k, n in counts.items() if n != 1}
    assert set(counts) == set(keys) and not duplicated, f"duplicated: {duplicated}"


def _hold_commits(proxy: DelayingProxy, watcher: TopicWatcher, keys: list[str]) -> None:
    """Hold EndTxn answers back while at least one commit is answered late, then let go."""
    seen_before = len(watcher.seen())
    proxy.delays[END_TXN] = HOLD_S
    deadline = time.monotonic() + 60
    while proxy.held.get(END_TXN, 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    # One held commit is enough; the reset and rewind happen while it is held.
    threading.Event().wait(HOLD_S + 2)
    proxy.delays.pop(END_TXN, None)
    assert len(watcher.seen()) >= seen_before
