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
