"""worker.wire.dlq: a record whose headers could not be read is never copied (a copy without
them would not be the original): it goes by reference whatever the rejection and the size."""

from __future__ import annotations

import json

import pytest

from worker.exceptions import JobRejected, SchemaViolation, UnreadableHeaders
from worker.wire.dlq import HEADER_PREFIX, dead_letter, dead_letter_by_reference
from worker.wire.records import SourceRecord


def _record(headers_error: str | None) -> SourceRecord:
    return SourceRecord("jobs", 0, 7, b"job-7", b"\x81\xa1v\x02", None, None, headers_error)


@pytest.mark.parametrize("error", [UnreadableHeaders("record headers unreadable: x"),
                                   SchemaViolation("also bad")])
@pytest.mark.parametrize("inline_max_bytes", [None, 1 << 20])
def test_unreadable_headers_go_by_reference(error: JobRejected,
                                            inline_max_bytes: int | None) -> None:
    dl = dead_letter(_record("record headers unreadable: x"), error, "w",
                     inline_max_bytes=inline_max_bytes)
    headers = dict(dl.headers)
    assert headers[HEADER_PREFIX + "value"] == b"reference"
    assert headers[HEADER_PREFIX + "error.reason"] == error.reason.encode()
    assert headers[HEADER_PREFIX + "source.v"] == b"2", "the version still comes from the value"
    ref = json.loads(dl.value or b"")
    assert ref["headers"] is None and ref["offset"] == 7


def test_a_record_without_headers_is_still_copied_and_counted() -> None:
    rec = _record(None)
    assert dead_letter(rec, SchemaViolation("x"), "w").value == rec.value
    assert json.loads(dead_letter_by_reference(rec, SchemaViolation("x"), "w").value
                      or b"")["headers"] == 0
