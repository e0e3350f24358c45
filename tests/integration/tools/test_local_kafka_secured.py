"""LocalKafka(security=...): SASL_SSL (SCRAM-SHA-512, and OAUTHBEARER with tokens from the
devkit's identity provider) and mTLS listeners whose authorizer allows only what an ACL grants,
and the ACL helper that grants and revokes (real broker)."""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from worker.devkit.local_kafka import LocalKafka, Principal
from worker.devkit.local_kafka.security import Protocol

pytestmark = pytest.mark.integration
PROTOCOLS: list[Protocol] = ["SASL_SSL", "SSL", "OAUTHBEARER"]


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
    # The identity provider refuses the client secret: librdkafka gets no token to log in with.
    oauth = {**kafka.client_settings(impostor, "OAUTHBEARER"), "log_level": 0}
    for conf in (sasl, {**tls, "log_level": 0}, oauth):
        admin = AdminClient(conf)
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)


def _token_request(kafka: LocalKafka, client_id: str, secret: str) -> tuple[int, dict[str, Any]]:
    """POST a client_credentials grant to the identity provider (client_secret_basic, as
    librdkafka sends it): the status and the JSON answer."""
    idp = kafka.identity_provider
    basic = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    req = urllib.request.Request(
        idp.token_url, method="POST",
        data=urllib.parse.urlencode({"grant_type": "client_credentials"}).encode(),
        headers={"Authorization": f"Basic {basic}",
                 "Content-Type": "application/x-www-form-urlencoded"})
    tls = ssl.create_default_context(cafile=str(kafka.ca_location))
    try:
        with urllib.request.urlopen(req, context=tls, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _claims(jwt: str) -> dict[str, Any]:
    payload = jwt.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def test_the_identity_provider_issues_tokens_to_known_clients_only(
        secured_kafka: LocalKafka) -> None:
    kafka = secured_kafka
    alice = kafka.add_principal(_name("alice"))
    status, body = _token_request(kafka, alice.name, alice.password)
    assert status == 200, body
    claims = _claims(body["access_token"])
    idp = kafka.identity_provider
    assert claims["sub"] == alice.name
    assert (claims["iss"], claims["aud"]) == (idp.issuer, idp.audience)
    assert 0 < claims["exp"] - time.time() <= idp.token_lifetime_s
    assert _token_request(kafka, alice.name, "not-the-secret") == (401, {"error": "invalid_client"})
    assert _token_request(kafka, _name("nobody"), alice.password)[0] == 401


def _token_producer(kafka: LocalKafka, token: str, principal: str) -> Producer:
    """A producer on the OAUTHBEARER listener that logs in with ``token`` as given (the
    application supplies it: librdkafka's default method, not oidc)."""
    expiry = _claims(token)["exp"]
    return Producer({"bootstrap.servers": kafka.secure_bootstrap("OAUTHBEARER"),
                     "security.protocol": "SASL_SSL", "ssl.ca.location": str(kafka.ca_location),
                     "sasl.mechanism": "OAUTHBEARER", "log_level": 0,
                     "oauth_cb": lambda _config: (token, expiry, principal, {})})


def test_the_broker_accepts_only_tokens_the_identity_provider_signed(
        secured_kafka: LocalKafka) -> None:
    """A token's claims changed after signing (here its subject, to a principal with grants)
    is refused: the broker checks the signature against the identity provider's JWKS."""
    kafka = secured_kafka
    topic = _name("sec")
    kafka.create_topics([topic])
    alice, mallory = kafka.add_principal(_name("alice")), kafka.add_principal(_name("mallory"))
    kafka.acls.grant(kafka.acls.bindings(alice.principal, write=[topic], describe=[topic]))
    genuine = _token_request(kafka, alice.name, alice.password)[1]["access_token"]
    producer = _token_producer(kafka, genuine, alice.name)
    producer.poll(0)  # serves oauth_cb: the token is set before the first connection
    assert producer.list_topics(topic, timeout=10).topics[topic].error is None

    own = _token_request(kafka, mallory.name, mallory.password)[1]["access_token"]
    header, _, signature = own.split(".")
    claims = {**_claims(own), "sub": alice.name}
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    forged = ".".join([header, forged_payload.decode(), signature])
    producer = _token_producer(kafka, forged, alice.name)
    producer.poll(0)
    with pytest.raises(KafkaException):
        producer.list_topics(topic, timeout=5)
