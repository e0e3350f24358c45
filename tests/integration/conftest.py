"""Fixtures giving integration tests a real Kafka broker.

`kafka_bootstrap`: one broker per session, external if $KAFKA_BOOTSTRAP_SERVERS
is set, otherwise a LocalKafka. `local_kafka`: a separate, session-scoped
LocalKafka for fault injection (pause/resume), so stalling it never disturbs
tests that share `kafka_bootstrap`; skipped against an external cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from worker.devkit.local_kafka import LocalKafka, Security, kafka_from_env_or_local

RETENTION_CHECK = {"log.retention.check.interval.ms": "1000"}


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    # The broker's retention check runs every 5 min by default (first one 30 s after start),
    # so a test whose records carry old timestamps lost them at a random point of the suite;
    # checking every second makes that loss happen every time a test relies on such records.
    with kafka_from_env_or_local(extra_config=RETENTION_CHECK) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def _local_kafka_session() -> Iterator[LocalKafka]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("KAFKA_BOOTSTRAP_SERVERS points at an external cluster")
    with LocalKafka() as broker:
        yield broker


@pytest.fixture
def local_kafka(_local_kafka_session: LocalKafka) -> Iterator[LocalKafka]:
    broker = _local_kafka_session
    if not broker.is_running():  # an earlier test killed it: start a fresh one
        broker.stop()
        broker.start()
    yield broker
    if broker.paused:  # a failed stall test must not leave the session broker frozen
        broker.resume()


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[LocalKafka]:
    """A LocalKafka with SASL_SSL (SCRAM-SHA-512 and OAUTHBEARER, tokens from the devkit's
    identity provider) and mTLS listeners and StandardAuthorizer (nothing allowed without an
    ACL): ``add_principal()``, ``client_settings()``, and its ACL helper ``.acls``. Its
    ``bootstrap_servers`` is the devkit's own super-user listener."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("the secured broker is a LocalKafka; KAFKA_BOOTSTRAP_SERVERS points at an "
                    "external cluster")
    with LocalKafka(security=Security(sasl_ssl=True, mtls=True, oauthbearer=True)) as broker:
        yield broker
