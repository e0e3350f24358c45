"""A static member fenced by its group coordinator drops its partitions, waits out the session
timeout out of the group, then rejoins unless another process holds its instance id
(worker.loop.group.membership.StaticFencing), within a budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
import pytest

from worker.exceptions import KafkaIOError, StaticMemberFenced
from worker.kafka import is_static_fencing
from worker.loop.group import membership as membership_module
from worker.loop.group.membership import (
    FENCING_WINDOW_S,
    MAX_FENCED_REJOINS,
    Membership,
    StaticFencing,
)
from worker.loop.group.rejoin import ClusterProbe, Rejoin
from worker.observe.vitals import Vitals


@dataclass
class Member:
    group_instance_id: str | None
    member_id: str = "m-1"
    client_id: str = "trt-worker-host-100"
    host: str = "/10.0.0.1"


@dataclass
class Group:
    members: list[Member]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fencing(answer: Any, clock: Clock | None = None) -> StaticFencing:
    def describe() -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer
    return StaticFencing({"bootstrap.servers": "127.0.0.1:9"}, "g", "w0", 6000,
                         clock=clock or Clock(), describe=describe)


@pytest.mark.parametrize("group", [
    Group([]),  # the stale entry left once its heartbeats timed out
    Group([Member("w1", client_id="trt-worker-host-101")]),
    KafkaIOError("describe group 'g': timed out"),  # the coordinator does not answer yet
])
def test_no_holder_of_the_instance_id_after_the_session_timeout_lets_it_rejoin(group: Any
                                                                               ) -> None:
    assert _fencing(group).holder() is None


def test_a_holder_still_there_after_the_session_timeout_is_another_process() -> None:
    # Kafka 4.1 listed the old member's client id for the newcomer: the holder's presence
    # once the heartbeat timeout has passed is the signal, not its client id.
    held = _fencing(Group([Member("w0", "m-9", "trt-worker-host-100", "/10.0.0.9")])).holder()
    assert held == "member m-9 (trt-worker-host-100 at /10.0.0.9)"


def test_rejoins_are_bounded_within_the_window() -> None:
    clock = Clock()
    fencing = _fencing(Group([]), clock)
    for _ in range(MAX_FENCED_REJOINS):
        assert fencing.over_budget() is None and fencing.holder() is None
    why = fencing.over_budget()
    assert why is not None and "another process may share" in why
    clock.now += FENCING_WINDOW_S + 1
    assert fencing.over_budget() is None
    assert fencing.wait_s == pytest.approx(6.0 + membership_module.CHECK_MARGIN_S)


class FakeConsumer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def reopen(self, *, join: bool = True) -> None:
        self.calls.append(f"reopen join={join}")

    def join(self) -> None:
        self.calls.append("join")


def _membership(fencing: StaticFencing | None) -> tuple[Membership, FakeConsumer]:
    consumer = FakeConsumer()
    rejoin = Rejoin(ClusterProbe({"bootstrap.servers": "127.0.0.1:9"}))
    return Membership(consumer, "jobs", rejoin, None, fencing), consumer  # type: ignore[arg-type]


def _fence(membership: Membership, consumer: FakeConsumer) -> None:
    membership.fenced(StaticMemberFenced("fenced"),
                      lambda: consumer.calls.append("lose_all"))


def test_a_fenced_member_leaves_the_group_then_rejoins_after_the_session_timeout(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(membership_module.time, "monotonic", clock)
    membership, consumer = _membership(_fencing(Group([]), clock))
    _fence(membership, consumer)
    _fence(membership, consumer)  # the dead client's report again: already handled
    assert consumer.calls == ["lose_all", "reopen join=False"]
    membership.step(clock.now + 1.0, Vitals())
    assert consumer.calls[-1] == "reopen join=False"  # still waiting out the timeout
    membership.step(clock.now + 8.5, Vitals())
    assert consumer.calls[-1] == "join" and membership.totals()["fenced_rejoins"] == 1


def test_a_fenced_member_whose_id_is_still_held_stops_with_the_holder_named(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(membership_module.time, "monotonic", clock)
    membership, consumer = _membership(_fencing(Group([Member("w0", "m-9")]), clock))
    _fence(membership, consumer)
    with pytest.raises(StaticMemberFenced, match="held by member m-9"):
        membership.step(clock.now + 8.5, Vitals())
    assert "join" not in consumer.calls


def test_a_dynamic_member_or_one_over_budget_stops_at_once() -> None:
    dynamic, consumer = _membership(None)
    with pytest.raises(StaticMemberFenced, match="not a static member"):
        _fence(dynamic, consumer)
    assert consumer.calls == []


def test_librdkafkas_static_fencing_reports_are_recognised() -> None:
    # The fatal error event: generic _FATAL code, the reason only in the text.
    event = ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by "
                          "other consumer with same group.instance.id")
    assert is_static_fencing(event)
    assert is_static_fencing(ck.KafkaError(ck.KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert not is_static_fencing(ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: "
                                               "Producer attempted an operation with an old epoch"))
    assert not is_static_fencing(ck.KafkaError(ck.KafkaError._TRANSPORT, "broker down"))
