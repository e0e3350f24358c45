"""LocalKafka(security=...): SASL_SSL (SCRAM-SHA-512) and mTLS listeners whose authorizer
allows only what an ACL grants, and the ACL helper that grants and revokes (real broker)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from worker.devkit.local_kafka import LocalKafka, Principal
from worker.devkit.local_kafka.security import Protocol

pytestmark = pytest.mark.integration
PROTOCOLS: list[Protocol] = ["SASL_SSL", "SSL"]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _produce(conf: dict[str, object], topic: str) -> KafkaError | None:
    """One record; its delivery error (None: delivered)."""
    errors: list[KafkaError | None] = []
    producer = Producer({**conf, "message.timeout.ms": 10_000})
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(20)
    assert len(errors) == 1, "no delivery report within 20 s"
    return errors[0]


def _consume(conf: dict[str, object], topic: str, group: str) -> bytes | KafkaError:
    """The first record's value, or the first error the consumer reports."""
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                return err
            value = msg.value()
            assert value is not None
            return value
    finally:
        consumer.close()
    raise AssertionError("neither a record nor an error within 30 s")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_principal_may_do_what_its_acls_grant_until_revoked(
        secured_kafka: LocalKafka, protocol: Protocol) -> None:
    kafka = secured_kafka
    topic, group = _name("sec"), _name("g")
    kafka.create_topics([topic])  # over the devkit's own (super-user) listener
    alice = kafka.add_principal(_name("alice"))
    conf = kafka.client_settings(alice, protocol)
    assert conf["bootstrap.servers"] != kafka.bootstrap_servers

    refused = _produce(conf, topic)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    grants = kafka.acls.grant(kafka.acls.bindings(alice.principal, read=[topic],
                                                  write=[topic], groups=[group]))
    assert _produce(conf, topic) is None
    assert _consume(conf, topic, group) == b"v"

    kafka.acls.revoke(grants)
    assert not kafka.acls.granted(alice.principal)
    refused = _produce(conf, topic)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_principal_without_acls_is_refused_what_another_was_granted(
        secured_kafka: LocalKafka) -> None:
    kafka = secured_kafka
    topic, group = _name("sec"), _name("g")
    kafka.create_topics([topic])
    granted, other = kafka.add_principal(_name("granted")), kafka.add_principal(_name("other"))
    kafka.acls.grant(kafka.acls.bindings(granted.principal, read=[topic], write=[topic],
                                         groups=[group]))
    assert _produce(kafka.client_settings(granted), topic) is None
    for protocol in PROTOCOLS:
        conf = kafka.client_settings(other, protocol)
        err = _produce(conf, topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        got = _consume(conf, topic, group)
        assert isinstance(got, KafkaError), got
        assert got.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                              KafkaError.GROUP_AUTHORIZATION_FAILED), got


def test_bad_credentials_do_not_connect(secured_kafka: LocalKafka) -> None:
    kafka = secured_kafka
    alice = kafka.add_principal(_name("alice"))
    impostor = Principal(alice.name, "not-the-password", alice.keystore)
    sasl = {**kafka.client_settings(impostor, "SASL_SSL"), "log_level": 0}
    # mTLS with the CA but no client certificate: the broker requires one.
    tls = {k: v for k, v in kafka.client_settings(alice, "SSL").items()
           if not k.startswith("ssl.keystore")}
    for conf in (sasl, {**tls, "log_level": 0}):
        admin = AdminClient(conf)
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)
