"""What a committer is: the one owner of offsets, output production and commits for one
delivery guarantee. The loop (:mod:`worker.loop.worker`) never asks which guarantee it runs.

A committer is told every consumed offset (:meth:`Committer.begin`) and every output
(:meth:`Committer.emit`); it produces the outputs, decides when each offset counts as finished,
commits on its own schedule (:meth:`Committer.tick`), and owns what happens on revoke, on lost
and at shutdown. Committers are found by guarantee name in :data:`COMMITTERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import confluent_kafka as ck

from worker.config import WorkerConfig
from worker.kafka import Consumer
from worker.loop.commit.marks import CommitMarks
from worker.loop.group.assignment import Assignment
from worker.loop.hops import HopTimes
from worker.loop.output import Output, OutputBuilder
from worker.wire.records import TopicPartitionKey

# Drops the task's queued work of these partitions (their answers will be stale).
DropWork = Callable[[set[TopicPartitionKey]], None]


class Committer(Protocol):
    # Set when a failure must stop the loop without committing past it (read every step).
    fatal: BaseException | None
    # The producer's transactional.id, where it has one (for the start-up log line).
    transactional_id: str | None
    # Told the positions a committer committed other than through the consumer (inside
    # transactions), which the consumer's statistics never see (the lag metric needs them).
    on_committed: Callable[[dict[TopicPartitionKey, int]], None] | None
    # Called while a call to Kafka blocks the loop (its liveness heartbeat): a budgeted wait
    # of a live worker is no hang.
    on_wait: Callable[[], None] | None
    # The metadata its commits carry: the crash-loop breaker's counts (worker/loop/poison.py).
    marks: CommitMarks

    def start(self) -> None:
        """Open the producer (and fence an earlier incarnation, where that matters)."""

    def begin(self, topic: str, partition: int, offset: int, size: int = 0) -> None:
        """A record of ``size`` bytes was consumed: track its offset until its output is done
        with."""

    def emit(self, outs: list[Output]) -> None:
        """Produce these outputs, in order; each source offset finishes when the guarantee
        says so."""

    def tick(self, *, force: bool = False) -> None:
        """Serve delivery reports, settle failures, commit when the interval is due (now when
        ``force``)."""

    def pending(self) -> int:
        """Records consumed and not finished (the loop's backpressure counts these)."""

    def held_bytes(self) -> int:
        """Their bytes (the loop's backpressure bounds these too)."""

    def uncommitted(self) -> dict[TopicPartitionKey, int]:
        """Per partition, the offsets consumed past its committed position (the loop's
        partition hold bounds these: :mod:`worker.loop.hold`)."""

    def on_commit(self, err: ck.KafkaError | None, partitions: list[ck.TopicPartition]
                  ) -> None:
        """The consumer's commit report (librdkafka's ``on_commit``)."""

    def revoked(self, keys: set[TopicPartitionKey]) -> None:
        """Partitions are being revoked, their computing work answered: make it durable."""

    def lost(self, keys: set[TopicPartitionKey]) -> None:
        """Partitions were lost: nothing of theirs may be committed any more."""

    def forget(self, keys: set[TopicPartitionKey]) -> None:
        """Drop every trace of these partitions (after revoke or lost)."""

    def drain(self, *, failed: bool) -> None:
        """At shutdown, once the task is drained: deliver and commit what is finished."""

    def close(self, *, failed: bool) -> None:
        """Close the producer (after the consumer is closed)."""

    def request_abort(self, reason: str) -> None:
        """Exactly-once fault drill: abort the open transaction and rewind (else nothing)."""

    def track(self, key: TopicPartitionKey, committed: int) -> None:
        """A partition's committed position, known before its first record."""

    def position(self, key: TopicPartitionKey) -> int | None:
        """The position a commit of this partition would carry now."""

    def commit_marks(self, keys: Iterable[TopicPartitionKey]) -> bool:
        """Commit these partitions' positions with their marks now, synchronously (under
        exactly-once with the open transaction, or an empty one); False if it did not land."""

    def totals(self) -> dict[str, int]: ...

    def unacked_for_s(self) -> float | None:
        """How long outputs have waited for the broker without progress (None: nothing
        waits); readiness fails past ``metrics.delivery_stall_s``."""

    def blocked(self) -> str | None:
        """Why outputs cannot go out now (the cluster does not answer, an output topic is
        refused), for readiness; None when nothing blocks them."""


def make_committer(cfg: WorkerConfig, consumer: Consumer, assignment: Assignment,
                   drop_work: DropWork, hops: HopTimes, outputs: OutputBuilder) -> Committer:
    """The committer of ``processing.guarantee``."""
    return COMMITTERS[cfg.processing.guarantee](cfg, consumer, assignment, drop_work, hops,
                                                outputs)


def _at_least_once(cfg: WorkerConfig, consumer: Consumer, assignment: Assignment,
                   drop_work: DropWork, hops: HopTimes, outputs: OutputBuilder) -> Committer:
    from worker.loop.commit.at_least_once import AtLeastOnce

    return AtLeastOnce(cfg, consumer, hops, outputs)


def _exactly_once(cfg: WorkerConfig, consumer: Consumer, assignment: Assignment,
                  drop_work: DropWork, hops: HopTimes, outputs: OutputBuilder) -> Committer:
    from worker.loop.commit.exactly_once import ExactlyOnce

    return ExactlyOnce(cfg, consumer, assignment, drop_work, outputs, hops)


COMMITTERS: dict[str, Callable[[WorkerConfig, Consumer, Assignment, DropWork, HopTimes,
                                OutputBuilder], Committer]] = {
    "at-least-once": _at_least_once,
    "exactly-once": _exactly_once,
}
