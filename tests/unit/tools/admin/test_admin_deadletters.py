"""Reading dead letters for a redrive, against records built by the worker's own DLQ code
(worker.wire.dlq): reason, by-reference coordinates, header stripping, filters, times."""

from __future__ import annotations

import hashlib
import json

import pytest

from worker.exceptions import ImageRejected, SchemaViolation
from worker.tools.admin.deadletters import (
    REDRIVEN_FROM,
    Filter,
    Reference,
    check_fetched,
    inspect,
    parse_time,
    redriven_headers,
)
from worker.tools.admin.errors import BadOption
from worker.wire.dlq import dead_letter, dead_letter_by_reference
from worker.wire.records import SourceRecord

JOB_HEADERS = [("trace", b"t-1"), ("ktw.dlq.error.reason", b"forged"), ("tenant", b"acme"),
               (REDRIVEN_FROM, b"old-dlq/0/3")]
SRC = SourceRecord("jobs", 2, 41, b"job-1", b"\x81\xa1v\x01" * 10, JOB_HEADERS, 1_700_000_000_000)


def test_inline_dead_letter_gives_the_reason_and_the_original_headers_back() -> None:
    dl = dead_letter(SRC, SchemaViolation("bad"), "w-1")
    got = inspect(dl.headers, dl.value)
    assert got.reason == "schema" and got.reference is None and got.bad_reference is None
    out = redriven_headers(dl.headers, "dlq", 1, 7)
    # The job's own headers in order; the forged ktw.dlq.* one was already dropped by the
    # worker, every ktw.dlq.* header the worker added is dropped here, the old mark replaced.
    assert out == [("trace", b"t-1"), ("tenant", b"acme"), (REDRIVEN_FROM, b"dlq/1/7")]


def test_by_reference_dead_letter_names_its_source() -> None:
    dl = dead_letter_by_reference(SRC, ImageRejected("too big"), "w-1")
    got = inspect(dl.headers, dl.value)
    assert got.reason == "bad_image" and got.bad_reference is None
    assert got.reference == Reference("jobs", 2, 41, len(SRC.value or b""),
                                      hashlib.sha256(SRC.value or b"").hexdigest())
    assert str(got.reference) == "jobs/2/41"
    assert check_fetched(got.reference, SRC.value) is None
    assert "holds 3 bytes" in (check_fetched(got.reference, b"abc") or "")
    same_size = bytes(len(SRC.value or b""))
    assert "sha256" in (check_fetched(got.reference, same_size) or "")


def test_unreadable_reference_and_foreign_records() -> None:
    dl = dead_letter_by_reference(SRC, ImageRejected("x"), "w-1")
    assert inspect(dl.headers, b"not json").bad_reference is not None
    no_source = [(k, v) for k, v in dl.headers if k != "ktw.dlq.source.offset"]
    bad = inspect(no_source, dl.value).bad_reference
    assert bad is not None and "ktw.dlq.source.offset" in bad
    doc = json.loads(dl.value or b"")
    del doc["sha256"]
    assert inspect(dl.headers, json.dumps(doc).encode()).bad_reference is not None
    foreign = inspect([("trace", b"x")], b"v")
    assert foreign.reason is None and foreign.reference is None
    assert inspect(None, None).reason is None


def test_parse_time() -> None:
    assert parse_time("2024-05-01T12:00:00Z", "--since") == 1_714_564_800_000
    assert parse_time("2024-05-01T14:00:00+02:00", "--since") == 1_714_564_800_000
    assert parse_time("2024-05-01T12:00:00.250Z", "--since") == 1_714_564_800_250
    with pytest.raises(BadOption, match=r"--until '2024-05-01' has no time zone.*"
                                        r"2024-05-01T00:00:00Z"):
        parse_time("2024-05-01", "--until")
    with pytest.raises(BadOption, match="not an ISO-8601 time"):
        parse_time("yesterday", "--since")


def test_filter() -> None:
    any_ = Filter()
    assert any_.matches("schema", None) and any_.matches(None, 5) and not any_.after_window(5)
    by_reason = Filter(frozenset({"schema", "bad_image"}))
    assert by_reason.matches("bad_image", 1) and not by_reason.matches("oversized", 1)
    assert not by_reason.matches(None, 1), "a record without a reason matches no reason"
    window = Filter(since_ms=100, until_ms=200)
    assert [window.matches("schema", ts) for ts in (99, 100, 199, 200, None)] == [
        False, True, True, False, False]
    assert [window.after_window(ts) for ts in (199, 200, 10_000, None)] == [
        False, True, True, False]
    with pytest.raises(BadOption, match="--until must be after --since"):
        Filter(since_ms=200, until_ms=200)
