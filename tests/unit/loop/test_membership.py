"""A static member fenced by its group coordinator rejoins with a new client unless another
process holds its instance id (worker.loop.membership.StaticFencing), within a budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
import pytest

from worker.exceptions import KafkaIOError, StaticMemberFenced
from worker.kafka import is_static_fencing
from worker.loop.membership import (
    FENCING_WINDOW_S,
    MAX_FENCED_REJOINS,
    Membership,
    StaticFencing,
)
from worker.loop.rejoin import ClusterProbe, Rejoin

ME = "trt-worker-host-100"


@dataclass
class Member:
    group_instance_id: str | None
    client_id: str
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
    return StaticFencing({"bootstrap.servers": "127.0.0.1:9"}, "g", "w0", ME,
                         clock=clock or Clock(), describe=describe)


@pytest.mark.parametrize("group", [
    Group([]),  # the coordinator forgot the member
    Group([Member("w0", ME), Member("w1", "trt-worker-host-101")]),  # its own stale entry
    KafkaIOError("describe group 'g': timed out"),  # the coordinator does not answer yet
])
def test_no_other_process_holding_the_instance_id_lets_the_member_rejoin(group: Any) -> None:
    assert _fencing(group).refusal() is None


def test_another_client_holding_the_instance_id_stops_this_one() -> None:
    why = _fencing(Group([Member("w0", "trt-worker-host-200", "/10.0.0.9")])).refusal()
    assert why is not None and "trt-worker-host-200 at /10.0.0.9" in why


def test_rejoins_are_bounded_within_the_window() -> None:
    clock = Clock()
    fencing = _fencing(Group([]), clock)
    for _ in range(MAX_FENCED_REJOINS):
        assert fencing.refusal() is None
    why = fencing.refusal()
    assert why is not None and "another process may share" in why
    clock.now += FENCING_WINDOW_S + 1
    assert fencing.refusal() is None


class FakeConsumer:
    reopened = 0

    def reopen(self) -> None:
        self.reopened += 1


def _membership(fencing: StaticFencing | None) -> tuple[Membership, FakeConsumer]:
    consumer = FakeConsumer()
    rejoin = Rejoin(ClusterProbe({"bootstrap.servers": "127.0.0.1:9"}))
    return Membership(consumer, "jobs", rejoin, None, fencing), consumer  # type: ignore[arg-type]


def test_a_member_allowed_to_rejoin_loses_its_partitions_then_gets_a_new_client() -> None:
    membership, consumer = _membership(_fencing(Group([])))
    calls: list[str] = []
    membership.fenced(StaticMemberFenced("fenced"),
                      lambda: calls.append(f"lose_all reopened={consumer.reopened}"))
    assert calls == ["lose_all reopened=0"] and consumer.reopened == 1
    assert membership.totals()["fenced_rejoins"] == 1


def test_a_member_refused_a_rejoin_raises_with_the_reason_and_keeps_its_client() -> None:
    membership, consumer = _membership(_fencing(Group([Member("w0", "other-client")])))
    with pytest.raises(StaticMemberFenced, match="held by another client"):
        membership.fenced(StaticMemberFenced("fenced"), lambda: None)
    assert consumer.reopened == 0
    dynamic, _ = _membership(None)
    with pytest.raises(StaticMemberFenced, match="not a static member"):
        dynamic.fenced(StaticMemberFenced("fenced"), lambda: None)


def test_librdkafkas_static_fencing_reports_are_recognised() -> None:
    # The fatal error event: generic _FATAL code, the reason only in the text.
    event = ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by "
                          "other consumer with same group.instance.id")
    assert is_static_fencing(event)
    assert is_static_fencing(ck.KafkaError(ck.KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert not is_static_fencing(ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Broker: "
                                               "Producer attempted an operation with an old epoch"))
    assert not is_static_fencing(ck.KafkaError(ck.KafkaError._TRANSPORT, "broker down"))
