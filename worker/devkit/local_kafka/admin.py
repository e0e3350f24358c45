"""Topic administration against the local (or any) broker via confluent_kafka."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .errors import LocalKafkaError

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


def create_topics(
    bootstrap: str,
    names: list[str],
    partitions: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
    replication_factor: int = 1,
    replica_assignment: list[list[int]] | None = None,
) -> None:
    """Create topics (RF 1 unless told), ignoring ones that already exist, and wait until
    every partition has a leader so an immediate produce does not race creation.
    ``replica_assignment``: node ids per partition, the first one its preferred leader (then
    the partition count and replication factor are its shape)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [
        NewTopic(n, num_partitions=len(replica_assignment),
                 replica_assignment=replica_assignment, config=dict(config or {}))
        if replica_assignment else
        NewTopic(n, num_partitions=partitions, replication_factor=replication_factor,
                 config=dict(config or {}))
        for n in names
    ]
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise LocalKafkaError(f"creating topic {name!r} failed: {err}") from exc
    _wait_leaders(admin, names, timeout)


def delete_topics(bootstrap: str, names: list[str], timeout: float = 30.0) -> None:
    """Delete topics; LocalKafkaError naming the first that could not be deleted."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the futures end
    for name, fut in admin.delete_topics(names, operation_timeout=timeout,
                                         request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            raise LocalKafkaError(f"deleting topic {name!r} failed: {exc.args[0]}") from exc


def _wait_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        meta = admin.list_topics(timeout=5)
        for name in list(pending):
            topic = meta.topics.get(name)
            if topic is not None and topic.error is None and topic.partitions and all(
                p.leader >= 0 and p.error is None for p in topic.partitions.values()
            ):
                pending.discard(name)
        if pending:
            time.sleep(0.1)
    if pending:
        raise LocalKafkaError(f"topics without leaders after {timeout:.0f}s: {sorted(pending)}")
