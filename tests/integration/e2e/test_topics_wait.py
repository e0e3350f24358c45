"""A worker started while its results topic is missing waits for it, readiness off with the
reason, instead of exiting 2: under an orchestrator that exit was a crash loop (every restart
met the same missing topic). Once the topic exists it starts and answers."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.harness.workers import Topics, WorkerProcess, read_topic, worker_config, worker_env
from tests.integration.observe.http_support import get, until
from worker.bundled import samples_dir
from worker.devkit.local_kafka.admin import create_topics
from worker.devkit.local_kafka.config import free_port
from worker.tools.produce import produce_folder

pytestmark = [pytest.mark.integration]


def test_a_worker_waits_for_a_missing_results_topic_then_answers(kafka_bootstrap: str,
                                                                  tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-late-{tag}", f"dlq-{tag}", f"group-{tag}")
    create_topics(kafka_bootstrap, [topics.jobs, topics.dlq])
    cfg = worker_config(kafka_bootstrap, topics)
    port = free_port()
    proc = WorkerProcess(worker_env(cfg, KTW_METRICS__PORT=str(port),
                                    KTW_METRICS__HOST="127.0.0.1"), tmp_path / "w.log")
    try:
        until(lambda: "topics_unavailable" in proc.log_text(), 120, "the missing topic logged")
        status, body = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and f"results-late-{tag}" in body, (status, body)
        live, _ = get(f"http://127.0.0.1:{port}/healthz")
        assert live == 200  # waiting is not hanging: no liveness restart either
        time.sleep(3.0)  # past the first retries: an exit would have happened by now
        assert proc.proc.poll() is None, proc.log_tail()
        create_topics(kafka_bootstrap, [topics.results])
        [job] = produce_folder(cfg, samples_dir(), count=1, prefix="late-")
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda ms: any(m.key() == job.id.encode() for m in ms))
        assert any(m.key() == job.id.encode() for m in results)
        until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "ready again")
    finally:
        if proc.proc.poll() is None:
            proc.terminate()
            code = proc.wait(90)
            assert code == 0, proc.log_tail()
    assert "worker_started" in proc.log_text()

