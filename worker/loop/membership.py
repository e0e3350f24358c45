"""The member's place in its consumer group, kept outside the loop: a consumer cut off from its
group coordinator while the cluster answers is replaced (:mod:`worker.loop.rejoin`), and, for
static members only, partitions the group leaves to nobody are taken back by a rejoin
(:mod:`worker.loop.orphans`). The loop calls :meth:`Membership.step` once a step and tells it
about rebalances; it never asks whether membership is static.
"""

from __future__ import annotations

import structlog

from worker.exceptions import KafkaIOError
from worker.kafka import Consumer
from worker.loop.orphans import OrphanWatch
from worker.loop.rejoin import Rejoin
from worker.observe.vitals import Vitals

log = structlog.get_logger("worker")


class Membership:
    def __init__(self, consumer: Consumer, jobs_topic: str, rejoin: Rejoin,
                 orphans: OrphanWatch | None) -> None:
        self._consumer, self._topic = consumer, jobs_topic
        self._rejoin, self._orphans = rejoin, orphans

    def start(self) -> None:
        if self._orphans is not None:
            self._orphans.start()

    def stop(self) -> None:
        if self._orphans is not None:
            self._orphans.stop()

    def leave(self) -> None:
        """Close the consumer, leaving the group. A failed leave (a coordinator lost in a
        broker stall) is logged, not raised: what was drained is committed or repeated by the
        next owner, and the group evicts this member by its session timeout; not worth a
        non-zero exit and a restart."""
        try:
            self._consumer.close(timeout_s=10.0)
        except KafkaIOError as exc:
            log.error("consumer_close_failed", error=str(exc)[:500])

    def step(self, now: float, vitals: Vitals) -> None:
        if self._rejoin.due(now, vitals.coordinator_up, vitals.stats_at):
            log.warning("consumer_reopened", reopens=self._rejoin.reopens,
                        reason="partitions lost, not assigned again, the cluster answers")
            self._consumer.reopen()
        orphans = self._orphans
        if orphans is not None and orphans.due(now):
            log.warning("partitions_orphaned", partitions=sorted(orphans.orphans),
                        topic=self._topic, action="rejoin",
                        reason="no member of the group holds them")
            try:
                self._consumer.resubscribe()
            except KafkaIOError as exc:  # the next finding tries again; the loop goes on
                log.warning("orphan_rejoin_failed", error=str(exc)[:300])

    def rebalanced(self) -> None:
        if self._orphans is not None:  # what the watch saw before this proves nothing
            self._orphans.forget()

    def assigned(self) -> None:
        self._rejoin.assigned()
        if self._orphans is not None:  # (read here, on the loop thread: see loop/orphans.py)
            self._orphans.note_member(self._consumer.member_id())

    def lost(self) -> None:
        self._rejoin.lost()

    def totals(self) -> dict[str, int]:
        return {"consumer_reopens": self._rejoin.reopens,
                "orphan_rejoins": self._orphans.rejoins if self._orphans is not None else 0}
