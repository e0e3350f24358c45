"""Cluster metadata for the worker's start-up checks, its side threads (the cluster probe,
the orphan watch), the admin commands and the replay: the one AdminClient wrapper, with the
worker's connection and security settings, and the look-ups they share. Every librdkafka
error leaves here as a :class:`~worker.exceptions.KafkaIOError`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
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
from worker.exceptions import KafkaIOError, TopicNotAuthorized, UnknownTopic

# The settings every client of the worker shares (brokers, client id, security, kafka.extra)
# and librdkafka's error classification: the worker's own clients are built from the same.
from worker.kafka.clients import ClientSettings, common_settings, kafka_io_error
from worker.kafka.consumer import Consumer

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


@dataclass(frozen=True, slots=True)
class Found:
    """An offset found by timestamp, with the timestamp of the record there."""

    offset: int  # -1 when no record is at or after the time
    timestamp: int


class Admin:
    """Metadata, configs, groups and offsets; nothing here reads or writes a record.

    ``source``: the worker's config (its :func:`admin_settings`), or settings already built
    by :mod:`worker.kafka.clients` (the loop's side threads get ``common_settings``)."""

    def __init__(self, source: WorkerConfig | Mapping[str, Any], timeout: float = 30.0
                 ) -> None:
        self.timeout = timeout
        self._settings = (admin_settings(source) if isinstance(source, WorkerConfig)
                          else ClientSettings(source))
        try:
            self.client = AdminClient(self._settings)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "could not create the admin client") from exc

    def metadata(self, topic: str | None = None) -> Any:
        """The cluster's metadata: every topic this client may see, or only ``topic``."""
        try:
            return self.client.list_topics(topic, timeout=self.timeout)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "could not read cluster metadata") from exc

    def answers(self) -> bool:
        """Whether the cluster answers a metadata request with brokers, within the timeout
        (a probe: never raises)."""
        try:
            return bool(self.metadata().brokers)
        except (KafkaIOError, RuntimeError):
            return False

    def poll(self, timeout: float = 0.0) -> None:
        """Serve the client's log lines and error events (a long-lived admin client)."""
        self.client.poll(timeout)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; :class:`UnknownTopic` if it does not exist (naming the
        topics there are)."""
        topics = self.metadata().topics
        found = topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            known = sorted(t for t in topics if not t.startswith("__"))
            hint = f" (topics: {', '.join(known[:20])})" if known else ""
            raise UnknownTopic(f"topic {topic!r} does not exist{hint}")
        return sorted(found.partitions)

    def describe_group(self, group: str) -> Any:
        """The group's description (state, members and their assignments).

        Only the wait is bounded, not librdkafka's request: a coordinator request that times
        out inside librdkafka while the coordinator's node goes away can abort the process
        (its assertion ``eonce->refcnt > 0``, issue 3663); bench/NOTES.md has the drills."""
        try:
            futures = self.client.describe_consumer_groups([group])
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, f"describe group {group!r}") from exc
        return wait(futures[group], f"describe group {group!r}", self.timeout)

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
        consumer = Consumer(self._settings | {"group.id": group, "enable.auto.commit": False})
        try:
            consumer.open()
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
                except KafkaIOError as err:
                    if err.code not in _COORDINATOR_BUSY or time.monotonic() > deadline:
                        # A group the principal may not READ makes librdkafka's consumer
                        # time out, not refuse: ask the broker, and say so by name.
                        if _group_refused(self, group):
                            raise TopicNotAuthorized(
                                f"the broker's ACLs do not let this client READ on group "
                                f"{group} (committed offsets unavailable: {err})") from err
                        raise KafkaIOError(f"committed offsets of group {group!r}: {err}",
                                           code=err.code,
                                           recoverable=err.recoverable) from err
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

    def _list_offsets(self, topic: str, specs: dict[int, Any], what: str, *,
                      committed_only: bool) -> dict[int, Any]:
        """ListOffsets for ``topic``'s partitions: each partition's answer (offset,
        timestamp)."""
        if not specs:
            return {}
        level = (ck.IsolationLevel.READ_COMMITTED if committed_only
                 else ck.IsolationLevel.READ_UNCOMMITTED)
        request = {ck.TopicPartition(topic, p): spec for p, spec in specs.items()}
        try:
            futures = self.client.list_offsets(request, isolation_level=level,
                                               request_timeout=self.timeout)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, f"list {what} offsets of {topic}") from exc
        return {tp.partition: wait(f, f"list {what} offsets of {topic}", self.timeout)
                for tp, f in futures.items()}

    def watermarks(self, topic: str, partitions: Iterable[int], *, committed_only: bool = False
                   ) -> dict[int, tuple[int, int]]:
        """(log start, end) per partition. The end is the high watermark, or with
        ``committed_only`` the last stable offset (what a read_committed reader reaches)."""
        parts = list(partitions)
        ends = {name: self._list_offsets(topic, dict.fromkeys(parts, spec), name,
                                         committed_only=committed_only)
                for name, spec in (("earliest", OffsetSpec.earliest()),  # type: ignore[no-untyped-call]
                                   ("latest", OffsetSpec.latest()))}  # type: ignore[no-untyped-call]
        return {p: (ends["earliest"][p].offset, ends["latest"][p].offset) for p in parts}

    def offsets_for_time(self, topic: str, partitions: Iterable[int], ms: int
                         ) -> dict[int, Found]:
        """Per partition, the first offset whose timestamp is >= ``ms`` (and that timestamp),
        as a read_committed reader sees the partition."""
        spec = OffsetSpec.for_timestamp(ms)
        got = self._list_offsets(topic, dict.fromkeys(partitions, spec), "by-timestamp",
                                 committed_only=True)
        return {p: Found(r.offset, r.timestamp) for p, r in got.items()}


def _group_refused(admin: Admin, group: str) -> bool:
    """Whether the broker says this client may not READ ``group`` (the start-up check's
    :func:`worker.kafka.topics.group_operations`; False when it reports nothing)."""
    from worker.kafka.topics import group_operations  # (topics imports this module)

    ops = group_operations(admin, group)
    return ops is not None and not {"READ", "ALL"} & ops
