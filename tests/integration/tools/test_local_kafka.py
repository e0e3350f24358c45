"""Integration tests for worker.devkit.local_kafka against a real broker (no mocks)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from worker.devkit.local_kafka import LocalKafka, LocalKafkaError, ensure_jars
from worker.devkit.local_kafka.admin import create_topics
from worker.devkit.local_kafka.jars import MARKER

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _produce(bootstrap: str, topic: str, n: int, **conf: object) -> list[KafkaError | None]:
    """Produce `n` keyed messages; return one delivery error (or None) per message."""
    errors: list[KafkaError | None] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for i in range(n):
        producer.produce(topic, key=f"k{i}", value=f"v{i}", on_delivery=on_delivery)
    producer.flush(30)
    return errors


def _consume(
    bootstrap: str, topic: str, expected: int, conf: dict[str, object] | None = None
) -> list[Message]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": _name("g"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **(conf or {}),
    })
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append(msg)
        # Linger briefly so unexpected extra (e.g. aborted) records would show up too.
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg)
    finally:
        consumer.close()
    return got


def test_produce_consume_roundtrip(kafka_bootstrap: str) -> None:
    topic = _name("roundtrip")
    create_topics(kafka_bootstrap, [topic], partitions=3)
    create_topics(kafka_bootstrap, [topic], partitions=3)  # TOPIC_ALREADY_EXISTS is ignored

    errors = _produce(kafka_bootstrap, topic, 100)
    assert errors == [None] * 100

    got = _consume(kafka_bootstrap, topic, expected=100)
    values = [m.value().decode() for m in got]  # type: ignore[union-attr]
    assert sorted(values) == sorted(f"v{i}" for i in range(100))  # no loss, no duplicates
    assert {m.partition() for m in got} == {0, 1, 2}


def test_transactions_commit_and_abort(kafka_bootstrap: str) -> None:
    topic = _name("txn")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": _name("tx")})
    producer.init_transactions(30)  # needs the transaction coordinator (RF 1 state log)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"c{i}".encode())
    producer.commit_transaction(30)

    got = _consume(kafka_bootstrap, topic, 10, {"isolation.level": "read_committed"})
    assert sorted(m.value() or b"" for m in got) == sorted(f"c{i}".encode() for i in range(10))


def test_pause_stalls_broker_and_resume_recovers(local_kafka: LocalKafka) -> None:
    bootstrap = local_kafka.bootstrap_servers
    topic = _name("stall")
    local_kafka.create_topics([topic], partitions=1)

    local_kafka.pause()
    try:
        errors = _produce(bootstrap, topic, 1, **{"message.timeout.ms": 1500})
        assert errors and errors[0] is not None, "produce must not succeed while paused"
        assert errors[0].code() == KafkaError._MSG_TIMED_OUT
    finally:
        local_kafka.resume()

    assert _produce(bootstrap, topic, 5, **{"message.timeout.ms": 30000}) == [None] * 5


def test_ensure_jars_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = ensure_jars()
    assert (libs / MARKER).is_file()
    assert any(p.name.startswith("kafka_2.13-") for p in libs.glob("*.jar"))

    # With no mvn reachable a second call can only succeed from the cache.
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("KTW_MVN", str(empty / "mvn-must-not-run"))
    started = time.monotonic()
    assert ensure_jars() == libs
    assert time.monotonic() - started < 1.0


def test_start_failure_reports_broker_log(tmp_path: Path) -> None:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("KAFKA_BOOTSTRAP_SERVERS points at an external cluster")
    broker = LocalKafka(workdir=tmp_path / "kafka", extra_config={"log.segment.bytes": "10"})
    with pytest.raises(LocalKafkaError) as info:
        broker.start(timeout=60)
    assert "log.segment.bytes" in str(info.value)  # the broker's own complaint is included
    assert not broker.is_running()
    assert (tmp_path / "kafka" / "broker.log").is_file()  # caller's workdir is kept
    shutil.rmtree(tmp_path / "kafka")
