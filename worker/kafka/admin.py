"""Cluster metadata for the worker's start-up checks and the admin commands: an AdminClient
with the worker's connection and security settings, and the look-ups they share. Every
librdkafka error leaves here as a :class:`~worker.exceptions.KafkaIOError`."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck

# confluent_kafka.admin re-exports these untyped; its private modules carry the types.
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._resource import ResourceType

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError, UnknownTopic

# The settings every client of the worker shares (brokers, client id, security, kafka.extra)
# and librdkafka's error classification: the worker's own clients are built from the same.
from worker.kafka.clients import ClientSettings, common_settings, kafka_io_error

_COORDINATOR_BUSY = frozenset({ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                               ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
                               ck.KafkaError.NOT_COORDINATOR})


def admin_settings(cfg: WorkerConfig) -> ClientSettings:
    return common_settings(cfg.kafka)


def wait(fut: Future[Any], what: str, timeout: float) -> Any:
    """``fut.result()`` with librdkafka's errors (and no answer) as KafkaIOError."""
    try:
        return fut.result(timeout)
    except ck.KafkaException as exc:
        raise kafka_io_error(exc, what) from exc
    except TimeoutError as exc:
        raise KafkaIOError(f"{what}: no answer in {timeout:.0f} s", recoverable=True) from exc


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    replication: int
    configs: dict[str, str]  # effective values (set on the topic or inherited)

    @property
    def max_message_bytes(self) -> int:
        return int(self.configs["max.message.bytes"])


class Admin:
    """Metadata, configs and offsets; nothing here reads or writes a record."""

    def __init__(self, cfg: WorkerConfig, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._settings = admin_settings(cfg)
        try:
            self.client = AdminClient(self._settings)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "could not create the admin client") from exc

    def metadata(self) -> Any:
        try:
            return self.client.list_topics(timeout=self.timeout)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "could not read cluster metadata") from exc

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; :class:`UnknownTopic` if it does not exist."""
        found = self.metadata().topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise UnknownTopic(f"topic {topic!r} does not exist")
        return sorted(found.partitions)

    def configs(self, kind: ResourceType, name: str) -> dict[str, str]:
        res = ConfigResource(kind, name)
        futures = self.client.describe_configs([res], request_timeout=self.timeout)
        entries = wait(futures[res], f"describe {kind.name.lower()} {name!r}", self.timeout)
        return {k: e.value for k, e in entries.items() if e.value is not None}

    def broker_configs(self) -> dict[str, str]:
        """One broker's configuration: the defaults a new topic inherits."""
        brokers = self.metadata().brokers
        if not brokers:
            raise KafkaIOError("the cluster metadata lists no brokers", recoverable=True)
        return self.configs(ResourceType.BROKER, str(min(brokers)))

    def describe(self, names: list[str]) -> dict[str, TopicInfo]:
        """Those of ``names`` that exist, with partition count, replication and configs."""
        topics = self.metadata().topics
        out: dict[str, TopicInfo] = {}
        for name in names:
            meta = topics.get(name)
            if meta is None or meta.error is not None or not meta.partitions:
                continue
            replication = max(len(p.replicas) for p in meta.partitions.values())
            out[name] = TopicInfo(name, len(meta.partitions), replication,
                                  self.configs(ResourceType.TOPIC, name))
        return out

    def authorized_operations(self, names: list[str]) -> dict[str, frozenset[str] | None]:
        """What this client may do on each topic, by ACL operation name (``READ``, ``WRITE``,
        ``ALL``...), as the broker reports it (KIP-430); None where it reports nothing. A
        broker without an authorizer reports every operation."""
        unique = list(dict.fromkeys(names))
        futures = self.client.describe_topics(ck.TopicCollection(unique),
                                              include_authorized_operations=True,
                                              request_timeout=self.timeout)
        out: dict[str, frozenset[str] | None] = {}
        for name in unique:
            ops = wait(futures[name], f"describe topic {name!r}", self.timeout
                       ).authorized_operations
            out[name] = None if ops is None else frozenset(op.name for op in ops)
        return out

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        """The group's committed offset per partition (None: no commit). A coordinator that
        is still loading (a broker just started) or moving is asked again.

        Asked through a consumer of the group that never joins it, not the admin API's
        ListConsumerGroupOffsets: librdkafka's admin client crashes the process (SIGSEGV in
        rd_kafka_cgrp_op, librdkafka issue 5040) when that request meets NOT_COORDINATOR,
        as it does on a freshly started broker; a consumer has the group machinery it
        needs."""
        settings = self._settings | {"group.id": group, "enable.auto.commit": False}
        try:
            consumer = ck.Consumer(settings)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "could not create a consumer to read committed offsets"
                                 ) from exc
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                try:
                    got = consumer.committed([ck.TopicPartition(topic, p) for p in partitions],
                                             timeout=max(1.0, deadline - time.monotonic()))
                    break
                except ck.KafkaException as exc:
                    err = kafka_io_error(exc, f"committed offsets of group {group!r}")
                    if err.code not in _COORDINATOR_BUSY or time.monotonic() > deadline:
                        raise err from exc
                    time.sleep(0.2)
        finally:
            consumer.close()
        out: dict[int, int | None] = dict.fromkeys(partitions)
        for tp in got:
            if tp.error is not None:
                raise KafkaIOError(f"committed offset of {group!r} on {topic}[{tp.partition}]: "
                                   f"{tp.error.str()}", code=tp.error.code())
            if tp.topic == topic and tp.partition in out and tp.offset >= 0:
                out[tp.partition] = tp.offset
        return out

    def watermarks(self, topic: str, partitions: list[int], *, committed_only: bool = False
                   ) -> dict[int, tuple[int, int]]:
        """(log start, end) per partition. The end is the high watermark, or with
        ``committed_only`` the last stable offset (what a read_committed reader reaches)."""
        level = (ck.IsolationLevel.READ_COMMITTED if committed_only
                 else ck.IsolationLevel.READ_UNCOMMITTED)
        ends: dict[str, dict[int, int]] = {}
        for name, spec in (("earliest", OffsetSpec.earliest()),  # type: ignore[no-untyped-call]
                           ("latest", OffsetSpec.latest())):  # type: ignore[no-untyped-call]
            specs = {ck.TopicPartition(topic, p): spec for p in partitions}
            try:
                futures = self.client.list_offsets(specs, isolation_level=level,
                                                   request_timeout=self.timeout)
            except ck.KafkaException as exc:
                raise kafka_io_error(exc, f"list {name} offsets of {topic}") from exc
            ends[name] = {tp.partition: wait(f, f"list {name} offsets of {topic}",
                                             self.timeout).offset
                          for tp, f in futures.items()}
        return {p: (ends["earliest"][p], ends["latest"][p]) for p in partitions}
