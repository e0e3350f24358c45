"""Topics are checked before the first job: a missing one stops `trt-worker run` at start-up
with a clear error (exit 2), a DLQ smaller than the jobs topic is warned about. Before, the
worker started, consumed, and failed (or crash-looped) at the first dead letter."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.harness.workers import Topics, WorkerProcess, worker_config, worker_env
from worker.devkit.local_kafka.admin import create_topics

pytestmark = [pytest.mark.integration]
# These tests check the start-up refusal itself: give up at once instead of waiting for the
# topic (the default, tests/integration/e2e/test_topics_wait.py).
GIVE_UP = {"KTW_KAFKA__TOPICS_WAIT_S": "0"}


def test_a_missing_dlq_topic_stops_the_worker_at_start_up(kafka_bootstrap: str,
                                                          tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-missing-{tag}", f"group-{tag}")
    create_topics(kafka_bootstrap, [topics.jobs, topics.results])
    proc = WorkerProcess(worker_env(worker_config(kafka_bootstrap, topics), **GIVE_UP),
                         tmp_path / "w.log")
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


def test_a_results_topic_the_worker_may_not_write_stops_it_at_start_up(tmp_path: Path) -> None:
    """A broker with an authorizer and a DENY of WRITE on the results topic: the worker exits 2
    at start-up naming the topic and the operation. Before, it started, consumed, and failed at
    its first result (at-least-once: exited and crash-looped on the same offset)."""
    import os

    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from worker.devkit.local_kafka import LocalKafka

    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("starts its own broker with an authorizer; KAFKA_BOOTSTRAP_SERVERS points "
                    "at an external cluster")
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    # Everyone may do everything (no ACL found) but WRITE on the results topic: a PLAINTEXT
    # client is User:ANONYMOUS, the broker's own requests included, and they need no topic WRITE.
    acl_broker = LocalKafka(workdir=tmp_path / "kafka", extra_config={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true"})
    with acl_broker as kafka:
        bootstrap = kafka.bootstrap_servers
        create_topics(bootstrap, [topics.jobs, topics.results, topics.dlq])
        # A topic with any ACL no longer falls under "no ACL found": allow everything on it,
        # then deny WRITE (a DENY wins), so the client still sees the topic.
        acls = [AclBinding(ResourceType.TOPIC, topics.results, ResourcePatternType.LITERAL,
                           "User:ANONYMOUS", "*", op, permission)
                for op, permission in ((AclOperation.ALL, AclPermissionType.ALLOW),
                                       (AclOperation.WRITE, AclPermissionType.DENY))]
        admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answer
        for fut in admin.create_acls(acls).values():
            fut.result(30)
        proc = WorkerProcess(worker_env(worker_config(bootstrap, topics), **GIVE_UP),
                             tmp_path / "w.log")
        try:
            code = proc.wait(120)
        finally:  # a worker that started anyway (the bug) must not outlive the test
            if proc.proc.poll() is None:
                proc.kill9()
        text = proc.log_text()
    assert code == 2, text[-2000:]
    assert f"WRITE on results-{tag}" in text and "ACLs" in text
    assert f"dlq-{tag}" not in text.split("may not")[-1].split("\n")[0]  # only what is refused
    assert "worker_started" not in text


def test_the_broker_reports_what_this_client_may_do(kafka_bootstrap: str) -> None:
    """Without an authorizer every operation is reported; the start-up check passes."""
    from worker.kafka.admin import Admin
    from worker.kafka.topics import check_topics

    tag = uuid.uuid4().hex[:8]
    names = [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}"]
    create_topics(kafka_bootstrap, names)
    cfg = worker_config(kafka_bootstrap, Topics(*names, f"g-{tag}"))
    ops = Admin(cfg).authorized_operations(names)
    assert all(o is not None and {"READ", "WRITE"} <= o for o in ops.values()), ops
    check_topics(cfg, *names)


def test_the_clients_open_during_the_warm_up_and_close_when_it_fails(
        kafka_bootstrap: str) -> None:
    """The results producer and the consumer are made while the task warms up (a new
    idempotent producer waits about 0.5 s for its producer id before its first send; before,
    that wait came after the warm-up, in front of the first result). The group is still
    joined only once warm. A warm-up that fails leaves no client open, and its own error is
    the one raised."""
    import time

    from engines.exceptions import EngineError
    from tests.harness.workers import fresh_topics, worker_config
    from worker.loop.build import build_worker

    worker = build_worker(worker_config(kafka_bootstrap, fresh_topics(kafka_bootstrap)))
    producer = worker.committer._producer  # type: ignore[attr-defined]
    seen: dict[str, bool] = {}

    def warm_up() -> None:
        deadline = time.monotonic() + 10
        while producer._client is None and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["producer"] = producer._client is not None
        seen["subscribed"] = worker.vitals.subscribed
        raise EngineError("the engine would not load")

    worker.task.warm_up = warm_up  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="would not load"):
        worker.run()
    assert seen == {"producer": True, "subscribed": False}
    assert producer._client is None and worker.parts.consumer._client is None
