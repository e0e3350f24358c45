"""At-least-once delivery reports, aggregated per emit(): a batch's offsets finish once every
record of it reported, and a failed record keeps exactly its own offset open."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck

from worker.config import load_config
from worker.exceptions import KafkaIOError
from worker.loop.commit.at_least_once import MAX_TOPICS_NAMED, AtLeastOnce
from worker.loop.output import Output
from worker.wire.records import SourceRef


class _Msg:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._t, self._k, self._v = topic, key, value

    def topic(self) -> str:
        return self._t

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v


class _Client:
    """librdkafka's producer as the committer uses it: records queue until report() serves
    their delivery reports (failing the keys named in ``fail``); keys in ``refuse`` are
    refused at produce()."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, bytes | None, bytes | None, Any]] = []
        self.refuse: set[bytes] = set()

    def produce(self, topic: str, *, value: bytes | None, key: bytes | None,
                headers: Any = None, on_delivery: Any = None) -> None:
        if key in self.refuse:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._INVALID_ARG))
        self.queued.append((topic, key, value, on_delivery))

    def report(self, n: int | None = None, fail: frozenset[bytes] = frozenset()) -> None:
        n = len(self.queued) if n is None else n
        served, self.queued = self.queued[:n], self.queued[n:]
        for topic, key, value, cb in served:
            err = ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT) if key in fail else None
            cb(err, _Msg(topic, key, value))


class _Producer:
    def __init__(self) -> None:
        self.client = _Client()

    def produce(self, topic: str, *, key: bytes | None, value: bytes | None,
                headers: Any = None, on_delivery: Any = None) -> None:
        try:
            self.client.produce(topic, value=value, key=key, headers=headers,
                                on_delivery=on_delivery)
        except ck.KafkaException as exc:
            raise KafkaIOError("produce failed", code=exc.args[0].code()) from exc

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.client.report()
        return 0


def _committer() -> tuple[AtLeastOnce, _Client]:
    cfg = load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9"})
    committer = AtLeastOnce(cfg, consumer=None)  # type: ignore[arg-type]
    fake = _Producer()
    committer._producer = fake  # type: ignore[assignment]
    for offset in range(10, 14):
        committer.begin("jobs", 0, offset)
    return committer, fake.client


def _out(offset: int, key: bytes, value: bytes = b"r") -> Output:
    return Output(SourceRef("jobs", 0, offset), "results", key, value, None, "result")


def test_a_batch_finishes_its_offsets_once_its_last_record_reported() -> None:
    committer, client = _committer()
    committer.emit([_out(10, b"a"), _out(11, b"b")])
    committer.emit([_out(12, b"c"), _out(13, b"d")])
    client.report(3)  # the first batch whole, one record of the second
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 12}
    assert committer.pending() == 2
    client.report()
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 14}
    assert committer.pending() == 0 and committer._in_flight == 0
    assert committer.unacked_for_s() is None


def test_a_failed_record_keeps_its_own_offset_open_and_is_sent_again() -> None:
    committer, client = _committer()
    committer.emit([_out(10, b"a"), _out(11, b"b"), _out(12, b"c")])
    client.report(fail=frozenset({b"b"}))
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 11}
    assert [r[2].ref.offset for r in committer._retries] == [11]
    assert committer._in_flight == 1  # the retry still waits for the broker
    assert committer.fatal is None


def test_a_failed_report_matching_several_outputs_sends_them_all_again() -> None:
    """Two dead letters of identical jobs: same topic, key and value, different headers (each
    names its source offset), and a report carries no headers: both count as failed."""
    committer, client = _committer()
    first, second = _out(10, b"same"), _out(11, b"same")
    first.headers, second.headers = [("src", b"10")], [("src", b"11")]
    committer.emit([first, second])
    (t1, k1, v1, cb1), (t2, k2, v2, cb2) = client.queued
    client.queued = []
    cb1(None, _Msg(t1, k1, v1))
    cb2(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT), _Msg(t2, k2, v2))
    committer._settle()
    assert committer._tracker.is_open(("jobs", 0), 10)
    assert committer._tracker.is_open(("jobs", 0), 11)
    assert sorted(r[2].ref.offset for r in committer._retries) == [10, 11]
    assert committer._in_flight == 2


def test_a_failed_report_that_matches_no_output_stops_without_finishing_its_batch() -> None:
    committer, client = _committer()
    committer.emit([_out(10, b"a")])
    (_topic, _key, _value, cb), = client.queued
    client.queued = []
    cb(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT), _Msg("results", b"other", b"r"))
    committer._settle()
    assert committer.fatal is not None and "match no output" in str(committer.fatal)
    assert committer._tracker.is_open(("jobs", 0), 10)


def test_records_never_produced_do_not_hold_their_batch_open() -> None:
    committer, client = _committer()
    client.refuse = {b"c"}
    committer.emit([_out(10, b"a"), _out(11, b"b"), _out(12, b"c"), _out(13, b"d")])
    client.report()
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 12}  # a and b delivered
    # c and the record after it wait for their retry, their offsets open.
    assert sorted(r[2].ref.offset for r in committer._retries) == [12, 13]
    assert committer._in_flight == 2


def test_a_stand_in_refused_too_leaves_the_records_before_it_to_settle() -> None:
    committer, client = _committer()
    client.refuse = {b"big", b"small"}
    committer._smaller = lambda out, code, why: _out(out.ref.offset, b"small")  # type: ignore
    committer.emit([_out(10, b"a"), _out(11, b"big"), _out(12, b"c")])
    client.report()
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 11}
    assert committer._in_flight == 2 and len(committer._retries) == 2


def test_a_record_refused_at_produce_is_retried_not_raised_and_readiness_says_why() -> None:
    """A results topic deleted, or WRITE revoked: librdkafka refuses the record in produce()
    itself. That raised out of the loop (an exit, then a restart into the same refusal); now
    the record waits for a retry with its offset open, readiness names the topic, and once
    the topic takes records again everything is answered and committed."""
    committer, client = _committer()
    client.refuse = {b"a", b"b"}
    committer.emit([_out(10, b"a"), _out(11, b"b")])
    assert committer._tracker.committable() == {("jobs", 0): 10}  # nothing past the refused
    reason = committer.blocked()
    assert reason is not None and "results" in reason
    client.refuse = set()  # the topic is back
    committer._retries = [(0.0, seq, out) for _due, seq, out in committer._retries]
    committer._retry_due()
    client.report()
    committer._settle()
    assert committer._tracker.committable() == {("jobs", 0): 12}
    assert committer.blocked() is None and committer._in_flight == 0


def test_readiness_keeps_naming_the_topic_while_its_retry_is_in_flight_again() -> None:
    """A due retry goes back in flight, where a topic still gone holds it until it fails
    again; readiness named the topic only while a retry waited in the heap, so a long outage
    showed on /readyz as an unnamed unacknowledged record most of the time."""
    committer, client = _committer()
    committer.emit([_out(10, b"a")])
    client.report(fail=frozenset({b"a"}))
    committer._settle()
    assert "output topic results" in (committer.blocked() or "")
    committer._retries = [(0.0, seq, out) for _due, seq, out in committer._retries]
    committer._retry_due()  # sent again: in flight, not in the heap
    assert not committer._retries and committer._in_flight == 1
    assert "output topic results" in (committer.blocked() or "")
    client.report()  # the topic is back
    committer._settle()
    assert committer.blocked() is None


def test_readiness_forgets_a_topic_whose_retries_went_to_another_member() -> None:
    committer, client = _committer()
    committer.emit([_out(10, b"a")])
    client.report(fail=frozenset({b"a"}))
    committer._settle()
    committer.emit([_out(11, b"b")])  # another result in flight, to a working topic
    committer.forget({("jobs", 0)})  # revoked: the retry is the new owner's now
    assert committer._in_flight == 1
    assert committer.blocked() is None


def test_readiness_names_every_failing_output_topic_bounded() -> None:
    """A results topic and a DLQ topic gone at once: readiness named only the first, so the
    second showed only once the first was fixed."""
    committer, client = _committer()
    topics = ["results", "dlq", "results-b", "results-c", "results-d"]
    committer.emit([Output(SourceRef("jobs", 0, 10), topic, topic.encode(), b"r", None,
                           "result") for topic in topics[:2]])
    client.report(fail=frozenset({b"results", b"dlq"}))
    committer._settle()
    reason = committer.blocked() or ""
    assert reason.startswith("output topic results refuses records, retrying: ")
    assert "; output topic dlq refuses records, retrying: " in reason
    committer.emit([Output(SourceRef("jobs", 0, 11), topic, topic.encode(), b"r", None,
                           "result") for topic in topics[2:]])
    client.report(fail=frozenset(t.encode() for t in topics[2:]))
    committer._settle()
    reason = committer.blocked() or ""
    assert reason.count("output topic ") == MAX_TOPICS_NAMED
    assert reason.endswith(f"; and {len(topics) - MAX_TOPICS_NAMED} more output topics")
