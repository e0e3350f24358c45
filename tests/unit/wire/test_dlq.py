"""worker.wire.dlq.dead_letter: original key/value/headers untouched, then ktw.dlq.* headers."""

from __future__ import annotations

import msgpack
import pytest

from worker.exceptions import (
    ImageRejected,
    JobRejected,
    MalformedPayload,
    NothingToScore,
    OversizedMessage,
    SchemaViolation,
    TextTooLong,
    UnknownPolicy,
    UnsupportedVersion,
)
from worker.wire.dlq import CONNECT_PREFIX, HEADER_PREFIX, MAX_MESSAGE_CHARS, dead_letter
from worker.wire.records import SourceRecord

ORIGINAL_HEADERS = [
    ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ("z-last-alphabetically", b"\x00\xff binary"),
    ("a-first-alphabetically", None),
    ("traceparent", b"duplicate names are kept too"),
]


def _record(**kw: object) -> SourceRecord:
    base: dict[str, object] = dict(
        topic="moderation.jobs", partition=3, offset=1042, key=b"job-0002",
        value=b"\x82\xa1v\x01\xa2id\xa8job-0002", headers=list(ORIGINAL_HEADERS),
        timestamp_ms=1_796_000_000_000,
    )
    return SourceRecord(**{**base, **kw})  # type: ignore[arg-type]


def _ours(headers: list[tuple[str, bytes | None]]) -> dict[str, str]:
    out = {}
    for name, value in headers:
        if name.startswith(HEADER_PREFIX):
            assert name not in out, f"duplicate {name}"
            assert value is not None
            out[name.removeprefix(HEADER_PREFIX)] = value.decode("utf-8")
    return out


def test_key_and_value_are_the_original_bytes() -> None:
    rec = _record()
    dl = dead_letter(rec, SchemaViolation("x"), "w")
    assert dl.key is rec.key and dl.value is rec.value


def test_original_headers_come_first_untouched_and_in_order() -> None:
    dl = dead_letter(_record(), SchemaViolation("x"), "w")
    assert dl.headers[: len(ORIGINAL_HEADERS)] == ORIGINAL_HEADERS
    assert all(n.startswith((HEADER_PREFIX, CONNECT_PREFIX))
               for n, _ in dl.headers[len(ORIGINAL_HEADERS):])


def test_the_source_records_header_list_is_not_mutated() -> None:
    rec = _record()
    dead_letter(rec, SchemaViolation("x"), "w")
    assert rec.headers == ORIGINAL_HEADERS


def test_appended_headers_name_error_and_source() -> None:
    dl = dead_letter(_record(), SchemaViolation("missing required field 'image'"), "worker-7")
    assert _ours(dl.headers) == {
        "error.class": "SchemaViolation",
        "error.reason": "schema",
        "error.message": "missing required field 'image'",
        "source.topic": "moderation.jobs",
        "source.partition": "3",
        "source.offset": "1042",
        "source.timestamp": "1796000000000",
        "source.v": "1",  # the job's contract version, from its value
        "worker": "worker-7",
    }


def test_timestamp_header_is_absent_when_the_record_has_none() -> None:
    dl = dead_letter(_record(timestamp_ms=None), SchemaViolation("x"), "w")
    assert "source.timestamp" not in _ours(dl.headers)
    assert "source.offset" in _ours(dl.headers)


def test_timestamp_zero_is_still_written() -> None:
    dl = dead_letter(_record(timestamp_ms=0), SchemaViolation("x"), "w")
    assert _ours(dl.headers)["source.timestamp"] == "0"


@pytest.mark.parametrize(("value", "version"), [
    (msgpack.packb({"v": 2, "id": "j"}), "2"),
    (msgpack.packb({"id": "j", "v": 3, "image": b"\xff" * 100}), "3"),  # unsupported: told too
    (msgpack.packb({"v": 2**64 - 1}), str(2**64 - 1)),
])
def test_the_jobs_contract_version_is_named_when_its_value_has_one(value: bytes, version: str
                                                                   ) -> None:
    assert _ours(dead_letter(_record(value=value), UnsupportedVersion("x"), "w").headers)[
        "source.v"] == version


@pytest.mark.parametrize("value", [
    None, b"", b"\xc1", msgpack.packb([2]), msgpack.packb({"id": "j"}),
    msgpack.packb({"v": 1.0}), msgpack.packb({"v": True}), msgpack.packb({"v": "2"}),
    msgpack.packb({"v": 2}) + b"\x00",  # trailing bytes: not a contract document
], ids=repr)
def test_no_version_is_named_for_a_value_without_an_integer_v(value: bytes | None) -> None:
    assert "source.v" not in _ours(dead_letter(_record(value=value), SchemaViolation("x"),
                                               "w").headers)


def test_a_reference_names_the_version_of_the_value_it_leaves_behind() -> None:
    from worker.wire.dlq import dead_letter_by_reference

    rec = _record(value=msgpack.packb({"v": 2, "id": "j", "image": b"\xff" * 5000}))
    assert _ours(dead_letter_by_reference(rec, OversizedMessage("x"), "w").headers)[
        "source.v"] == "2"


def test_record_without_headers_gets_only_ours() -> None:
    dl = dead_letter(_record(headers=None, key=None), SchemaViolation("x"), "w")
    assert all(n.startswith((HEADER_PREFIX, CONNECT_PREFIX)) for n, _ in dl.headers)
    assert dl.key is None


@pytest.mark.parametrize(
    ("error", "cls", "reason"),
    [
        (MalformedPayload("m"), "MalformedPayload", "not_msgpack"),
        (SchemaViolation("m"), "SchemaViolation", "schema"),
        (UnsupportedVersion("m"), "UnsupportedVersion", "unsupported_version"),
        (UnknownPolicy("m"), "UnknownPolicy", "unknown_policy"),
        (NothingToScore("m"), "NothingToScore", "nothing_to_score"),
        (TextTooLong("m"), "TextTooLong", "text_too_long"),
        (ImageRejected("m"), "ImageRejected", "bad_image"),
        (OversizedMessage("m"), "OversizedMessage", "oversized"),
        (JobRejected("m", reason="custom"), "JobRejected", "custom"),
    ],
)
def test_class_and_reason_follow_the_error(error: JobRejected, cls: str, reason: str) -> None:
    ours = _ours(dead_letter(_record(), error, "w").headers)
    assert (ours["error.class"], ours["error.reason"]) == (cls, reason)


def test_message_of_exactly_the_limit_is_kept_whole() -> None:
    msg = "m" * MAX_MESSAGE_CHARS
    assert _ours(dead_letter(_record(), SchemaViolation(msg), "w").headers)["error.message"] == msg


@pytest.mark.parametrize("length", [MAX_MESSAGE_CHARS + 1, 5_000, 100_000])
def test_long_message_is_truncated_to_1000_chars_with_an_ellipsis(length: int) -> None:
    msg = "".join(chr(ord("a") + i % 26) for i in range(length))
    out = _ours(dead_letter(_record(), SchemaViolation(msg), "w").headers)["error.message"]
    assert MAX_MESSAGE_CHARS == 1000
    assert len(out) == 1000
    assert out == msg[:997] + "..."


def test_non_ascii_message_is_utf8_encoded() -> None:
    dl = dead_letter(_record(), SchemaViolation("politique « stricte » inconnue ✗"), "w")
    raw = dict(dl.headers)["ktw.dlq.error.message"]
    assert raw == "politique « stricte » inconnue ✗".encode()


def test_unencodable_characters_do_not_crash_the_dead_letter() -> None:
    dl = dead_letter(_record(), SchemaViolation("lone surrogate \udc80 here"), "w")
    raw = dict(dl.headers)["ktw.dlq.error.message"]
    assert raw is not None
    assert raw.startswith(b"lone surrogate ")


def test_a_record_over_the_inline_limit_is_dead_lettered_by_reference() -> None:
    import hashlib
    import json

    from worker.wire.dlq import dead_letter_by_reference, record_bytes

    rec = _record(value=b"v" * 5000, headers=ORIGINAL_HEADERS)
    assert record_bytes(rec) > 5000
    whole = dead_letter(rec, OversizedMessage("too big"), "w1", inline_max_bytes=10_000)
    assert whole.value == rec.value, "under the limit: the original, untouched"
    ref = dead_letter(rec, OversizedMessage("too big"), "w1", inline_max_bytes=4096)
    assert ref == dead_letter_by_reference(rec, OversizedMessage("too big"), "w1")
    doc = json.loads(ref.value or b"")
    assert doc == {"ref": "kafka", "topic": rec.topic, "partition": rec.partition,
                   "offset": rec.offset, "bytes": 5000,
                   "sha256": hashlib.sha256(b"v" * 5000).hexdigest(),
                   "headers": len(ORIGINAL_HEADERS), "record_bytes": record_bytes(rec)}
    h = dict(ref.headers)
    assert h[HEADER_PREFIX + "value"] == b"reference"
    assert h[HEADER_PREFIX + "error.reason"] == b"oversized"
    # The original headers stay behind with the value, but for the W3C trace context.
    assert [(k, v) for k, v in ref.headers
            if not k.startswith((HEADER_PREFIX, CONNECT_PREFIX))] == [
        (k, v) for k, v in ORIGINAL_HEADERS if k == "traceparent"]
    assert ref.key == rec.key


def test_a_large_key_is_left_out_of_a_reference() -> None:
    from worker.wire.dlq import MAX_REFERENCE_KEY, dead_letter_by_reference

    rec = _record(key=b"k" * (MAX_REFERENCE_KEY + 1))
    # Keyed by the source coordinates instead: a compacted DLQ topic refuses key-less records.
    key = f"{rec.topic}/{rec.partition}/{rec.offset}".encode()
    assert dead_letter_by_reference(rec, SchemaViolation("x"), "w1").key == key
    assert dead_letter_by_reference(_record(key=None), SchemaViolation("x"), "w1").key == key


def test_copied_headers_cannot_forge_the_workers_own() -> None:
    forged = [("ktw.dlq.error.reason", b"none"), ("ktw.dlq.source.offset", b"0"),
              *ORIGINAL_HEADERS]
    dl = dead_letter(_record(headers=forged), SchemaViolation("bad"), "w1")
    names = [k for k, _ in dl.headers]
    assert names.count("ktw.dlq.error.reason") == 1 and names.count("ktw.dlq.source.offset") == 1
    assert dict(dl.headers)["ktw.dlq.error.reason"] == b"schema"
    assert dl.headers[: len(ORIGINAL_HEADERS)] == ORIGINAL_HEADERS, "the rest kept, in order"


def test_copied_headers_cannot_forge_a_replays_source_coordinates() -> None:
    """A job carrying ktw.source.* / ktw.replay.id would, once dead-lettered by a replay, make
    its resume mark another record handled (and skip it)."""
    forged = [("ktw.replay.id", b"r-1"), ("ktw.source.partition", b"0"),
              ("ktw.source.offset", b"7"), ("ktw.schema", b"moderation-job/v1"),
              *ORIGINAL_HEADERS]
    names = [k for k, _ in dead_letter(_record(headers=forged), SchemaViolation("x"), "w").headers]
    assert not [n for n in names if n.startswith(("ktw.source.", "ktw.replay."))]
    assert "ktw.schema" in names  # the job's other headers are kept
