"""The worker's consumer: a confluent-kafka consumer with typed errors, a subscription that
survives a client replacement (:meth:`Consumer.reopen`), and a bounded close.

Settings come from :mod:`worker.kafka.clients`; nothing here connects before ``open()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import confluent_kafka as ck
import structlog

from worker.exceptions import KafkaIOError
from worker.kafka.clients import (
    ClientSettings,
    CommitCallback,
    RebalanceCallback,
    kafka_io_error,
)

log = structlog.get_logger("worker.kafka")


class Consumer:
    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = ClientSettings(settings)  # its repr masks the secrets
        self._client: ck.Consumer | None = None
        self._deferred: KafkaIOError | None = None  # take()'s failure after a record

    @property
    def client(self) -> ck.Consumer:
        if self._client is None:
            raise KafkaIOError("consumer used before open()")
        return self._client

    def open(self, on_commit: CommitCallback | None = None) -> None:
        if self._client is None:
            settings = self._settings.copy()
            if on_commit is not None:
                settings["on_commit"] = on_commit
            self._on_commit = on_commit
            self._client = ck.Consumer(settings)

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:
        self._subscription = (list(topics), on_assign, on_revoke, on_lost)
        self._subscribe(self.client)

    def _subscribe(self, client: ck.Consumer) -> None:
        topics, on_assign, on_revoke, on_lost = self._subscription

        def only_current(callback: RebalanceCallback) -> RebalanceCallback:
            # A client being retired by reopen() may still call back while it closes.
            def call(consumer: Any, partitions: list[ck.TopicPartition]) -> None:
                if consumer is self._client:
                    callback(consumer, partitions)
            return call

        client.subscribe(topics, on_assign=only_current(on_assign),
                         on_revoke=only_current(on_revoke), on_lost=only_current(on_lost))

    def reopen(self, *, join: bool = True) -> None:
        """Replace the client with a new one on the same subscription: for a client that lost
        its group coordinator in a broker outage and never rejoins (seen after a 30 s freeze of
        a single-node cluster: its JoinGroup request sat unsent for minutes). The old client
        is closed on a side thread, not waited for; its callbacks no longer reach the worker.
        ``join=False``: the new client stays out of the group until :meth:`join` (a fenced
        static member that must not take its instance id back yet)."""
        old = self._client
        self._client = None
        self.open(self._on_commit)
        if join:
            self._subscribe(self.client)
        if old is not None:  # (not waited for: the loop goes on with the new client)
            _close_bounded(old, 0.0)

    def join(self) -> None:
        """Take the subscription on the current client (after ``reopen(join=False)``)."""
        self._subscribe(self.client)

    def resubscribe(self) -> None:
        """Leave the subscription and take it again on the same client: a rejoin, so the group
        rebalances (for partitions nobody holds: :mod:`worker.loop.group.orphans`); against Apache
        Kafka 4.1.1 a static member's rejoin handed the orphans out within 2 s, where a
        restart under the same instance id never did. The revoke callback for what this member
        holds runs from the next ``consume()``, as in any rebalance."""
        try:
            self.client.unsubscribe()
            self._subscribe(self.client)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "resubscribe") from exc

    def member_id(self) -> str | None:
        """This member's id in the group (None before it joined). From the loop thread only:
        the client may be closing under any other."""
        client = self._client
        try:
            return client.memberid() if client is not None else None
        except (ck.KafkaException, RuntimeError):
            return None

    def consume(self, num_messages: int, timeout: float) -> list[ck.Message]:
        """librdkafka's consume: returns at ``num_messages`` records or at ``timeout``."""
        try:
            return self.client.consume(num_messages=num_messages, timeout=timeout)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "consume failed") from exc

    def take(self, max_records: int, wait_s: float) -> list[ck.Message]:
        """Up to ``max_records`` records, waiting at most ``wait_s`` for the first one and not
        at all for the rest. librdkafka's ``consume(n, timeout)`` returns only at ``n`` records
        or at its timeout, so a record that arrived early in the window waited for the window's
        end: the shipped 50 ms poll timeout added up to 50 ms to a job reaching an idle worker.
        ``poll()`` returns as soon as a record (or an error) is there; the records fetched with
        it are then taken without waiting. Should that second call fail, the record already
        taken is returned and the failure raised by the next call: a record dropped here while
        later ones were committed would be lost."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred
        try:
            first = self.client.poll(wait_s)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "consume failed") from exc
        if first is None:
            return []
        if max_records <= 1:
            return [first]
        try:
            rest = self.client.consume(num_messages=max_records - 1, timeout=0)
        except ck.KafkaException as exc:
            error = kafka_io_error(exc, "consume failed")
            error.__cause__ = exc
            self._deferred = error
            return [first]
        return [first, *rest]

    def commit(self, offsets: list[ck.TopicPartition]) -> None:
        """Commit these positions; returns once the coordinator answered (or raises)."""
        try:
            self.client.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "commit failed") from exc

    def commit_async(self, offsets: list[ck.TopicPartition]) -> None:
        """Send a commit and return at once; the ``on_commit`` callback given to :meth:`open`
        reports the outcome from a later ``consume()``."""
        try:
            self.client.commit(offsets=offsets, asynchronous=True)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "commit failed") from exc

    def assignment(self) -> list[ck.TopicPartition]:
        return list(self.client.assignment())

    def committed(self, partitions: list[ck.TopicPartition], timeout: float
                  ) -> list[ck.TopicPartition]:
        """The group's committed positions as the coordinator has them (offset < 0: none),
        with their commit metadata."""
        try:
            return list(self.client.committed(partitions, timeout=timeout))
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "committed offsets unavailable") from exc

    def assign(self, partitions: list[ck.TopicPartition]) -> None:
        """Read these partitions from their offsets, outside any group (a reader's consumer:
        :func:`worker.kafka.clients.reader_settings`); replaces the assignment."""
        try:
            self.client.assign(partitions)
        except ck.KafkaException as exc:
            where = partitions[0].topic if partitions else "nothing"
            raise kafka_io_error(exc, f"assign {where} failed") from exc

    def position(self, partitions: list[ck.TopicPartition]) -> list[ck.TopicPartition]:
        """Where reading stands in each partition: one past the last record returned
        (negative: nothing returned yet). Local, no broker round trip."""
        try:
            return list(self.client.position(partitions))
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "position unavailable") from exc

    def incremental_assign(self, partitions: list[ck.TopicPartition]) -> None:
        """Add partitions to the assignment (from the assign callback, which then leaves it
        to us: confluent-kafka assigns only what the callback did not)."""
        try:
            self.client.incremental_assign(partitions)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "incremental_assign failed") from exc

    def watermarks(self, partition: ck.TopicPartition, timeout: float) -> tuple[int, int]:
        """The partition's low and high watermarks, asked of its leader."""
        try:
            low, high = self.client.get_watermark_offsets(partition, timeout=timeout)
        except ck.KafkaException as exc:
            where = f"{partition.topic}[{partition.partition}]"
            raise kafka_io_error(exc, f"watermarks of {where} unavailable") from exc
        return int(low), int(high)

    def group_metadata(self) -> object:
        """The member's group metadata (group, generation, member id) for
        ``send_offsets_to_transaction``: the coordinator rejects it once the generation moved
        on, which fences a zombie's offsets (KIP-447)."""
        try:
            return self.client.consumer_group_metadata()
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "consumer_group_metadata failed") from exc

    def seek(self, partition: ck.TopicPartition) -> None:
        """Move an assigned partition's fetch position; records fetched before are discarded."""
        try:
            self.client.seek(partition)
        except ck.KafkaException as exc:
            where = f"{partition.topic}[{partition.partition}]"
            raise kafka_io_error(exc, f"seek {where} failed") from exc

    def pause(self, partitions: list[ck.TopicPartition]) -> None:
        if partitions:
            self.client.pause(partitions)

    def resume(self, partitions: list[ck.TopicPartition]) -> None:
        if partitions:
            self.client.resume(partitions)

    def serve(self, timeout: float) -> None:
        """Serve callbacks (commit reports, rebalances) for up to ``timeout`` seconds without
        taking records: the assignment is paused first. For waits at shutdown only."""
        try:
            self.client.pause(self.client.assignment())
            self.client.poll(timeout)
        except ck.KafkaException as exc:
            raise kafka_io_error(exc, "consumer poll failed") from exc

    def close(self, timeout_s: float = 30.0) -> None:
        """Leave the group and release the client (the rebalance callbacks run from here).

        Bounded: a client whose coordinator does not answer can block in close() for minutes,
        past the process's shutdown timeout. After ``timeout_s`` it is left closing on its
        side thread (a KafkaIOError says so); what was drained is committed already."""
        client = self._client
        if client is None:
            return
        try:  # (still the current client meanwhile: its revoke callback is the worker's)
            finished = _close_bounded(client, timeout_s)
        finally:
            self._client = None
        if not finished:
            raise KafkaIOError(f"consumer close did not finish within {timeout_s:.0f} s")


def _close_bounded(client: ck.Consumer, timeout_s: float) -> bool:
    """``client.close()`` on a daemon thread, waited for ``timeout_s`` (0: not at all); True
    if it finished. Its rebalance callbacks run on that thread and reach the worker only while
    it is still the current client (``Consumer._subscribe``). A KafkaException from close is
    re-raised as KafkaIOError when it finishes in time."""
    errors: list[BaseException] = []

    def close() -> None:
        try:
            client.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            errors.append(exc)

    t = threading.Thread(target=close, name="consumer-close", daemon=True)
    t.start()
    if timeout_s <= 0:
        return False
    t.join(timeout_s)
    if errors:
        exc = errors[0]
        if isinstance(exc, ck.KafkaException):
            raise kafka_io_error(exc, "consumer close failed") from exc
        raise exc
    if t.is_alive():
        log.warning("consumer_close_timeout", waited_s=timeout_s, still_closing=True)
        return False
    return True
