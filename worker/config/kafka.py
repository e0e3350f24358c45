"""The ``[kafka]`` and ``[topics]`` sections: brokers, client identity, security, topics."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from worker.config.base import Section


def _default_client_id() -> str:
    return f"trt-worker-{socket.gethostname()}-{os.getpid()}"


# librdkafka settings the worker sets itself and a pass-through table may not change: offsets
# are committed by the worker only after results are acknowledged (auto commit off), outputs are
# idempotent and fully acknowledged, exactly-once reads committed data only and owns the
# transactional id, and results are partitioned like Java's producer.
GUARANTEED = frozenset({
    "enable.auto.commit", "enable.auto.offset.store", "isolation.level", "acks",
    "request.required.acks", "enable.idempotence", "transactional.id", "group.id",
    "group.instance.id", "partitioner",
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
    # librdkafka settings passed through unchanged (both clients / consumer / producer only),
    # except those the delivery guarantees and the wire contract rest on (GUARANTEED).
    extra: dict[str, str] = Field(default_factory=dict)
    consumer_extra: dict[str, str] = Field(default_factory=dict)
    producer_extra: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_guarantee_overrides(self) -> KafkaSettings:
        for table in ("extra", "consumer_extra", "producer_extra"):
            refused = sorted(set(getattr(self, table)) & GUARANTEED)
            if refused:
                raise ValueError(
                    f"{table} may not set {', '.join(refused)}: the worker's delivery "
                    "guarantees (or its partitioning contract) rest on them; use the "
                    "worker's own settings (processing.guarantee, kafka.group_id, "
                    "kafka.static_membership, kafka.instance_id)")
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
