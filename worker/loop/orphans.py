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
(its own admin client: the group's members and their assignments, the topic's partition
count; it never touches the consumer). When the group is Stable and the same partitions have
been in no member's assignment for longer than :func:`persist_threshold` (the longer of the
session timeout and a revoke callback's bound, plus a margin), the loop rejoins (unsubscribe,
subscribe: :meth:`worker.kafka.Consumer.resubscribe`): that runs a rebalance, and the
cooperative assignor hands the orphans out.

Why that long: orphans that pass on their own must not cause rejoins. Between the rounds of a
normal cooperative rebalance a partition is nobody's while the revoking member runs its revoke
callback, and the group can read Stable meanwhile. The broker sets that gap no limit short of
``max.poll.interval.ms``; the worker's callback finishes the batches in flight (each within
``processing.max_batch_ms``, logged, not enforced) and flushes and commits (each within
``commit.drain_timeout_s``), so the worker passes that bound in. A member killed and not
restarted keeps its partitions "assigned" until its session times out, and then the broker's
own rebalance hands them out. Only what outlasts both is stuck. Any rebalance callback of this
member restarts the clock, and a finding is acted on only while it is fresh.

One member acts, the one whose member id sorts first; the others act as well if the orphans
last twice as long (the first may be the one that is stuck). Actions are at least
``MIN_GAP_S`` apart. Dynamic members need none of this: a new member always starts a rebalance.
Partitions added to the topic read as orphans until the next rebalance assigns them, which is
the same remedy.
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
PERSIST_MARGIN_S = 10.0
MIN_PERSIST_S = 20.0
MIN_GAP_S = 30.0
FRESH_S = 2 * CHECK_EVERY_S + CHECK_TIMEOUT_S


def persist_threshold(session_timeout_ms: int, revoke_bound_s: float = 0.0) -> float:
    """How long the same orphans must last before the first member rejoins: past the session
    timeout and past the longest a revoke callback may hold a partition between rounds."""
    return max(max(session_timeout_ms / 1e3, revoke_bound_s) + PERSIST_MARGIN_S, MIN_PERSIST_S)


def orphaned(partitions: int, topic: str,
             assignments: Iterable[Iterable[tuple[str, int]]]) -> set[int]:
    """The partitions ``0 .. partitions-1`` of ``topic`` in none of the members'
    ``assignments`` (each an iterable of (topic, partition))."""
    held = {p for member in assignments for t, p in member if t == topic}
    return set(range(partitions)) - held


class OrphanWatch:
    """Checks the group every CHECK_EVERY_S on a side thread; :meth:`due` tells the loop
    when to rejoin. The loop tells it this member's id (:meth:`note_member`)."""

    def __init__(self, settings: dict[str, Any], group: str, topic: str,
                 session_timeout_ms: int, revoke_bound_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings, self._group, self._topic = dict(settings), group, topic
        self.persist_s = persist_threshold(session_timeout_ms, revoke_bound_s)
        self._clock = clock
        self._lock = threading.Lock()  # the finding: written by the watch, read by the loop
        self._member: str | None = None
        self._seen: frozenset[int] = frozenset()
        self._since = 0.0
        self._checked = float("-inf")  # when the last check's outcome came
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
        """Not waited for: the thread holds only its admin client, and a check in progress
        ends within its timeouts."""
        self._stop.set()

    def note_member(self, member_id: str | None) -> None:
        """This member's id, read by the loop thread (the client's calls are not made from
        this watch: a consumer closing under a side thread's call is undefined)."""
        with self._lock:
            self._member = member_id or None

    def due(self, now: float) -> bool:
        """True once per finding while it is fresh (the last check at most
        ``FRESH_S`` ago): the loop should rejoin now."""
        with self._lock:
            if not self._due or now < self._not_before:
                return False
            if now - self._checked > FRESH_S:  # the watch fell behind: check again first
                self._due = False
                return False
            self._due = False
            self._since = now  # the same orphans must persist again before the next action
            self._not_before = now + MIN_GAP_S
            self.rejoins += 1
            return True

    def observe(self, orphans: set[int], members: Iterable[str], now: float) -> None:
        """One check's outcome: ``orphans`` (empty when the group was not Stable or held
        every partition) and the ids of the group's members."""
        with self._lock:
            found = frozenset(orphans)
            self._checked = now
            if found != self._seen:  # a new finding (or none): the clock starts again
                self._seen, self._since, self._due = found, now, False
            self.orphans = set(found)
            if not found:
                return
            lasted = now - self._since
            first = self._member is not None and min(members, default=None) == self._member
            if lasted >= self.persist_s and (first or lasted >= 2 * self.persist_s):
                self._due = True

    def forget(self) -> None:
        """What was seen so far proves nothing, the clock starts again: a check failed, or
        this member's rebalance callback ran (a rebalance is under way or just ended)."""
        with self._lock:
            self._seen, self._due = frozenset(), False

    def _run(self) -> None:
        admin: AdminClient | None = None
        while not self._stop.wait(CHECK_EVERY_S):
            try:
                admin = admin or AdminClient(dict(self._settings))
                orphans, members = self._check(admin)
                self.observe(orphans, members, self._clock())
                admin.poll(0)  # its log lines and error events, served
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one check
                # The first failure is a warning (e.g. no Describe ACL on the group), later
                # ones are not repeated at that level.
                self.forget()
                self.failures += 1
                (log.warning if self.failures == 1 else log.debug)(
                    "orphan_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    def _check(self, admin: AdminClient) -> tuple[set[int], list[str]]:
        group = admin.describe_consumer_groups([self._group])[self._group].result(
            timeout=CHECK_TIMEOUT_S)
        if group.state != ck.ConsumerGroupState.STABLE or not group.members:
            return set(), []
        meta = admin.list_topics(self._topic, timeout=CHECK_TIMEOUT_S).topics[self._topic]
        if meta.error is not None:
            return set(), []
        orphans = orphaned(len(meta.partitions), self._topic, (
            [(tp.topic, tp.partition) for tp in m.assignment.topic_partitions]
            for m in group.members))
        return orphans, [m.member_id for m in group.members]
