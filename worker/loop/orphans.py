"""Partitions of the jobs topic that no member of the group holds: found, and handed out again.

With static membership and the cooperative protocol, a member killed between the two rounds
of an incremental rebalance (it gave a partition up in the first round; the second round would
hand it to another member) leaves that partition to nobody. Its restarted self rejoins under
the same instance id, and the broker gives it back its stored assignment without a rebalance
(KIP-345), so the second round never comes. Against Apache Kafka 4.1.1 with librdkafka 2.16 a
member SIGKILLed inside its revoke callback left its three revoked partitions unassigned for
the 400 s we watched, whatever ``max.poll.interval.ms``; the kill -9 fault test once saw a
partition sit for five minutes until an unrelated rebalance.

So a static member's worker checks the group off the loop thread every ``CHECK_EVERY_S``
(an admin client: the group's members and their assignments, the topic's partition count).
When the group is Stable and some partition is in no member's assignment on two checks in a
row, the loop rejoins (unsubscribe, subscribe: :meth:`worker.kafka.Consumer.resubscribe`):
that runs a rebalance, and the cooperative assignor hands the orphan out. One member acts, the
one whose member id sorts first; the others act as well if the orphans outlast
``ESCALATE_CHECKS`` checks (the first may be the one that is stuck). Actions are at least
``MIN_GAP_S`` apart. Dynamic members need none of this: a new member always starts a
rebalance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import confluent_kafka as ck
import structlog
from confluent_kafka.admin import AdminClient

log = structlog.get_logger("worker")

CHECK_EVERY_S = 5.0
CHECK_TIMEOUT_S = 5.0
ESCALATE_CHECKS = 4
MIN_GAP_S = 30.0


def orphaned(partitions: int, topic: str,
             assignments: Iterable[Iterable[tuple[str, int]]]) -> set[int]:
    """The partitions ``0 .. partitions-1`` of ``topic`` in none of the members'
    ``assignments`` (each an iterable of (topic, partition))."""
    held = {p for member in assignments for t, p in member if t == topic}
    return set(range(partitions)) - held


class OrphanWatch:
    """Checks the group every CHECK_EVERY_S on a side thread; :meth:`due` tells the loop
    when to rejoin."""

    def __init__(self, settings: dict[str, Any], group: str, topic: str,
                 member_id: Callable[[], str | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings, self._group, self._topic = dict(settings), group, topic
        self._member_id, self._clock = member_id, clock
        self._streak = 0
        self._due = False
        self._not_before = 0.0
        self.orphans: set[int] = set()
        self.rejoins = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="orphan-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def due(self, now: float) -> bool:
        """True once per finding: the loop should rejoin now."""
        if not self._due or now < self._not_before:
            return False
        self._due, self._streak = False, 0
        self._not_before = now + MIN_GAP_S
        self.rejoins += 1
        return True

    def observe(self, orphans: set[int], first: bool) -> None:
        """One check's outcome: ``orphans`` (empty when the group was not Stable or held
        every partition) and whether this member's id sorts first in the group."""
        self._streak = self._streak + 1 if orphans else 0
        self.orphans = orphans
        if self._streak >= 2 and (first or self._streak >= ESCALATE_CHECKS):
            self._due = True

    def _run(self) -> None:
        admin: AdminClient | None = None
        while not self._stop.wait(CHECK_EVERY_S):
            try:
                admin = admin or AdminClient(dict(self._settings))
                self.observe(*self._check(admin))
            except (ck.KafkaException, RuntimeError, KeyError, TimeoutError) as exc:
                # A check that fails proves nothing either way: the streak starts again. The
                # first failure is a warning (e.g. no Describe ACL on the group), later ones
                # are not repeated at that level.
                self._streak = 0
                self.failures += 1
                (log.warning if self.failures == 1 else log.debug)(
                    "orphan_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    def _check(self, admin: AdminClient) -> tuple[set[int], bool]:
        group = admin.describe_consumer_groups([self._group])[self._group].result(
            timeout=CHECK_TIMEOUT_S)
        if group.state != ck.ConsumerGroupState.STABLE or not group.members:
            return set(), False
        meta = admin.list_topics(self._topic, timeout=CHECK_TIMEOUT_S).topics[self._topic]
        if meta.error is not None:
            return set(), False
        orphans = orphaned(len(meta.partitions), self._topic, (
            [(tp.topic, tp.partition) for tp in m.assignment.topic_partitions]
            for m in group.members))
        me = self._member_id()
        first = me is not None and min(m.member_id for m in group.members) == me
        return orphans, first
