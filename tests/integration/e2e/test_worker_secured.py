"""The worker against a broker with an authorizer, as a least-privilege principal: over
SASL_SSL (SCRAM-SHA-512), over OAUTHBEARER (librdkafka's OIDC login, tokens from the devkit's
identity provider) and over mTLS, at-least-once and exactly-once, every job is answered;
exactly-once without WRITE on its transactional id waits at start-up, readiness off naming it,
and answers once it is granted."""

from __future__ import annotations

import time

import pytest

from tests.harness.workers import ThreadedWorker, fresh_topics, keys_of, read_topic, worker_config
from tests.integration.observe.http_support import get, until
from tests.integration.tools.secured_support import secured_worker_config
from worker.bundled import samples_dir
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.config import free_port
from worker.devkit.local_kafka.security import Protocol
from worker.observe.attach import observe
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration
N = 12


@pytest.mark.parametrize(("protocol", "exactly_once"), [
    (protocol, exactly_once) for exactly_once in (False, True)
    for protocol in ("SASL_SSL", "SSL", "OAUTHBEARER")])
def test_the_worker_answers_jobs_as_a_least_privilege_principal(
        secured_kafka: LocalKafka, protocol: Protocol, exactly_once: bool) -> None:
    admin = secured_kafka.bootstrap_servers  # the devkit's super-user listener
    topics = fresh_topics(admin, partitions=2)
    cfg, _ = secured_worker_config(secured_kafka, topics, protocol=protocol,
                                   exactly_once=exactly_once, batch={"max_batch_size": 4})
    sent = produce_folder(worker_config(admin, topics), samples_dir(), count=N,
                          prefix=f"sec-{protocol}-")
    want = {s.id for s in sent}
    with ThreadedWorker(cfg):
        msgs = read_topic(admin, topics.results, until=lambda m: want <= set(keys_of(m)),
                          timeout=90)
    assert set(keys_of(msgs)) == want
    assert len(msgs) == N


def test_exactly_once_without_write_on_its_transactional_id_waits_for_the_grant(
        secured_kafka: LocalKafka) -> None:
    """Before, the refusal ended start-up (exit 2, a crash loop under a supervisor); now the
    worker waits, alive, readiness off naming the id and the operation, and answers once
    the ACL is granted."""
    admin = secured_kafka.bootstrap_servers
    topics = fresh_topics(admin)
    prefix = f"ktw.{topics.group}."
    port = free_port()
    cfg, principal = secured_worker_config(secured_kafka, topics, exactly_once=True,
                                           leave_out=(prefix,),
                                           metrics={"port": port, "host": "127.0.0.1"})
    base = f"http://127.0.0.1:{port}"
    sent = produce_folder(worker_config(admin, topics), samples_dir(), count=4, prefix="tid-")
    want = {s.id for s in sent}
    with ThreadedWorker(cfg) as tw:
        server = observe(tw.worker)
        assert server is not None
        try:
            refusal = f"WRITE on transactional id {tw.worker.committer.transactional_id}:"

            def not_ready_naming_it() -> bool:
                status, body = get(base + "/readyz")
                return status == 503 and refusal in body

            until(not_ready_naming_it, 60, "readiness off naming the transactional id")
            time.sleep(5.0)  # past the first attempts: an exit would have happened by now
            assert tw.thread.is_alive() and tw.error is None, tw.error
            assert tw.worker.fatal_error is None
            assert get(base + "/healthz")[0] == 200  # waiting, not hanging
            assert not_ready_naming_it()
            assert not tw.worker.vitals.subscribed  # refused before joining the group

            secured_kafka.acls.grant(secured_kafka.acls.bindings(
                principal.principal, transactional_id_prefixes=[prefix]))
            msgs = read_topic(admin, topics.results, until=lambda m: want <= set(keys_of(m)),
                              timeout=90)
            assert set(keys_of(msgs)) == want and len(msgs) == len(want)
            until(lambda: get(base + "/readyz")[0] == 200, 30, "ready once granted")
        finally:
            server.close()
