"""The member's place in its consumer group, kept outside the loop: a consumer cut off from its
group coordinator while the cluster answers is replaced (:mod:`worker.loop.rejoin`), and, for
static members only, partitions the group leaves to nobody are taken back by a rejoin
(:mod:`worker.loop.orphans`) and a member fenced while no other process holds its instance id
rejoins with a new client (:class:`StaticFencing`). The loop calls :meth:`Membership.step` once
a step and tells it about rebalances; it never asks whether membership is static.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from worker.exceptions import KafkaIOError, StaticMemberFenced
from worker.kafka import Consumer
from worker.kafka.admin import Admin
from worker.kafka.clients import ClientSettings
from worker.loop.orphans import OrphanWatch
from worker.loop.rejoin import Rejoin
from worker.observe.vitals import Vitals

log = structlog.get_logger("worker")

# A fenced static member rejoins at most this often in FENCING_WINDOW_S; past that it stops
# (two processes sharing an instance id whose client ids cannot tell them apart would fence
# each other for ever).
MAX_FENCED_REJOINS = 3
FENCING_WINDOW_S = 600.0
# How long the group's description may take: the loop waits for it (once per fencing).
DESCRIBE_TIMEOUT_S = 5.0


class StaticFencing:
    """Whether a static member the coordinator fenced may rejoin with a new client.

    A fencing is real when another process joined with this ``group.instance.id`` (a second
    pod with the same name, a restarted instance whose old self still runs): that one keeps
    the id and this one stops. After a group-coordinator failover librdkafka can be fenced
    with no other process there (issues 3437, 5456: in the cluster drill, both exactly-once
    workers exited 2 in three runs out of four); exiting then costs a restart and, under
    exactly-once, a rewind. So the group is asked who holds the id: a member with another
    ``client.id`` (the default names host and pid) is another process; this client's own
    (stale) entry, no entry, or no answer are not. Rejoins are bounded
    (:data:`MAX_FENCED_REJOINS` in :data:`FENCING_WINDOW_S`)."""

    def __init__(self, settings: Mapping[str, Any], group: str, instance_id: str,
                 client_id: str, clock: Callable[[], float] = time.monotonic,
                 describe: Callable[[], Any] | None = None) -> None:
        self._settings = ClientSettings(settings)  # (a copy whose repr masks the secrets)
        self._group, self._instance, self._client_id = group, instance_id, client_id
        self._clock = clock
        self._describe = describe or self._describe_group
        self._rejoins: deque[float] = deque()

    def _describe_group(self) -> Any:
        return Admin(self._settings, timeout=DESCRIBE_TIMEOUT_S).describe_group(self._group)

    def refusal(self) -> str | None:
        """Why this member must not rejoin, or None (a rejoin is counted)."""
        now = self._clock()
        while self._rejoins and now - self._rejoins[0] > FENCING_WINDOW_S:
            self._rejoins.popleft()
        if len(self._rejoins) >= MAX_FENCED_REJOINS:
            return (f"fenced {len(self._rejoins) + 1} times in {FENCING_WINDOW_S:.0f} s: "
                    f"another process may share group.instance.id {self._instance!r}")
        try:
            group = self._describe()
        except Exception as exc:  # noqa: BLE001 - no answer proves no other holder
            log.warning("fencing_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            group = None
        for member in getattr(group, "members", None) or ():
            if member.group_instance_id == self._instance and member.client_id != self._client_id:
                return (f"group.instance.id {self._instance!r} is held by another client "
                        f"({member.client_id} at {member.host})")
        self._rejoins.append(now)
        return None


class Membership:
    def __init__(self, consumer: Consumer, jobs_topic: str, rejoin: Rejoin,
                 orphans: OrphanWatch | None, fencing: StaticFencing | None = None) -> None:
        self._consumer, self._topic = consumer, jobs_topic
        self._rejoin, self._orphans, self._fencing = rejoin, orphans, fencing
        self.fenced_rejoins = 0

    def fenced(self, exc: StaticMemberFenced, lose_all: Callable[[], None]) -> None:
        """The coordinator fenced this static member. Rejoin with a new client when no other
        process holds the instance id (:class:`StaticFencing`), after ``lose_all`` dropped
        every partition as lost; otherwise raise ``exc``: the process stops."""
        why = (self._fencing.refusal() if self._fencing is not None
               else "not a static member")
        if why is not None:
            raise StaticMemberFenced(f"{exc} ({why})", code=exc.code) from exc
        lose_all()
        self.fenced_rejoins += 1
        log.warning("consumer_reopened", reopens=self.fenced_rejoins, error=str(exc)[:300],
                    reason="fenced as a static member while no other process holds its "
                           "instance id")
        self._consumer.reopen()

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
        return {"consumer_reopens": self._rejoin.reopens, "fenced_rejoins": self.fenced_rejoins,
                "orphan_rejoins": self._orphans.rejoins if self._orphans is not None else 0}
