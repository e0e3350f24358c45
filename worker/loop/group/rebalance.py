"""The loop's rebalance callbacks (cooperative-sticky; librdkafka calls them from consume()).

On revoke, queued jobs of the revoked partitions are dropped (their new owner redoes them),
batches in flight finish and the committer makes their outputs durable; on lost, the task's
queued work is dropped and the committer makes sure nothing of theirs is committed. Either
way every trace of the partitions is forgotten and their epoch moves on, so late answers of
theirs are discarded as stale. No exception may reach librdkafka: a recoverable Kafka error is
logged, anything else is kept in :attr:`Rebalance.fatal` for the loop to stop on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import structlog

from worker.exceptions import KafkaIOError, TransactionError
from worker.loop.build import LoopParts
from worker.tasks.protocol import Answer, Task
from worker.wire.records import TopicPartitionKey

log = structlog.get_logger("worker")


class Rebalance:
    def __init__(self, task: Task, parts: LoopParts, emit: Callable[[list[Answer]], None],
                 failed: Callable[[], bool]) -> None:
        self._task, self._parts, self._emit, self._failed = task, parts, emit, failed
        self.fatal: BaseException | None = None

    def on_assign(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        p = self._parts
        # librdkafka keeps a partition's pause across a rebalance: one paused when it was lost
        # (an outage's wait, a hold) came back paused for good, and the worker answered
        # nothing more (seen after a 180 s broker stall). Whatever still wants it paused
        # pauses it again: the breaker below, the hold and the committer at their next check.
        p.consumer.resume(partitions)
        self._rebalanced("assigned", partitions)
        if p.poison is not None:  # (assigns them itself, once their marks are written)
            p.poison.assigned(partitions)
        p.membership.assigned()
        log.info("partitions_assigned", partitions=names(partitions))

    def on_revoke(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = self._rebalanced("revoked", partitions)
        log.info("partitions_revoked", partitions=names(partitions))
        try:
            if not self._failed():
                # Queued jobs are dropped uncommitted (the new owner redoes them); batches
                # already computing finish, and the committer makes their outputs durable.
                self._task.remove(keys)
                self._emit(self._task.collect(block=True))
                self._parts.committer.revoked(keys)
        except Exception as exc:  # noqa: BLE001 - never let an exception into librdkafka
            self._callback_failed("revoke_commit", exc)
        finally:
            self._forget(keys)

    def on_lost(self, consumer: Any, partitions: list[ck.TopicPartition]) -> None:
        keys = self._rebalanced("lost", partitions)
        self._parts.membership.lost()
        log.warning("partitions_lost", partitions=names(partitions))
        try:
            self._task.remove(keys)
            if not self._failed():
                self._parts.committer.lost(keys)
        except Exception as exc:  # noqa: BLE001 - never let an exception into librdkafka
            self._callback_failed("lost_abort", exc)
        finally:
            self._forget(keys)  # never committed; late outcomes of theirs are discarded

    def lose_all(self) -> None:
        """Every partition this member owns, lost (its consumer client was fenced)."""
        owned = sorted(self._parts.assignment.owned)
        self.on_lost(None, [ck.TopicPartition(topic, partition) for topic, partition in owned])

    def _rebalanced(self, kind: str, partitions: list[ck.TopicPartition]
                    ) -> set[TopicPartitionKey]:
        keys = {(tp.topic, tp.partition) for tp in partitions}
        owned = self._parts.assignment.owned
        if kind == "assigned":
            owned |= keys
        else:
            owned -= keys
        self._parts.vitals.rebalanced(kind, len(partitions))
        self._parts.membership.rebalanced()
        return keys

    def _forget(self, keys: set[TopicPartitionKey]) -> None:
        p = self._parts
        p.committer.forget(keys)
        p.hold.forget(keys)
        p.vitals.forget(keys)
        p.assignment.bump(keys)
        if p.poison is not None:
            p.poison.forget(keys)

    def _callback_failed(self, where: str, exc: BaseException) -> None:
        if (isinstance(exc, TransactionError) and not exc.fatal) or \
                (isinstance(exc, KafkaIOError) and not isinstance(exc, TransactionError)):
            log.warning(f"{where}_failed", error=str(exc))
            return
        log.error(f"{where}_failed", error=str(exc), fatal=True)
        self.fatal = self.fatal or exc


def names(partitions: list[ck.TopicPartition]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions]
