"""Typed wrappers over confluent_kafka.Consumer / Producer.

They add three things only: settings built from :class:`WorkerConfig` (auto commit and auto
offset store off: the worker commits what it has delivered), lazy connection in ``open()``, and
librdkafka errors wrapped as :class:`KafkaIOError` carrying librdkafka's retriable flag.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka as ck

from worker.config import KafkaSettings, WorkerConfig
from worker.dlq import Headers
from worker.exceptions import KafkaIOError

RebalanceCallback = Callable[[Any, list[ck.TopicPartition]], None]
DeliveryCallback = Callable[[ck.KafkaError | None, ck.Message], None]


def _common(k: KafkaSettings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": k.bootstrap_servers,
        "client.id": k.client_id,
        "security.protocol": k.security_protocol,
        # librdkafka's own log lines go through stdlib logging (and so structlog's renderer).
        "logger": logging.getLogger("librdkafka"),
    }
    if k.sasl_mechanism:
        conf["sasl.mechanism"] = k.sasl_mechanism
    if k.sasl_username:
        conf["sasl.username"] = k.sasl_username
    if k.sasl_password is not None:
        conf["sasl.password"] = k.sasl_password.get_secret_value()
    if k.ssl_ca_location:
        conf["ssl.ca.location"] = k.ssl_ca_location
    conf.update(k.extra)
    return conf


def consumer_settings(cfg: WorkerConfig) -> dict[str, Any]:
    k = cfg.kafka
    conf = _common(k)
    conf.update(
        {
            "group.id": k.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": k.session_timeout_ms,
            "max.poll.interval.ms": k.max_poll_interval_ms,
            # Memory bound: librdkafka keeps at most this much prefetched, and one fetch
            # response is no larger (a record above these limits is still returned whole,
            # KIP-74, so they never block a large job).
            "queued.max.messages.kbytes": cfg.batch.fetch_queue_kbytes,
            "fetch.max.bytes": cfg.batch.fetch_queue_kbytes * 1024,
            "max.partition.fetch.bytes": min(1_048_576, cfg.batch.fetch_queue_kbytes * 1024),
        }
    )
    conf.update(k.consumer_extra)
    return conf


def producer_settings(cfg: WorkerConfig) -> dict[str, Any]:
    k = cfg.kafka
    conf = _common(k)
    conf.update(
        {
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            # A DLQ record carries the original value, which may be as large as any job.
            "message.max.bytes": max(1_048_576, cfg.limits.max_message_bytes + 65_536),
        }
    )
    conf.update(k.producer_extra)
    return conf


def _wrap(exc: ck.KafkaException, what: str) -> KafkaIOError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, ck.KafkaError):
        return KafkaIOError(f"{what}: {err.str()}", recoverable=err.retriable())
    return KafkaIOError(f"{what}: {exc}")


class Consumer:
    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = dict(settings)
        self._client: ck.Consumer | None = None

    @property
    def client(self) -> ck.Consumer:
        if self._client is None:
            raise KafkaIOError("consumer used before open()")
        return self._client

    def open(self) -> None:
        if self._client is None:
            self._client = ck.Consumer(self._settings)

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:
        self.client.subscribe(list(topics), on_assign=on_assign, on_revoke=on_revoke,
                              on_lost=on_lost)

    def consume(self, num_messages: int, timeout: float) -> list[ck.Message]:
        try:
            return self.client.consume(num_messages=num_messages, timeout=timeout)
        except ck.KafkaException as exc:
            raise _wrap(exc, "consume failed") from exc

    def commit(self, offsets: list[ck.TopicPartition]) -> None:
        try:
            self.client.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:
            raise _wrap(exc, "commit failed") from exc

    def assignment(self) -> list[ck.TopicPartition]:
        return list(self.client.assignment())

    def pause(self, partitions: list[ck.TopicPartition]) -> None:
        if partitions:
            self.client.pause(partitions)

    def resume(self, partitions: list[ck.TopicPartition]) -> None:
        if partitions:
            self.client.resume(partitions)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


class Producer:
    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = dict(settings)
        self._client: ck.Producer | None = None

    @property
    def client(self) -> ck.Producer:
        if self._client is None:
            raise KafkaIOError("producer used before open()")
        return self._client

    def open(self) -> None:
        if self._client is None:
            self._client = ck.Producer(self._settings)

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Enqueue one record; when the local queue is full, serve callbacks and retry."""
        while True:
            try:
                self.client.produce(topic, value=value, key=key, headers=headers,
                                    on_delivery=on_delivery)
                return
            except BufferError:
                self.client.poll(0.05)
            except ck.KafkaException as exc:
                raise _wrap(exc, f"produce to {topic} failed") from exc

    def poll(self, timeout: float = 0.0) -> int:
        return self.client.poll(timeout)

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; return how many are still undelivered."""
        return self.client.flush(timeout)

    def close(self, timeout: float = 30.0) -> int:
        """Flush, then release the client; return how many records stayed undelivered."""
        if self._client is None:
            return 0
        try:
            return self._client.flush(timeout)
        finally:
            self._client = None
