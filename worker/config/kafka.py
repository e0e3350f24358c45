"""The ``[kafka]`` and ``[topics]`` sections: brokers, client identity, security, topics."""

from __future__ import annotations

import os
import re
import socket
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from worker.config.base import Section


class ConfigWarning(UserWarning):
    """A setting that is accepted but weakens security or is ignored (Python's warnings)."""


def _default_client_id() -> str:
    return f"trt-worker-{socket.gethostname()}-{os.getpid()}"


# librdkafka settings whose values are secrets (ssl.key.password, ssl.keystore.password,
# ssl.key.pem, sasl.oauthbearer.client.secret, ...): a pass-through table keeps them as
# SecretStr, so the config's repr, its JSON dump and validation errors never show them.
# Matching by name also hides future librdkafka secrets; hiding a harmless value
# (sasl.oauthbearer.token.endpoint.url) costs nothing.
_SECRET_KEY = re.compile(r"password|passphrase|secret|key\.pem|token", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """Whether the librdkafka setting ``key`` holds a secret."""
    return _SECRET_KEY.search(key) is not None


def _secrets_hidden(table: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
    return {key: SecretStr(value) if isinstance(value, str) and is_secret_key(key) else value
            for key, value in table.items()}


# A pass-through table: librdkafka settings by name, secrets among them as SecretStr.
PassThrough = Annotated[dict[str, str | SecretStr], AfterValidator(_secrets_hidden)]


def revealed(table: Mapping[str, str | SecretStr]) -> dict[str, str]:
    """``table`` with its secrets in the clear, as librdkafka takes it: only for building a
    client's settings (worker.kafka.clients.ClientSettings hides them again in its repr)."""
    return {key: value.get_secret_value() if isinstance(value, SecretStr) else value
            for key, value in table.items()}


_COMMITS = "offsets are committed by the worker, only once their results are acknowledged"
_COOPERATIVE = ("the worker's rebalance handling (drain on revoke, orphan watch) rests on the "
                "classic protocol with cooperative-sticky assignment")
_ACKED = "results and dead letters are acknowledged by every in-sync replica"
_IDEMPOTENT = "results and dead letters are written idempotently (no duplicate on a retry)"

# librdkafka settings the worker sets itself and a pass-through table may not change, with what
# rests on each (or the worker's own setting to use instead).
GUARANTEED: Mapping[str, str] = MappingProxyType({
    "enable.auto.commit": _COMMITS,
    "enable.auto.offset.store": _COMMITS,
    "auto.offset.reset": ("a group without committed offsets starts at the earliest job; "
                          "'latest' would silently skip every job produced before it joined"),
    "partition.assignment.strategy": _COOPERATIVE,
    "group.protocol": _COOPERATIVE,
    "isolation.level": "exactly-once reads committed data only (processing.guarantee)",
    "acks": _ACKED,
    "request.required.acks": _ACKED,
    "enable.idempotence": _IDEMPOTENT,
    "transactional.id": ("exactly-once derives it from kafka.transactional_id_prefix, "
                         "kafka.group_id and kafka.instance_id"),
    "transaction.timeout.ms": ("set kafka.transaction_timeout_ms, which is checked against "
                               "commit.interval_ms and processing.max_batch_ms"),
    "group.id": "set kafka.group_id",
    "group.instance.id": "set kafka.static_membership and kafka.instance_id",
    "partitioner": ("results are partitioned like Java's producer (murmur2_random): the "
                    "wire contract's partitioning"),
})

# TLS verification switches: accepted (a test cluster with self-signed certificates needs
# them) but warned about unless they keep librdkafka's verifying default.
_TLS_VERIFICATION = MappingProxyType({
    "enable.ssl.certificate.verification": "true",
    "ssl.endpoint.identification.algorithm": "https",
})


class KafkaSettings(Section):
    bootstrap_servers: str = ""
    group_id: str = "trt-worker"
    client_id: str = Field(default_factory=_default_client_id)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    session_timeout_ms: int = Field(45_000, ge=1_000)
    # Longest a fetch waits for data. librdkafka's default (500 ms) shows up directly in
    # produce-to-result latency when a broker holds fetches; frames want it short.
    fetch_wait_max_ms: int = Field(20, ge=1, le=10_000)
    max_poll_interval_ms: int = Field(300_000, ge=10_000)
    # Identity of this worker instance, unique among live workers of the group: host name and
    # process id by default, so several processes per host never share one. Set it to something
    # stable across restarts (a StatefulSet pod name, deploy/helm) for static membership, which
    # uses it as group.instance.id (KIP-345: a restarted instance takes its partitions back at
    # once), and for exactly-once, whose transactional.id derives from it: a restart with the
    # same id fences its predecessor's open transaction at once instead of after
    # transaction_timeout_ms.
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
                             min_length=1, max_length=200)
    static_membership: bool = False
    # Compression of results and DLQ records. None by default: every client reads it (kafkajs,
    # for one, has no LZ4 or Snappy codec out of the box), and the payloads are already
    # compressed images or small msgpack maps. gzip is the other choice every client reads.
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    # CloudEvents binary-mode headers on results (ce_specversion, ce_id, ce_source, ce_type,
    # ce_subject, content-type): ce_id names the source record, so a result repeated after a
    # crash (at-least-once) carries the same id and a reader can drop the repeat.
    cloudevents: bool = True
    # transactional.id = "<prefix>.<group_id>.<instance_id>" (exactly-once only).
    transactional_id_prefix: str = Field("ktw", min_length=1, max_length=100)
    # Broker-side limit for an open transaction (the broker's transaction.max.timeout.ms,
    # 15 min by default, caps it). Checked against the commit interval and max batch time.
    transaction_timeout_ms: int = Field(60_000, ge=1_000, le=900_000)
    # A topic missing or refused (ACLs) at start-up, or exactly-once's transactional id
    # refused WRITE: wait for it, readiness off with the reason, trying again with a growing
    # interval; None waits for good. An exit would only be restarted into the same refusal (a
    # crash loop); a number gives up (exit 2) after that many seconds of waiting, both waits
    # together, for a command line run where a typo should end the run.
    topics_wait_s: float | None = Field(None, ge=0)
    # librdkafka settings passed through unchanged (both clients / consumer / producer only),
    # except those the delivery guarantees and the wire contract rest on (GUARANTEED). Values
    # of secret settings (is_secret_key) are kept as SecretStr.
    extra: PassThrough = Field(default_factory=dict)
    consumer_extra: PassThrough = Field(default_factory=dict)
    producer_extra: PassThrough = Field(default_factory=dict)

    @field_validator("extra", "consumer_extra", "producer_extra")
    @classmethod
    def _no_guarantee_overrides(cls, table: dict[str, str | SecretStr], info: ValidationInfo
                                ) -> dict[str, str | SecretStr]:
        # librdkafka's names are lower case; a differently cased one is refused here, not
        # left to librdkafka's "no such property" at the first client.
        refused = sorted({key for key in table if key.lower() in GUARANTEED})
        if refused:
            raise ValueError("; ".join(
                f"{info.field_name} may not set {key}: {GUARANTEED[key.lower()]}"
                for key in refused))
        return table

    @model_validator(mode="after")
    def _warn_weakened_security(self) -> KafkaSettings:
        tables = {"extra": self.extra, "consumer_extra": self.consumer_extra,
                  "producer_extra": self.producer_extra}
        for name, table in tables.items():
            for key, safe in _TLS_VERIFICATION.items():
                value = table.get(key)
                if isinstance(value, str) and value.strip().lower() != safe:
                    warnings.warn(
                        f"kafka.{name} sets {key}={value}: the brokers' TLS certificates are "
                        "not fully verified (a man in the middle can read jobs and results)",
                        ConfigWarning, stacklevel=1)
        protocols = {self.security_protocol} | {
            str(table["security.protocol"]).upper() for table in tables.values()
            if "security.protocol" in table}
        sasl = [f for f in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, f) is not None]
        sasl += sorted({f"{name}.{key}" for name, table in tables.items() for key in table
                        if key.lower().startswith("sasl.")})
        if sasl and not any(p.startswith("SASL_") for p in protocols):
            warnings.warn(
                f"kafka sets {', '.join(sasl)} but security_protocol is "
                f"{'/'.join(sorted(protocols))}: SASL is not used, the worker does not "
                "authenticate (set security_protocol to SASL_SSL or SASL_PLAINTEXT)",
                ConfigWarning, stacklevel=1)
        return self


class TopicsSettings(Section):
    jobs: str = Field("moderation.jobs", min_length=1)
    results: str = Field("moderation.results", min_length=1)
    dlq: str = Field("moderation.dlq", min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> TopicsSettings:
        if len({self.jobs, self.results, self.dlq}) != 3:
            raise ValueError("jobs, results and dlq topics must be three different topics")
        return self
