"""The start-up ACL check against a broker with an authorizer and least-privilege principals
(worker.kafka.topics): each missing grant is refused by name, the check does not depend on
DescribeConfigs (which such a principal lacks), and a full grant passes."""

from __future__ import annotations

import uuid

import pytest
import structlog.testing

from tests.harness.workers import fresh_topics
from tests.integration.tools.secured_support import secured_worker_config
from worker.config import WorkerConfig
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.security import Protocol
from worker.exceptions import TopicNotAuthorized, UnknownTopic
from worker.kafka.topics import check_topics

pytestmark = pytest.mark.integration


def _check(cfg: WorkerConfig) -> None:
    check_topics(cfg, cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq)


def test_a_least_privilege_principal_with_every_grant_passes(secured_kafka: LocalKafka) -> None:
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    cfg, _principal = secured_worker_config(secured_kafka, topics)
    with structlog.testing.capture_logs() as logs:
        _check(cfg)
    events = [e["event"] for e in logs]
    # DescribeConfigs is refused to it: only the DLQ size comparison is skipped, by name.
    assert "dlq_size_not_checked" in events and "topics_checked" in events, logs
    assert "topic_acls_not_checked" not in events and "topics_not_checked" not in events


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SSL"])
def test_no_write_on_the_dlq_is_refused_by_name(secured_kafka: LocalKafka,
                                                protocol: Protocol) -> None:
    """Before, DescribeConfigs' refusal made the check skip itself with a warning and the
    worker started; its first dead letter failed."""
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    cfg, principal = secured_worker_config(secured_kafka, topics, protocol=protocol,
                                leave_out=(topics.dlq,))
    with pytest.raises(TopicNotAuthorized,
                       match=f"this client WRITE on {topics.dlq} [(]not even DESCRIBE"):
        _check(cfg)
    # May read the DLQ (a redrive tool's grant), still not write it.
    secured_kafka.acls.grant(secured_kafka.acls.bindings(principal.principal, read=[topics.dlq]))
    with pytest.raises(TopicNotAuthorized) as info:
        _check(cfg)
    message = str(info.value)
    assert f"this client WRITE on {topics.dlq}: grant it" in message and "\n" not in message
    assert topics.results not in message and topics.jobs not in message


def test_no_read_on_the_jobs_topic_is_refused_by_name(secured_kafka: LocalKafka) -> None:
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    cfg, principal = secured_worker_config(secured_kafka, topics, leave_out=(topics.jobs,))
    # Without any grant the topic is not even listed to the principal; asked by name, the
    # broker refuses it (rather than calling it unknown).
    with pytest.raises(TopicNotAuthorized,
                       match=f"this client READ on {topics.jobs} [(]not even DESCRIBE"):
        _check(cfg)
    secured_kafka.acls.grant(secured_kafka.acls.bindings(
        principal.principal, describe=[topics.jobs]))
    with pytest.raises(TopicNotAuthorized, match=f"this client READ on {topics.jobs}:"):
        _check(cfg)


def test_a_topic_that_does_not_exist_is_reported_as_missing_to_who_may_see_it(
        secured_kafka: LocalKafka) -> None:
    """The broker tells a missing topic from a refused one only to a client that may
    DESCRIBE it; to others the refusal names the operation and that it may not exist."""
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    cfg, principal = secured_worker_config(secured_kafka, topics)
    nowhere = f"dlq-nowhere-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TopicNotAuthorized, match=f"WRITE on {nowhere} [(]not even DESCRIBE; "
                                                 "it may not exist either[)]"):
        check_topics(cfg, topics.jobs, topics.results, nowhere)
    secured_kafka.acls.grant(secured_kafka.acls.bindings(
        principal.principal, describe=[nowhere]))
    with pytest.raises(UnknownTopic, match=f"topic[(]s[)] {nowhere} do not exist"):
        check_topics(cfg, topics.jobs, topics.results, nowhere)


def test_no_read_on_the_group_is_refused_by_name(secured_kafka: LocalKafka) -> None:
    topics = fresh_topics(secured_kafka.bootstrap_servers)
    cfg, _principal = secured_worker_config(secured_kafka, topics, leave_out=(topics.group,))
    with pytest.raises(TopicNotAuthorized,
                       match=f"this client READ on group {topics.group}:"):
        _check(cfg)
