"""Partitions of the jobs topic that no member of the group holds: found, and handed out again.

With static membership and the cooperative protocol, a member killed between the two rounds
of an incremental rebalance (it gave a partition up in the first round; the second round would
hand it to another member) leaves that partition to nobody. Its restarted self rejoins under
the same instance id, and the broker gives it back its stored assignment without a rebalance
(KIP-345), so the second round never comes. Against Apache Kafka 4.1.1 with librdkafka 2.16 a
member SIGKILLed inside its revoke callback left its three revoked partitions unassigned for
the 400 s we watched, whatever ``max.poll.interval.ms``; the kill -9 fault test once saw a
partition sit for five minutes until an unrelated rebalance.

So static members check the group off the loop thread (each its own admin client: the group's
members and their assignments, the topic's partition count; it never touches the consumer).
When the group is Stable and the same partitions have been in no member's assignment for
longer than :func:`persist_threshold` (the longer of the session timeout and a revoke
callback's bound, plus a margin: 90 s with the defaults, 45 s session and an 80 s revoke
bound), the loop rejoins (unsubscribe, subscribe: :meth:`worker.kafka.Consumer.resubscribe`):
that runs a rebalance, and the cooperative assignor hands the orphans out.

Why that long: orphans that pass on their own must not cause rejoins. Between the rounds of a
normal cooperative rebalance a partition is nobody's while the revoking member runs its revoke
callback, and the group can read Stable meanwhile. The broker sets that gap no limit short of
``max.poll.interval.ms``; the worker's callback finishes the batches in flight (each within
``processing.max_batch_ms``, logged, not enforced) and flushes and commits (each within
``commit.drain_timeout_s``), so the worker passes that bound in. A member killed and not
restarted keeps its partitions "assigned" until its session times out, and then the broker's
own rebalance hands them out. Only what outlasts both is stuck. Any rebalance callback of this
member restarts the clock, and a finding is acted on only while it is fresh.

Who checks: a DescribeGroups answer lists every member, so one per member every few seconds is
quadratic in members. Only the ``POLLERS`` members whose instance ids sort first in the group
check every ``CHECK_EVERY_S``; the others check once to learn the member list (at start, after
each of their own rebalance callbacks, until they see the group Stable) and then every
``SURVEY_EVERY_S``. It still catches an orphan: orphans are the group's, the same in every
member's answer, and one member's rejoin has the assignor hand them all out, so one member that
looks suffices. Every member ranks the same list the same way, with no coordination, and by
instance id, not member id: the orphaning case is a static member restarted under its instance
id with a new member id and no rebalance, which leaves everyone's ranking valid. A member that
joins or leaves (its session ending) brings a rebalance, after which members learn the list
again; the survey bounds how long a view missed by a member can stay wrong.

Who acts: the first in that order once the orphans outlast the threshold; the others (the
second poller, and any member whose survey sees them) when they last twice as long, since the
first may be the one that is stuck. Each member adds its own random delay, up to
``JITTER_FRACTION`` of the threshold and drawn anew for each finding, so members that see the
same orphans do not rejoin in the same check interval. Actions are at least ``MIN_GAP_S`` apart.
Dynamic members need none of this: a new member always starts a rebalance. Partitions added to
the topic read as orphans until the next rebalance assigns them, which is the same remedy.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import confluent_kafka as ck
import structlog

from worker.kafka.admin import Admin
from worker.kafka.clients import ClientSettings

log = structlog.get_logger("worker")

CHECK_EVERY_S = 5.0
CHECK_TIMEOUT_S = 5.0
PERSIST_MARGIN_S = 10.0
MIN_PERSIST_S = 20.0
MIN_GAP_S = 30.0
FRESH_S = 2 * CHECK_EVERY_S + CHECK_TIMEOUT_S
# Members that check every CHECK_EVERY_S: the first acts, the second stands in for it.
POLLERS = 2
# How often every other member checks the group (learning who polls, and a late backstop).
SURVEY_EVERY_S = 60.0
# A member's delay before acting is the threshold plus up to this fraction of it, at random.
JITTER_FRACTION = 0.25


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


def rank(me: str | None, members: Iterable[str]) -> int | None:
    """Where ``me`` stands among ``members`` (instance ids) in the order every member sees
    alike; None when it is not among them."""
    order = sorted(set(members))
    return order.index(me) if me is not None and me in order else None


class OrphanWatch:
    """Checks the group on a side thread (every CHECK_EVERY_S while this member is among the
    first POLLERS, or does not know yet; every SURVEY_EVERY_S otherwise); :meth:`due` tells the
    loop when to rejoin. The loop tells it this member's id (:meth:`note_member`)."""

    def __init__(self, settings: Mapping[str, Any], group: str, topic: str,
                 session_timeout_ms: int, revoke_bound_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, *,
                 rng: random.Random | None = None) -> None:
        # (a copy whose repr masks the secrets)
        self._settings, self._group, self._topic = ClientSettings(settings), group, topic
        self.persist_s = persist_threshold(session_timeout_ms, revoke_bound_s)
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()  # the finding: written by the watch, read by the loop
        self._member: str | None = None
        self._instance: str | None = None  # this member's instance id, once a check saw it
        self.rank: int | None = None  # in the last Stable member list; None: not known
        self._seen: frozenset[int] = frozenset()
        self._since = 0.0
        self.jitter_s = 0.0  # this member's extra delay for the current finding
        self._checked = float("-inf")  # when the last check's outcome came
        self._attempted = float("-inf")  # when the last check began
        self._due = False
        self._not_before = 0.0
        self.orphans: set[int] = set()
        self.rejoins = 0
        self.failures = 0
        self.checks = 0
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

    def polls(self, now: float) -> bool:
        """Whether to check the group now: always while among the first POLLERS or while not
        knowing where this member stands, else once every SURVEY_EVERY_S."""
        with self._lock:
            return (self.rank is None or self.rank < POLLERS
                    or now - self._attempted >= SURVEY_EVERY_S)

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
            self._restart(now)  # the same orphans must persist again before the next action
            self._not_before = now + MIN_GAP_S
            self.rejoins += 1
            return True

    def observe(self, orphans: set[int], members: Iterable[str], now: float) -> None:
        """One check's outcome: ``orphans`` (empty when the group was not Stable or held
        every partition) and the group's members, by instance id (member id for a member
        without one); none when the group was not Stable."""
        with self._lock:
            found = frozenset(orphans)
            self._checked = now
            self._attempted = max(self._attempted, now)
            self.rank = rank(self._instance or self._member, members)
            if found != self._seen:  # a new finding (or none): the clock starts again
                self._seen, self._due = found, False
                self._restart(now)
            self.orphans = set(found)
            if not found:
                return
            lasted = now - self._since
            wait = (self.persist_s if self.rank == 0 else 2 * self.persist_s) + self.jitter_s
            if lasted >= wait:
                self._due = True

    def forget(self) -> None:
        """What was seen so far proves nothing, the clock starts again, and who polls is
        learnt again: this member's rebalance callback ran (a rebalance is under way or just
        ended, members may have come or gone)."""
        with self._lock:
            self._seen, self._due, self.rank = frozenset(), False, None

    def _restart(self, now: float) -> None:
        self._since = now
        self.jitter_s = self._rng.uniform(0.0, JITTER_FRACTION * self.persist_s)

    def _run(self) -> None:
        admin: Admin | None = None
        while not self._stop.wait(CHECK_EVERY_S):
            now = self._clock()
            if not self.polls(now):
                continue
            with self._lock:
                self._attempted = now
            try:
                admin = admin or Admin(self._settings, timeout=CHECK_TIMEOUT_S)
                self.checks += 1
                orphans, members = self._check(admin)
                self.observe(orphans, members, self._clock())
                admin.poll(0)  # its log lines and error events, served
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one check
                # The first failure is a warning (e.g. no Describe ACL on the group), later
                # ones are not repeated at that level. What was seen proves nothing now; where
                # this member stands is kept (a member not polling tries again at its survey).
                with self._lock:
                    self._seen, self._due = frozenset(), False
                self.failures += 1
                (log.warning if self.failures == 1 else log.debug)(
                    "orphan_check_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    def _check(self, admin: Admin) -> tuple[set[int], list[str]]:
        group = admin.describe_group(self._group)
        if group.state != ck.ConsumerGroupState.STABLE or not group.members:
            return set(), []
        meta = admin.metadata(self._topic).topics[self._topic]
        if meta.error is not None:
            return set(), []
        orphans = orphaned(len(meta.partitions), self._topic, (
            [(tp.topic, tp.partition) for tp in m.assignment.topic_partitions]
            for m in group.members))
        with self._lock:  # this member's instance id, as the others rank it
            mine = [m.group_instance_id for m in group.members
                    if self._member is not None and m.member_id == self._member]
            self._instance = next(iter(mine), None) or self._instance
        return orphans, [m.group_instance_id or m.member_id for m in group.members]
