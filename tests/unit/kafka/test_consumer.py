"""The consumer wrapper's own behaviour (worker/kafka/consumer.py); with a broker in
tests/integration."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import pytest

from worker.exceptions import KafkaIOError
from worker.kafka.consumer import Consumer


class FakeClient:
    def __init__(self, fail: str = "") -> None:
        self.fail, self.calls = fail, []  # type: ignore[var-annotated]

    def unsubscribe(self) -> None:
        self._call("unsubscribe")

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._call("subscribe")

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail == name:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._STATE))


def _consumer(client: FakeClient) -> Consumer:
    c = Consumer({})
    c._client = client  # type: ignore[assignment]
    c._subscription = (["jobs"], print, print, print)
    return c


def test_resubscribe_leaves_and_takes_the_same_subscription() -> None:
    client = FakeClient()
    _consumer(client).resubscribe()
    assert client.calls == ["unsubscribe", "subscribe"]


@pytest.mark.parametrize("step", ["unsubscribe", "subscribe"])
def test_resubscribe_failures_are_typed(step: str) -> None:
    with pytest.raises(KafkaIOError, match="resubscribe"):
        _consumer(FakeClient(fail=step)).resubscribe()


class QueueClient:
    """What librdkafka has fetched, as poll() and consume() see it."""

    def __init__(self, queued: list[str], fail: bool = False, fail_consume: bool = False
                 ) -> None:
        self.queued, self.fail, self.calls = list(queued), fail, []  # type: ignore[var-annotated]
        self.fail_consume = fail_consume

    def poll(self, timeout: float) -> str | None:
        self.calls.append(("poll", timeout))
        if self.fail:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TRANSPORT))
        return self.queued.pop(0) if self.queued else None

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.calls.append(("consume", num_messages, timeout))
        if self.fail_consume:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._STATE))
        taken, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return taken


def test_take_waits_for_the_first_record_only_then_takes_what_is_fetched() -> None:
    client = QueueClient(["a", "b", "c"])
    got = _consumer(client).take(1000, 0.05)  # type: ignore[arg-type]
    assert got == ["a", "b", "c"]
    # Only the poll may block; the rest is taken without waiting (consume(n, t) would block
    # until n records or t).
    assert client.calls == [("poll", 0.05), ("consume", 999, 0)]


def test_take_bounds_and_empty() -> None:
    client = QueueClient(["a", "b", "c"])
    assert _consumer(client).take(2, 0.05) == ["a", "b"]  # type: ignore[arg-type]
    assert _consumer(client).take(1, 0.05) == ["c"]  # type: ignore[arg-type]
    assert client.calls[-1] == ("poll", 0.05)
    assert _consumer(client).take(1000, 0.05) == []  # type: ignore[arg-type]


def test_take_failures_are_typed() -> None:
    with pytest.raises(KafkaIOError, match="consume failed"):
        _consumer(QueueClient([], fail=True)).take(10, 0.0)  # type: ignore[arg-type]


def test_take_keeps_the_polled_record_when_the_rest_fails_and_raises_next() -> None:
    # Dropping the polled record while later ones go on to be committed would lose it.
    client = QueueClient(["a", "b"], fail_consume=True)
    consumer = _consumer(client)  # type: ignore[arg-type]
    assert consumer.take(10, 0.05) == ["a"]
    with pytest.raises(KafkaIOError, match="consume failed") as raised:
        consumer.take(10, 0.05)
    assert isinstance(raised.value.__cause__, ck.KafkaException)
    assert client.calls == [("poll", 0.05), ("consume", 9, 0)], "raised before polling again"
