"""The member's place in its consumer group, kept outside the loop: a consumer cut off from its
group coordinator while the cluster answers is replaced (:mod:`worker.loop.group.rejoin`), and, for
static members only, partitions the group leaves to nobody are taken back by a rejoin
(:mod:`worker.loop.group.orphans`) and a member fenced while no other process holds its instance id
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
from worker.loop.group.orphans import OrphanWatch
from worker.loop.group.rejoin import Rejoin
from worker.observe.vitals import Vitals

log = structlog.get_logger("worker")

# A fenced static member rejoins at most this often in FENCING_WINDOW_S; past that it stops
# (two processes sharing an instance id whose client ids cannot tell them apart would fence
# each other for ever).
MAX_FENCED_REJOINS = 3
FENCING_WINDOW_S = 600.0
# How long the group's description may take: the loop waits for it (once per fencing).
DESCRIBE_TIMEOUT_S = 5.0
# Waited beyond the group's heartbeat timeout before it is asked who holds the instance id.
CHECK_MARGIN_S = 2.0


class StaticFencing:
    """Whether a static member the coordinator fenced may rejoin with a new client.

    A fencing is real when another process joined with this ``group.instance.id`` (a second
    process given the same id, a restarted instance whose old self still runs): that one keeps
    the id and this one stops. After a group-coordinator failover librdkafka can be fenced
    with no other process there (its issues 3437, 5456); exiting then costs a restart and,
    under exactly-once, a rewind. The group's description cannot tell the two apart at once: right
    after another process took the id over, Kafka 4.1 still listed the old member's client id
    and host for it. So the fenced member waits out the session timeout with a client that is
    out of the group, then asks: a member still holding the id is heartbeating, so it is
    another process; no holder (or no answer) means no one else. Rejoins are bounded
    (:data:`MAX_FENCED_REJOINS` in :data:`FENCING_WINDOW_S`)."""

    def __init__(self, settings: Mapping[str, Any], group: str, instance_id: str,
                 session_timeout_ms: int, clock: Callable[[], float] = time.monotonic,
                 describe: Callable[[], Any] | None = None) -> None:
        self._settings = ClientSettings(settings)  # (a copy whose repr masks the secrets)
        self._group, self._instance = group, instance_id
        # A holder that is not heartbeating has left the group by then.
        self.wait_s = session_timeout_ms / 1e3 + CHECK_MARGIN_S
        self._clock = clock
        self._describe = describe or self._describe_group
        self._rejoins: deque[float] = deque()

    def _describe_group(self) -> Any:
        return Admin(self._settings, timeout=DESCRIBE_TIMEOUT_S).describe_group(self._group)

    def over_budget(self) -> str | None:
        """Why no more rejoins are allowed now, or None."""
        now = self._clock()
        while self._rejoins and now - self._rejoins[0] > FENCING_WINDOW_S:
            self._rejoins.popleft()
        if len(self._rejoins) >= MAX_FENCED_REJOINS:
            return (f"fenced {len(self._rejoins) + 1} times in {FENCING_WINDOW_S:.0f} s: "
                    f"another process may share group.instance.id {self._instance!r}")
        return None

    def holder(self) -> str | None:
        """Who holds this instance id in the group now, or None (a rejoin is counted)."""
        try:
            group = self._describe()
        except Exception as exc:  # noqa: BLE001 - no answer is taken as no other holder
            log.warning("fencing_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            group = None
        for member in getattr(group, "members", None) or ():
            if member.group_instance_id == self._instance:
                return f"member {member.member_id} ({member.client_id} at {member.host})"
        self._rejoins.append(self._clock())
        return None


class Membership:
    def __init__(self, consumer: Consumer, jobs_topic: str, rejoin: Rejoin,
                 orphans: OrphanWatch | None, fencing: StaticFencing | None = None) -> None:
        self._consumer, self._topic = consumer, jobs_topic
        self._rejoin, self._orphans, self._fencing = rejoin, orphans, fencing
        self.fenced_rejoins = 0
        self._check_at: float | None = None  # fenced: when to ask who holds the instance id
        self._fenced_error = ""

    def fenced(self, exc: StaticMemberFenced, lose_all: Callable[[], None]) -> None:
        """The coordinator fenced this static member: ``lose_all`` drops every partition as
        lost and the client is replaced by one out of the group; :meth:`step` rejoins after
        the session timeout unless another process holds the instance id then
        (:class:`StaticFencing`). Raises ``exc`` (the process stops) for a dynamic member or
        past the rejoin budget."""
        if self._check_at is not None:  # (already waiting)
            return
        why = (self._fencing.over_budget() if self._fencing is not None
               else "not a static member")
        if why is not None:
            raise StaticMemberFenced(f"{exc} ({why})", code=exc.code) from exc
        assert self._fencing is not None
        lose_all()
        self._consumer.reopen(join=False)
        self._check_at = time.monotonic() + self._fencing.wait_s
        self._fenced_error = str(exc)[:300]
        log.warning("consumer_fenced", error=self._fenced_error, wait_s=self._fencing.wait_s,
                    reason="fenced as a static member: rejoining unless another process "
                           "holds the instance id once the session timeout has passed")

    def _after_fencing(self, now: float, check_at: float, fencing: StaticFencing) -> None:
        if now < check_at:
            return  # (the rejoin watch waits too: the new client is not in the group)
        self._check_at = None
        holder = fencing.holder()
        if holder is not None:
            raise StaticMemberFenced(f"{self._fenced_error} (its group.instance.id is held by "
                                     f"{holder})")
        self.fenced_rejoins += 1
        log.warning("consumer_reopened", reopens=self.fenced_rejoins,
                    reason="fenced as a static member while no other process holds its "
                           "instance id")
        self._consumer.join()

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
        if self._check_at is not None and self._fencing is not None:
            # Fenced: out of the group until the check.
            self._after_fencing(now, self._check_at, self._fencing)
            return
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
        if self._orphans is not None:  # (read here, on the loop thread: see loop/group/orphans.py)
            self._orphans.note_member(self._consumer.member_id())

    def lost(self) -> None:
        self._rejoin.lost()

    def totals(self) -> dict[str, int]:
        return {"consumer_reopens": self._rejoin.reopens, "fenced_rejoins": self.fenced_rejoins,
                "orphan_rejoins": self._orphans.rejoins if self._orphans is not None else 0}
