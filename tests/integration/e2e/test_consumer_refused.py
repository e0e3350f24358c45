"""An ACL revoked at run time on the jobs topic (READ) or on the consumer group (READ) turns
readiness off with the reason within 30 s and shows in ``trt_worker_consumer_refused``;
granted again, the worker is ready again and answers new jobs. Through a real broker with an
authorizer, the worker a least-privilege principal (SASL_SSL, SCRAM-SHA-512).

What librdkafka does meanwhile (worker.loop.refusal): a refused fetch is reported once per
partition, then nothing while it lasts; a refused group is not reported until the member's
session times out (its heartbeats fail quietly), then its partitions are lost and every
JoinGroup is refused; once granted it rejoins by itself."""

from __future__ import annotations

import time

import pytest

from tests.harness.workers import ThreadedWorker, fresh_topics, keys_of, read_topic, worker_config
from tests.integration.observe.http_support import get, until
from tests.integration.tools.secured_support import secured_worker_config
from worker.bundled import samples_dir
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.config import free_port
from worker.observe.attach import observe
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration
REFUSED_WITHIN_S = 30.0
# Past the broker check's cadence (~10 s) and short of the 30 s: the refused group must be
# found before its session times out, not by the loss that follows.
GROUP_SESSION_TIMEOUT_MS = 20_000


@pytest.mark.parametrize("resource", ["topic", "group"])
def test_a_revoked_read_turns_readiness_off_then_back_on_once_granted(
        secured_kafka: LocalKafka, resource: str) -> None:
    admin = secured_kafka.bootstrap_servers  # the devkit's super-user listener
    topics = fresh_topics(admin, partitions=2)
    port = free_port()
    cfg, principal = secured_worker_config(
        secured_kafka, topics, metrics={"port": port, "host": "127.0.0.1"})
    if resource == "group":  # (its ``kafka=`` override is taken by the broker argument)
        cfg = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(
            update={"session_timeout_ms": GROUP_SESSION_TIMEOUT_MS})})
    acls = secured_kafka.acls
    read = (acls.bindings(principal.principal, read=[topics.jobs]) if resource == "topic"
            else acls.bindings(principal.principal, groups=[topics.group]))
    name = topics.jobs if resource == "topic" else topics.group
    base = f"http://127.0.0.1:{port}"
    gauge = f'trt_worker_consumer_refused{{resource="{resource}"}}'

    def send(prefix: str) -> set[str]:
        sent = produce_folder(worker_config(admin, topics), samples_dir(), count=2,
                              prefix=f"{prefix}-{resource}-")
        return {s.id for s in sent}

    def answered(want: set[str]) -> bool:
        msgs = read_topic(admin, topics.results, until=lambda m: want <= set(keys_of(m)),
                          timeout=90)
        return want <= set(keys_of(msgs))

    def not_ready_saying(text: str) -> bool:
        status, body = get(base + "/readyz")
        return status == 503 and text in body

    def metric() -> str:
        return next((line for line in get(base + "/metrics")[1].splitlines()
                     if line.startswith(gauge)), "")

    with ThreadedWorker(cfg) as tw:
        server = observe(tw.worker)
        assert server is not None
        try:
            assert answered(send("before"))
            assert get(base + "/readyz") == (200, "ok\n")
            assert metric() == f"{gauge} 0.0"

            acls.revoke(read)
            revoked = time.monotonic()
            until(lambda: not_ready_saying(f"READ on {resource} {name} refused"),
                  REFUSED_WITHIN_S, f"readiness off naming READ on the {resource}")
            took = time.monotonic() - revoked
            status, body = get(base + "/readyz")
            assert status == 503 and "refused by the broker's ACLs" in body, body
            assert metric() == f"{gauge} 1.0"
            if resource == "group":  # found by asking the broker, before the session expired
                assert took < GROUP_SESSION_TIMEOUT_MS / 1e3, took
                waiting = send("refused")  # and through the loss and refused rejoins
                until(lambda: tw.worker.vitals.lost, 60, "partitions lost (session expired)")
                status, body = get(base + "/readyz")
                assert status == 503 and f"READ on group {name} refused" in body, body
            else:
                waiting = send("refused")
                time.sleep(3.0)  # librdkafka said it once; the refusal still shows
                status, body = get(base + "/readyz")
                assert status == 503 and f"READ on topic {name} refused" in body, body

            acls.grant(read)
            until(lambda: get(base + "/readyz")[0] == 200, REFUSED_WITHIN_S, "ready again")
            assert metric() == f"{gauge} 0.0"
            assert answered(waiting | send("after"))
            assert get(base + "/readyz") == (200, "ok\n")
        finally:
            server.close()
