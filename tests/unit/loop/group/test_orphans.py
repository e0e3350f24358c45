"""The orphan watch's decisions (worker/loop/group/orphans.py); the real group is in
tests/integration/delivery/test_orphaned_partitions.py."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any

import confluent_kafka as ck
import pytest

from worker.loop.group import orphans
from worker.loop.group.orphans import (
    JITTER_FRACTION,
    MIN_GAP_S,
    POLLERS,
    SURVEY_EVERY_S,
    OrphanWatch,
    orphaned,
    persist_threshold,
)

SESSION_MS = 10_000
P = persist_threshold(SESSION_MS)


class _Draws(random.Random):
    """Every jitter draw at ``fraction`` of its range (0: none, 1: the most)."""

    def __init__(self, fraction: float) -> None:
        super().__init__(0)
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + self.fraction * (b - a)


def _watch(member: str | None = "m-1", rng: random.Random | None = None) -> OrphanWatch:
    # Without jitter unless asked: the decisions below are about the threshold.
    w = OrphanWatch({"bootstrap.servers": "unused:9"}, "g", "jobs", SESSION_MS,
                    rng=rng or _Draws(0.0))
    w.note_member(member)
    return w


def test_orphaned_is_what_no_member_holds_of_that_topic() -> None:
    members = [[("jobs", 3), ("jobs", 4), ("other", 0)], [("jobs", 5)], []]
    assert orphaned(6, "jobs", members) == {0, 1, 2}
    assert orphaned(3, "jobs", [[("jobs", 0), ("jobs", 1), ("jobs", 2)]]) == set()
    assert orphaned(2, "jobs", []) == {0, 1}


def test_the_threshold_outlasts_the_session_timeout() -> None:
    # A killed member that is not restarted keeps its partitions until its session times
    # out; the broker's rebalance then hands them out, no rejoin needed.
    assert persist_threshold(45_000) == 45 + orphans.PERSIST_MARGIN_S
    assert persist_threshold(1_000) == orphans.MIN_PERSIST_S


def test_the_threshold_outlasts_a_revoke_callback() -> None:
    # Between the rounds of a cooperative rebalance the revoking member's callback holds its
    # partitions for as long as it takes (batches in flight, flush, commit).
    assert persist_threshold(45_000, revoke_bound_s=100.0) == 100 + orphans.PERSIST_MARGIN_S
    assert persist_threshold(45_000, revoke_bound_s=5.0) == 45 + orphans.PERSIST_MARGIN_S


def test_a_rebalance_callback_clears_a_finding_and_restarts_the_clock() -> None:
    # This member's own long revoke: its partitions read as orphans until round two, which
    # hands them out; a finding set meanwhile must not fire after that.
    w = _watch()
    w.observe({0}, ["m-1"], 0.0)
    w.observe({0}, ["m-1"], P)
    w.forget()  # what the worker's rebalance callbacks call
    assert not w.due(P + 1)
    w.observe({0}, ["m-1"], P + 2)
    assert not w.due(P + 2), "the same orphans must persist again after a rebalance"
    w.observe({0}, ["m-1"], 2 * P + 2)
    assert w.due(2 * P + 2)


def test_a_stale_finding_is_not_acted_on() -> None:
    w = _watch()
    w.observe({0}, ["m-1"], 0.0)
    w.observe({0}, ["m-1"], P)
    assert not w.due(P + orphans.FRESH_S + 1), "no check since: the watch fell behind"
    assert w.rejoins == 0


def test_the_first_member_rejoins_once_the_same_orphans_outlast_the_threshold() -> None:
    w = _watch()
    w.observe({0}, ["m-1", "m-2"], 100.0)
    w.observe({0}, ["m-1", "m-2"], 100.0 + P - 1)
    assert not w.due(100.0 + P - 1), "a normal rebalance's gap is no reason to rejoin"
    w.observe({0}, ["m-1", "m-2"], 100.0 + P)
    assert w.due(100.0 + P) and w.rejoins == 1
    assert not w.due(100.0 + P), "once per finding"


def test_other_orphans_start_the_clock_again() -> None:
    w = _watch()
    w.observe({0}, ["m-1"], 0.0)
    w.observe({0, 1}, ["m-1"], P / 2)
    w.observe({1}, ["m-1"], P)
    assert not w.due(P)
    w.observe({1}, ["m-1"], 2 * P)
    assert w.due(2 * P)


def test_a_clean_check_clears_a_finding_not_yet_acted_on() -> None:
    w = _watch()
    w.observe({0}, ["m-1"], 0.0)
    w.observe({0}, ["m-1"], P)
    w.observe(set(), ["m-1"], P + 5)  # the broker's own rebalance handed them out
    assert not w.due(P + 5) and w.orphans == set()
    w.observe({0}, ["m-1"], P + 10)
    assert not w.due(P + 10), "a new finding must persist again"


def test_other_members_rejoin_only_when_the_orphans_last_twice_as_long() -> None:
    w = _watch("m-2")
    w.observe({2}, ["m-1", "m-2"], 0.0)
    w.observe({2}, ["m-1", "m-2"], 2 * P - 1)
    assert not w.due(2 * P - 1)
    w.observe({2}, ["m-1", "m-2"], 2 * P)
    assert w.due(2 * P)


def test_a_member_that_does_not_know_its_id_is_not_first() -> None:
    w = _watch(None)
    w.observe({2}, ["m-1"], 0.0)
    w.observe({2}, ["m-1"], P)
    assert not w.due(P)


def test_after_a_rejoin_the_orphans_must_persist_again_and_the_gap_holds() -> None:
    w = _watch()
    w.observe({1}, ["m-1"], 0.0)
    w.observe({1}, ["m-1"], P)
    assert w.due(P)
    w.observe({1}, ["m-1"], P + 1)  # the rejoin did not help (yet)
    assert not w.due(P + 1)
    later = P + max(P, MIN_GAP_S)
    w.observe({1}, ["m-1"], later)
    assert w.due(later) and w.rejoins == 2


def _group(state: Any, members: list[tuple[str, list[tuple[str, int]]]],
           instances: dict[str, str] | None = None) -> Any:
    return SimpleNamespace(state=state, members=[
        SimpleNamespace(member_id=mid, group_instance_id=(instances or {}).get(mid),
                        assignment=SimpleNamespace(topic_partitions=[
                            SimpleNamespace(topic=t, partition=p) for t, p in parts]))
        for mid, parts in members])


class FakeAdmin:
    """The two admin calls a check makes, answering with ``group`` and a topic of
    ``partitions`` partitions."""

    def __init__(self, group: Any, partitions: int = 4, error: Any = None) -> None:
        self.group, self.partitions, self.error = group, partitions, error

    def describe_group(self, group: str) -> Any:
        return self.group

    def metadata(self, topic: str) -> Any:
        meta = SimpleNamespace(partitions=dict.fromkeys(range(self.partitions)),
                               error=self.error)
        return SimpleNamespace(topics={topic: meta})

    def poll(self, timeout: float) -> None:
        """Nothing queued to serve in the stand-in."""


def _admin(group: Any, error: Any = None) -> Any:
    return FakeAdmin(group, error=error)


def test_check_reads_the_groups_assignments_of_this_topic_only() -> None:
    group = _group(ck.ConsumerGroupState.STABLE,
                   [("m-2", [("jobs", 0), ("other", 1)]), ("m-1", [("jobs", 3)])])
    found, members = _watch()._check(_admin(group))
    assert found == {1, 2} and sorted(members) == ["m-1", "m-2"]


@pytest.mark.parametrize("state", [ck.ConsumerGroupState.PREPARING_REBALANCING,
                                   ck.ConsumerGroupState.COMPLETING_REBALANCING,
                                   ck.ConsumerGroupState.EMPTY])
def test_check_finds_nothing_while_the_group_is_not_stable(state: Any) -> None:
    group = _group(state, [("m-1", [])])
    assert _watch()._check(_admin(group)) == (set(), [])


def test_check_finds_nothing_when_the_topic_does_not_answer() -> None:
    group = _group(ck.ConsumerGroupState.STABLE, [("m-1", [])])
    error = ck.KafkaError(ck.KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert _watch()._check(_admin(group, error=error)) == (set(), [])


@pytest.mark.parametrize("exc", [ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT)),
                                 ValueError("unexpected answer")])
def test_a_failing_check_resets_the_clock_and_the_watch_goes_on(
        monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    monkeypatch.setattr(orphans, "CHECK_EVERY_S", 0.01)
    monkeypatch.setattr(orphans, "Admin", lambda settings, timeout: object())
    w = _watch()
    w.observe({0}, ["m-1"], 0.0)

    def fail(admin: object) -> tuple[set[int], list[str]]:
        raise exc

    monkeypatch.setattr(w, "_check", fail)
    w.start()
    deadline = time.monotonic() + 5
    while w.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert w.failures >= 3
    w.observe({0}, ["m-1"], P)
    assert not w.due(P), "the check before the failures no longer counts"


# -- jitter: members that see the same orphans do not all rejoin at once --------------------

def test_the_jitter_is_drawn_per_member_within_its_bound() -> None:
    bound = JITTER_FRACTION * P
    draws = []
    for seed in range(50):  # fifty members, each its own random source
        w = _watch(rng=random.Random(seed))
        w.observe({0}, ["m-1"], 0.0)
        draws.append(w.jitter_s)
    assert all(0.0 <= d <= bound for d in draws), (min(draws), max(draws), bound)
    assert max(draws) - min(draws) > bound / 2, "the members' delays spread over the range"


@pytest.mark.parametrize(("member", "tier"), [("m-1", 1), ("m-2", 2)])
def test_a_member_acts_only_after_the_threshold_plus_its_own_jitter(member: str,
                                                                    tier: int) -> None:
    w = _watch(member, rng=_Draws(1.0))  # the longest delay there is
    members = ["m-1", "m-2"]  # m-1 acts after the threshold, m-2 after twice that
    w.observe({0}, members, 0.0)
    acts = tier * P + JITTER_FRACTION * P
    w.observe({0}, members, acts - 0.5)
    assert not w.due(acts - 0.5)
    w.observe({0}, members, acts)
    assert w.due(acts)


def test_members_that_see_the_same_orphans_rejoin_in_different_check_intervals() -> None:
    # Twenty members none of which is first (they act at twice the threshold), checking
    # every CHECK_EVERY_S: without jitter all would rejoin in the same interval.
    # With the defaults' threshold (45 s session, 80 s revoke bound: 90 s).
    members = ["first", *(f"m-{i:02d}" for i in range(20))]
    acted_at: list[float] = []
    for i in range(20):
        w = OrphanWatch({}, "g", "jobs", 45_000, 80.0, rng=random.Random(i))
        assert w.persist_s == 90.0
        w.note_member(f"m-{i:02d}")
        t = 0.0
        while True:
            w.observe({3}, members, t)
            if w.due(t):
                acted_at.append(t)
                break
            t += orphans.CHECK_EVERY_S
    assert min(acted_at) >= 2 * 90.0
    assert max(acted_at) <= 2 * 90.0 + JITTER_FRACTION * 90.0 + orphans.CHECK_EVERY_S
    assert len(set(acted_at)) >= 3, acted_at


# -- who polls: a few members, not every one ------------------------------------------------

IDS = [f"w{i}" for i in range(6)]
# Member ids sort the other way round from instance ids: the ranking must use the latter.
MEMBER_IDS = {i: f"{chr(ord('z') - n)}-{i}-member" for n, i in enumerate(IDS)}


def _six_members() -> Any:
    return _group(ck.ConsumerGroupState.STABLE,
                  [(MEMBER_IDS[i], [("jobs", n)]) for n, i in enumerate(IDS)],
                  instances={m: i for i, m in MEMBER_IDS.items()})


def test_only_the_first_members_by_instance_id_keep_polling() -> None:
    watches = {i: _watch(MEMBER_IDS[i]) for i in IDS}
    for w in watches.values():
        found, members = w._check(FakeAdmin(_six_members(), partitions=6))
        assert found == set() and sorted(members) == IDS
        w.observe(found, members, 0.0)
    polling = [i for i, w in watches.items() if w.polls(orphans.CHECK_EVERY_S)]
    assert polling == IDS[:POLLERS]
    assert [w.rank for w in watches.values()] == list(range(6))
    # The others look again at their survey.
    assert all(w.polls(SURVEY_EVERY_S) for w in watches.values())


def test_a_member_polls_until_it_knows_where_it_stands_and_after_its_rebalances() -> None:
    w = _watch(MEMBER_IDS["w4"])
    assert w.polls(0.0), "not known yet"
    w.observe(set(), [], 1.0)  # the group was not Stable: no member list
    assert w.polls(2.0)
    w._check(FakeAdmin(_six_members(), partitions=6))
    w.observe(set(), IDS, 3.0)
    assert not w.polls(4.0)
    w.forget()  # its rebalance callback: members may have come or gone
    assert w.polls(4.0)


def test_a_member_restarted_under_its_instance_id_keeps_its_place() -> None:
    # The orphaning case: the static member comes back with a new member id and no
    # rebalance. Ranked by instance id, neither it nor the others see the order change.
    w = _watch(MEMBER_IDS["w0"])
    w.observe(set(), w._check(FakeAdmin(_six_members(), partitions=6))[1], 0.0)
    assert w.rank == 0
    restarted = {**MEMBER_IDS, "w0": "a-w0-new-member"}
    group = _group(ck.ConsumerGroupState.STABLE,
                   [(restarted[i], [("jobs", n)]) for n, i in enumerate(IDS)],
                   instances={m: i for i, m in restarted.items()})
    w.note_member("a-w0-new-member")
    found, members = w._check(FakeAdmin(group, partitions=6))
    w.observe(found, members, 1.0)
    assert w.rank == 0 and sorted(members) == IDS


def test_the_watch_thread_checks_only_while_this_member_polls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orphans, "CHECK_EVERY_S", 0.01)
    monkeypatch.setattr(orphans, "Admin",
                        lambda settings, timeout: FakeAdmin(_six_members(), partitions=6))
    first, fourth = _watch(MEMBER_IDS["w0"]), _watch(MEMBER_IDS["w3"])
    for w in (first, fourth):
        w.start()
    try:
        deadline = time.monotonic() + 5
        while first.checks < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        for w in (first, fourth):
            w.stop()
    assert first.checks >= 20
    assert fourth.checks == 1, "after one check it knows it is not among the pollers"
    assert first.failures == fourth.failures == 0
