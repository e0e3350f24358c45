"""Topics are checked before the first job: a missing one stops `trt-worker run` at start-up
with a clear error (exit 2), a DLQ smaller than the jobs topic is warned about. Before, the
worker started, consumed, and failed (or crash-looped) at the first dead letter."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from worker.devkit.local_kafka.admin import create_topics
from worker.devkit.workers import Topics, WorkerProcess, worker_config, worker_env

pytestmark = [pytest.mark.integration]


def test_a_missing_dlq_topic_stops_the_worker_at_start_up(kafka_bootstrap: str,
                                                          tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-missing-{tag}", f"group-{tag}")
    create_topics(kafka_bootstrap, [topics.jobs, topics.results])
    proc = WorkerProcess(worker_env(worker_config(kafka_bootstrap, topics)), tmp_path / "w.log")
    code = proc.wait(120)
    text = proc.log_text()
    assert code == 2, text[-2000:]
    assert f"dlq-missing-{tag}" in text and "trt-worker topics create" in text
    assert "worker_started" not in text  # refused before consuming anything


def test_a_dlq_smaller_than_the_jobs_topic_is_reported(kafka_bootstrap: str,
                                                       tmp_path: Path) -> None:
    from worker.exceptions import WorkerError
    from worker.kafka.topics import check_topics

    tag = uuid.uuid4().hex[:8]
    create_topics(kafka_bootstrap, [f"jobs-{tag}", f"results-{tag}"],
                  config={"max.message.bytes": "4000000"})
    create_topics(kafka_bootstrap, [f"dlq-{tag}"], config={"max.message.bytes": "1000000"})
    cfg = worker_config(kafka_bootstrap, Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}",
                                                f"g-{tag}"))
    import structlog.testing

    with structlog.testing.capture_logs() as logs:
        check_topics(cfg, f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}")
    warned = [e for e in logs if e["event"] == "dlq_smaller_than_jobs"]
    assert warned and warned[0]["dlq_max_message_bytes"] == 1000000
    assert warned[0]["jobs_max_message_bytes"] == 4000000
    with pytest.raises(WorkerError, match=f"results-nope-{tag}"):
        check_topics(cfg, f"jobs-{tag}", f"results-nope-{tag}", f"dlq-{tag}")
