"""The one admin wrapper (worker/kafka/admin.py) over a stand-in AdminClient: the look-ups the
replay, the probe and the orphan watch make through it, with librdkafka's errors wrapped."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import confluent_kafka as ck
import pytest

from worker.exceptions import KafkaIOError, UnknownTopic
from worker.kafka.admin import Admin, Found


def _done(value: Any = None, error: BaseException | None = None) -> Future[Any]:
    f: Future[Any] = Future()
    if error is not None:
        f.set_exception(error)
    else:
        f.set_result(value)
    return f


class FakeClient:
    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.topics = {"jobs": SimpleNamespace(error=None, partitions={1: None, 0: None}),
                       "__consumer_offsets": SimpleNamespace(error=None, partitions={0: None})}

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.asked.append(("metadata", topic))
        return SimpleNamespace(topics=self.topics, brokers={1: None})

    def list_offsets(self, specs: dict[ck.TopicPartition, Any], isolation_level: Any,
                     request_timeout: float) -> dict[ck.TopicPartition, Future[Any]]:
        self.asked.append(("offsets", isolation_level))
        return {tp: _done(SimpleNamespace(offset=10 + tp.partition, timestamp=5))
                for tp in specs}

    def describe_consumer_groups(self, groups: list[str], request_timeout: float = -1
                                 ) -> dict[str, Future[Any]]:
        err = ck.KafkaException(ck.KafkaError(ck.KafkaError.GROUP_AUTHORIZATION_FAILED))
        return {g: _done(error=err) for g in groups}


def _admin() -> tuple[Admin, FakeClient]:
    admin = Admin({"bootstrap.servers": "127.0.0.1:9"}, timeout=1.0)
    fake = FakeClient()
    admin.client = fake  # type: ignore[assignment]
    return admin, fake


def test_an_unknown_topic_is_named_with_the_topics_there_are() -> None:
    admin, _ = _admin()
    assert admin.partitions("jobs") == [0, 1]
    with pytest.raises(UnknownTopic, match=r"'nope' does not exist \(topics: jobs\)"):
        admin.partitions("nope")


def test_offsets_by_time_are_read_committed_and_nothing_asked_for_no_partition() -> None:
    admin, fake = _admin()
    assert admin.offsets_for_time("jobs", [0, 1], 123) == {0: Found(10, 5), 1: Found(11, 5)}
    assert fake.asked == [("offsets", ck.IsolationLevel.READ_COMMITTED)]
    assert admin.offsets_for_time("jobs", [], 123) == {} and admin.watermarks("jobs", []) == {}
    assert len(fake.asked) == 1
    assert admin.watermarks("jobs", [1], committed_only=True) == {1: (11, 11)}


def test_a_group_description_refused_is_a_kafka_io_error_with_its_code() -> None:
    admin, _ = _admin()
    with pytest.raises(KafkaIOError) as info:
        admin.describe_group("g")
    assert info.value.code == ck.KafkaError.GROUP_AUTHORIZATION_FAILED


class Unreachable(FakeClient):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TRANSPORT))


def test_the_probe_answers_whether_brokers_are_listed() -> None:
    admin, _ = _admin()
    assert admin.answers()
    admin.client = Unreachable()  # type: ignore[assignment]
    assert not admin.answers()
