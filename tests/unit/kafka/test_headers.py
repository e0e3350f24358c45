"""worker.kafka.headers.read_headers: a record whose headers cannot be read (a key that is not
UTF-8) becomes a rejection for the DLQ, never an exception on the loop thread. The real client
and broker: tests/integration/bad_input/test_bad_header_key.py."""

from __future__ import annotations

import json

import confluent_kafka as ck
import pytest

from worker.exceptions import UnreadableHeaders
from worker.kafka import source_record
from worker.kafka.headers import read_headers
from worker.tasks.protocol import Answer, ConsumedBatch, admit_each
from worker.wire.dlq import HEADER_PREFIX, dead_letter
from worker.wire.records import SourceRecord

BAD_KEY = UnicodeDecodeError("utf-8", b"\xff\xfe", 0, 1, "invalid start byte")


class BadHeadersMessage:
    """What confluent-kafka 2.x does with a header key that is not UTF-8: the first
    ``headers()`` raises a SystemError caused by the UnicodeDecodeError, later calls return the
    half-built list it cached (a NULL key in the C client; None here)."""

    def __init__(self, key: bytes = b"job-1", value: bytes = b"\x81\xa1v\x01") -> None:
        self._key, self._value, self.calls = key, value, 0

    def headers(self) -> object:
        self.calls += 1
        if self.calls == 1:
            raise SystemError("<method 'headers' of 'confluent_kafka.cimpl.Message' objects> "
                              "returned a result with an exception set") from BAD_KEY
        return [(None, b"v")]

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return ck.TIMESTAMP_CREATE_TIME, 1_796_000_000_000


class Returns:
    def __init__(self, headers: object) -> None:
        self._headers = headers

    def headers(self) -> object:
        return self._headers


class Raises:
    def __init__(self, exc: BaseException) -> None:
        self._exc = exc

    def headers(self) -> object:
        raise self._exc


def test_unreadable_headers_are_reported_with_their_cause_on_one_line() -> None:
    msg = BadHeadersMessage()
    headers, why = read_headers(msg)
    assert headers is None
    assert why is not None and "\n" not in why
    assert "UnicodeDecodeError" in why and "0xff" in why
    assert msg.calls == 1, "a second headers() call returns the client's half-built list"


def test_a_plain_unicode_error_is_unreadable_too() -> None:
    headers, why = read_headers(Raises(BAD_KEY))
    assert headers is None and why is not None and "invalid start byte" in why


@pytest.mark.parametrize(("given", "expected"), [
    (None, None),
    ([("a", b"1"), ("a", None), ("b", b"2")], [("a", b"1"), ("a", None), ("b", b"2")]),
    ({"a": b"1", "b": None}, [("a", b"1"), ("b", None)]),
])
def test_readable_headers_come_back_as_a_list(given: object, expected: object) -> None:
    assert read_headers(Returns(given)) == (expected, None)


def test_other_errors_are_not_taken_for_bad_headers() -> None:
    with pytest.raises(MemoryError):
        read_headers(Raises(MemoryError()))


def test_a_record_with_unreadable_headers_is_dead_lettered_by_reference() -> None:
    """The loop's path: the consumed message, the tasks' shared checks, the DLQ record."""
    msg = BadHeadersMessage()
    record = source_record(msg, "jobs", 2, 41)  # type: ignore[arg-type]
    assert record.headers is None and record.headers_error is not None
    good = SourceRecord("jobs", 2, 42, b"job-2", b"\x81\xa1v\x01", [("a", b"1")], None)
    admitted: list[int] = []
    answers = admit_each(ConsumedBatch([record, good], {("jobs", 2): 7}, 0.0), 1 << 20,
                         lambda rec, value, epoch: admitted.append(rec.offset))
    assert admitted == [42], "the good neighbour is admitted"
    [answer] = answers
    assert isinstance(answer, Answer) and answer.record is record and answer.epoch == 7
    assert isinstance(answer.rejection, UnreadableHeaders)
    assert answer.rejection.reason == "bad_headers"

    dl = dead_letter(record, answer.rejection, "w-1", inline_max_bytes=1 << 20)
    ours = {k.removeprefix(HEADER_PREFIX): (v or b"").decode() for k, v in dl.headers
            if k.startswith(HEADER_PREFIX)}
    assert ours["error.reason"] == "bad_headers"
    assert ours["error.class"] == "UnreadableHeaders"
    assert "UnicodeDecodeError" in ours["error.message"]
    assert ours["value"] == "reference"
    assert ours["source.offset"] == "41"
    assert all(k.startswith((HEADER_PREFIX, "__connect.errors.")) for k, _ in dl.headers)
    ref = json.loads(dl.value or b"")
    assert (ref["topic"], ref["partition"], ref["offset"]) == ("jobs", 2, 41)
    assert ref["headers"] is None, "their number is unknown"
    assert dl.key == b"job-1"
    assert msg.calls == 1
