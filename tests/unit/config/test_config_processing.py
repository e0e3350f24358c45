"""processing.guarantee and the exactly-once settings: defaults, validation, client settings."""

from __future__ import annotations

import os
import socket

import pytest

from worker.config import load_config
from worker.exceptions import ConfigError
from worker.kafka import (
    consumer_settings,
    member_consumer_settings,
    producer_settings,
    transactional_id,
    transactional_producer_settings,
)


def test_at_least_once_is_the_default_and_adds_no_transactional_settings() -> None:
    cfg = load_config()
    assert cfg.processing.guarantee == "at-least-once"
    # Host and process: two processes on one host never share a transactional.id.
    assert cfg.kafka.instance_id == f"{socket.gethostname()}-{os.getpid()}"
    assert cfg.kafka.static_membership is False
    assert "transactional.id" not in producer_settings(cfg)
    member = member_consumer_settings(cfg)
    assert "group.instance.id" not in member
    assert member["partition.assignment.strategy"] == "cooperative-sticky"
    assert member["enable.auto.commit"] is False


def test_exactly_once_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_PROCESSING__GUARANTEE", "exactly-once")
    monkeypatch.setenv("KTW_KAFKA__INSTANCE_ID", "moderation-2")
    monkeypatch.setenv("KTW_KAFKA__GROUP_ID", "mod")
    monkeypatch.setenv("KTW_KAFKA__STATIC_MEMBERSHIP", "true")
    cfg = load_config()
    assert transactional_id(cfg) == "ktw.mod.moderation-2"
    prod = transactional_producer_settings(cfg)
    assert prod["transactional.id"] == "ktw.mod.moderation-2"
    assert prod["transaction.timeout.ms"] == 60_000
    assert prod["enable.idempotence"] is True and prod["acks"] == "all"
    member = member_consumer_settings(cfg)
    assert member["isolation.level"] == "read_committed"
    assert member["group.instance.id"] == "moderation-2"
    # Readers, the demo and replay build on consumer_settings/producer_settings: untouched.
    assert "group.instance.id" not in consumer_settings(cfg)
    assert "transactional.id" not in producer_settings(cfg)


def test_extra_settings_win_over_defaults_but_not_over_the_guarantees() -> None:
    cfg = load_config(None, processing={"guarantee": "exactly-once"},
                      kafka={"producer_extra": {"linger.ms": "1"}})
    assert member_consumer_settings(cfg)["isolation.level"] == "read_committed"
    assert producer_settings(cfg)["linger.ms"] == "1"
    assert transactional_producer_settings(cfg)["linger.ms"] == "1"
    for table, key, value in (("consumer_extra", "isolation.level", "read_uncommitted"),
                              ("consumer_extra", "enable.auto.commit", "true"),
                              ("producer_extra", "acks", "1"),
                              ("producer_extra", "enable.idempotence", "false"),
                              ("extra", "partitioner", "consistent_random")):
        with pytest.raises(ConfigError) as info:
            load_config(None, kafka={table: {key: value}})
        assert f"{table} may not set {key}" in str(info.value)


def test_transaction_timeout_must_cover_twice_an_interval_plus_a_batch() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, processing={"guarantee": "exactly-once", "max_batch_ms": 20_000},
                    commit={"interval_ms": 15_000}, kafka={"transaction_timeout_ms": 60_000})
    assert "transaction_timeout_ms 60000" in str(info.value)
    assert "70000" in str(info.value)
    # Enough room: fine; and at-least-once never checks it.
    load_config(None, processing={"guarantee": "exactly-once", "max_batch_ms": 20_000},
                commit={"interval_ms": 5_000}, kafka={"transaction_timeout_ms": 60_000})
    load_config(None, processing={"max_batch_ms": 50_000}, kafka={"transaction_timeout_ms": 1000})


@pytest.mark.parametrize("bad", [
    {"processing": {"guarantee": "exactly_once"}},
    {"kafka": {"transaction_timeout_ms": 900_001}},
    {"kafka": {"instance_id": ""}},
    {"processing": {"max_batch_ms": 0}},
])
def test_bad_values_are_refused_with_their_field(bad: dict[str, dict[str, object]]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, **bad)
    section, fields = next(iter(bad.items()))
    assert f"{section}.{next(iter(fields))}" in str(info.value)


def test_every_client_recovers_from_a_stalled_broker_within_seconds() -> None:
    # After a broker pause librdkafka may hold no broker at all (re-bootstrap after 5 s) and
    # back off its reconnects (capped at 2 s): together they keep recovery well inside 10 s.
    cfg = load_config(None, kafka={"bootstrap_servers": "b:9092"})
    for conf in (member_consumer_settings(cfg), producer_settings(cfg),
                 transactional_producer_settings(cfg)):
        assert conf["metadata.recovery.rebootstrap.trigger.ms"] == 5_000
        assert conf["reconnect.backoff.max.ms"] == 2_000


@pytest.mark.parametrize(("given", "parsed"),
                         [(None, "auto"), ("auto", "auto"), ("true", True), ("false", False),
                          (True, True)])
def test_gpu_priority_is_auto_by_default_and_takes_a_boolean_from_env_or_file(
        monkeypatch: pytest.MonkeyPatch, given: str | bool | None,
        parsed: str | bool) -> None:
    """Env and ``--set`` values arrive as strings: "true"/"false" must stay booleans,
    not fall into the "auto" branch or be refused."""
    if isinstance(given, str):
        monkeypatch.setenv("KTW_PROCESSING__GPU_PRIORITY", given)
        cfg = load_config(None)
    else:
        cfg = load_config(None, **({} if given is None else
                                   {"processing": {"gpu_priority": given}}))
    assert cfg.processing.gpu_priority == parsed
    assert type(cfg.processing.gpu_priority) is type(parsed)


def test_gpu_priority_refuses_anything_else_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_PROCESSING__GPU_PRIORITY", "sometimes")
    with pytest.raises(ConfigError, match="gpu_priority"):
        load_config(None)
