"""The worker against a broker with an authorizer, as a least-privilege principal: over
SASL_SSL (SCRAM-SHA-512) and over mTLS, at-least-once and exactly-once, every job is
answered; exactly-once without WRITE on its transactional id stops at start-up naming it."""

from __future__ import annotations

import pytest

from tests.integration.tools.secured_support import secured_worker_config
from worker.bundled import samples_dir
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.security import Protocol
from worker.devkit.workers import ThreadedWorker, fresh_topics, keys_of, read_topic, worker_config
from worker.exceptions import TopicNotAuthorized
from worker.loop.build import build_worker
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration
N = 12


@pytest.mark.parametrize(("protocol", "exactly_once"), [
    ("SASL_SSL", False), ("SSL", False), ("SASL_SSL", True), ("SSL", True)])
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


def test_exactly_once_without_write_on_its_transactional_id_stops_naming_it(
        secured_kafka: LocalKafka) -> None:
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    prefix = f"ktw.{topics.group}."
    cfg, _ = secured_worker_config(secured_kafka, topics, exactly_once=True,
                                   leave_out=(prefix,))
    worker = build_worker(cfg)
    with pytest.raises(TopicNotAuthorized) as info:
        worker.run()
    message = str(info.value)
    assert f"WRITE on transactional id {worker.committer.transactional_id}:" in message
    assert "\n" not in message
    assert not worker.vitals.subscribed  # refused before joining the group
