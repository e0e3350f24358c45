"""Each class of malformed value gets the DLQ reason the contract documents
(schemas/dlq-record.schema.json, the ktw.dlq.error.reason clause), through the worker's intake
order (worker.tasks.protocol.record_value, then the job codec), for moderation and generation
jobs alike; and its dead letter names the job's ``v`` exactly when the value is one msgpack map
with an integer ``v`` (the ktw.dlq.source.v wording)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from tests.contract import SCHEMAS
from worker.exceptions import JobRejected
from worker.tasks.protocol import record_value
from worker.wire.dlq import HEADER_PREFIX, dead_letter
from worker.wire.generation_codec import decode_generation_job
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job
from worker.wire.records import SourceRecord

MAX_MESSAGE_BYTES = 64 * 1024
LIMITS = DecodeLimits(max_image_bytes=1024, max_text_chars=20_000)
IMAGE = b"\xff\xd8\xff\xe0 a jpeg"


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, datetime=True)


def _map(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack map of ``pairs`` as given, repeated keys included."""
    return bytes([0x80 | len(pairs)]) + b"".join(_pack(k) + _pack(v) for k, v in pairs)


def _mod(**fields: Any) -> bytes:
    return _pack({"v": 2, "id": "j", "image": IMAGE, **fields})


def _gen(**fields: Any) -> bytes:
    return _pack({"v": 2, "id": "j", "prompt": "a cat", **fields})


def _nested(depth: int) -> bytes:
    """A job map whose ``text`` is ``depth`` arrays deep."""
    return b"\x83\xa1v\x02\xa2id\xa1j\xa4text" + b"\x91" * depth + b"\x01"


@dataclass(frozen=True)
class Case:
    doc: str  # the words the contract's reason clause uses for this class
    moderation: bytes | None
    generation: bytes | None  # None: the class is moderation's only (or a tombstone)
    reason: str
    source_v: int | None  # the ktw.dlq.source.v a dead letter of it carries


TIMESTAMP = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
CASES: dict[str, Case] = {
    "tombstone": Case("no value (a tombstone)", None, None, "schema", None),
    "oversized-garbage": Case("a value over limits.max_message_bytes",
                              b"\xc1" * (MAX_MESSAGE_BYTES + 1),
                              b"\xc1" * (MAX_MESSAGE_BYTES + 1), "oversized", None),
    "oversized-job": Case("whatever its bytes", _mod(text="t" * MAX_MESSAGE_BYTES),
                          _gen(negative_prompt="n" * MAX_MESSAGE_BYTES), "oversized", 2),
    "empty": Case("an empty value", b"", b"", "not_msgpack", None),
    "reserved-byte": Case("a reserved byte such as 0xc1", b"\xc1", b"\xc1", "not_msgpack",
                          None),
    "truncated": Case("a truncated document", _mod()[:-3], _gen()[:-3], "not_msgpack", None),
    "trailing-bytes": Case("bytes after the first document", _mod() + b"\x00",
                           _gen() + b"\x00", "not_msgpack", None),
    "invalid-utf8": Case("a msgpack str with invalid UTF-8",
                         b"\x83\xa1v\x02\xa2id\xa2\xff\xfe\xa5image\xc4\x01x",
                         b"\x83\xa1v\x02\xa2id\xa1j\xa6prompt\xa2\xc3\x28", "not_msgpack", 2),
    "too-deep": Case("nesting deeper than 1024 levels", _nested(1100), _nested(1100),
                     "not_msgpack", None),
    "long-array": Case("a map or array whose header declares more than 1024 entries",
                       _mod(text=[0] * 1025), _gen(prompt=[0] * 1025), "not_msgpack", 2),
    "long-map": Case("a map or array whose header declares more than 1024 entries",
                     _mod(text={str(i): i for i in range(1025)}),
                     _gen(prompt={str(i): i for i in range(1025)}), "not_msgpack", 2),
    "integer-key": Case("a map key that is not a msgpack str or bin",
                        _map(("v", 2), ("id", "j"), ("image", IMAGE), (7, "x")),
                        _map(("v", 2), ("id", "j"), ("prompt", "p"), (7, "x")),
                        "not_msgpack", 2),
    "array-key": Case("a map key that is not a msgpack str or bin",
                      b"\x84\xa1v\x02\xa2id\xa1j\xa5image\xc4\x01x\x91\x01\x01",
                      b"\x84\xa1v\x02\xa2id\xa1j\xa6prompt\xa1p\x91\x01\x01",
                      "not_msgpack", 2),
    "array-top": Case("a top level that is not a map", _pack([2, "j", IMAGE]),
                      _pack([2, "j", "p"]), "not_msgpack", None),
    "str-top": Case("a top level that is not a map", _pack("job"), _pack("job"),
                    "not_msgpack", None),
    "integer-top": Case("a top level that is not a map", _pack(2), _pack(2), "not_msgpack",
                        None),
    "nil-top": Case("a top level that is not a map", b"\xc0", b"\xc0", "not_msgpack", None),
    "ext-type": Case("a msgpack extension type anywhere",
                     _mod(text=msgpack.ExtType(5, b"x")),
                     _gen(prompt=msgpack.ExtType(5, b"x")), "schema", 2),
    "timestamp": Case("the msgpack timestamp too", _mod(deadline_ms=TIMESTAMP),
                      _gen(deadline_ms=TIMESTAMP), "schema", 2),
    "many-containers": Case("more than 1024 maps and arrays in all",
                            _mod(text=[[[]] * 100] * 11), _gen(prompt=[[[]] * 100] * 11),
                            "schema", 2),
    "duplicate-key": Case("a key twice",
                          _map(("v", 2), ("id", "j"), ("image", IMAGE), ("id", "k")),
                          _map(("v", 2), ("id", "j"), ("prompt", "p"), ("prompt", "q")),
                          "schema", 2),
    "duplicate-v": Case("a key twice",
                        _map(("v", 3), ("id", "j"), ("image", IMAGE), ("v", 1)),
                        _map(("v", 3), ("id", "j"), ("prompt", "p"), ("v", 1)),
                        "schema", 1),  # the last v, as decoders keep it
    "v-missing": Case("v missing", _pack({"id": "j", "image": IMAGE}),
                      _pack({"id": "j", "prompt": "p"}), "schema", None),
    "v-float": Case("not a msgpack integer (float, bool, str)", _mod(v=2.0), _gen(v=2.0),
                    "schema", None),
    "v-bool": Case("not a msgpack integer (float, bool, str)", _mod(v=True), _gen(v=True),
                   "schema", None),
    "v-str": Case("not a msgpack integer (float, bool, str)", _mod(v="2"), _gen(v="2"),
                  "schema", None),
    "v-bin-key": Case("v missing", _map((b"v", 2), ("id", "j"), ("image", IMAGE)),
                      _map((b"v", 2), ("id", "j"), ("prompt", "p")), "schema", None),
    "v-3": Case("an integer v other than 1 and 2", _mod(v=3), _gen(v=3),
                "unsupported_version", 3),
    "v-0": Case("an integer v other than 1 and 2", _mod(v=0), _gen(v=0),
                "unsupported_version", 0),
    "v-negative": Case("an integer v other than 1 and 2", _mod(v=-1), _gen(v=-1),
                       "unsupported_version", -1),
    "v-3-invalid-otherwise": Case("an integer v other than 1 and 2",
                                  _mod(v=3, id=5, colour="red"), _gen(v=3, steps="x"),
                                  "unsupported_version", 3),
    "missing-id": Case("a required field missing", _pack({"v": 2, "image": IMAGE}),
                       _pack({"v": 2, "prompt": "p"}), "schema", 2),
    "unknown-field": Case("a field the job schema does not define", _mod(colour="red"),
                          _gen(colour="red"), "schema", 2),
    "bin-for-str": Case("bin where str is due", _mod(id=b"j"), _gen(prompt=b"p"), "schema", 2),
    "str-for-bin": Case("str where bin is due", _mod(image="/9j/4AAQ"), None, "schema", 2),
    "float-for-int": Case("float where an integer is due", _mod(deadline_ms=1.0),
                          _gen(steps=20.0), "schema", 2),
    "out-of-bounds": Case("a value outside the job schema's bounds", _mod(id="x" * 257),
                          _gen(width=500), "schema", 2),
    "pattern": Case("a value outside the job schema's bounds", _mod(policy="Bad Policy"),
                    _gen(prompt="\u00a0\u3000"), "schema", 2),
    "image-over-limit": Case("an image over limits.max_image_bytes", _mod(image=b"i" * 1025),
                             None, "schema", 2),
    "neither": Case("a moderation job with neither an image nor a non-blank text",
                    _pack({"v": 2, "id": "j", "text": "\u00a0\ufeff"}), None, "schema", 2),
    "text-too-long": Case("whose text is over limits.max_text_chars",
                          _mod(text="t" * 25_000), None, "text_too_long", 2),
}


def _reason(value: bytes | None, decode: Any) -> str:
    record = SourceRecord("jobs", 0, 7, b"k", value, [], None)
    try:
        decode(record_value(record, MAX_MESSAGE_BYTES))
    except JobRejected as exc:
        return exc.reason
    return "accepted"


def _source_v(value: bytes | None, reason: str) -> str | None:
    record = SourceRecord("jobs", 0, 7, b"k", value, [], None)
    dl = dead_letter(record, JobRejected("x", reason=reason), "w")
    headers = dict(dl.headers)
    assert headers[HEADER_PREFIX + "error.reason"] == reason.encode()
    v = headers.get(HEADER_PREFIX + "source.v")
    return None if v is None else v.decode()  # type: ignore[union-attr]


@pytest.mark.parametrize("name", CASES)
def test_a_moderation_job_of_each_class_gets_its_documented_reason(name: str) -> None:
    case = CASES[name]
    assert _reason(case.moderation, lambda v: decode_moderation_job(v, LIMITS)) == case.reason


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.generation is not None])
def test_a_generation_job_of_each_class_gets_its_documented_reason(name: str) -> None:
    case = CASES[name]
    assert _reason(case.generation, decode_generation_job) == case.reason


@pytest.mark.parametrize("name", CASES)
def test_the_dead_letter_names_the_v_of_every_map_with_an_integer_v(name: str) -> None:
    case = CASES[name]
    want = None if case.source_v is None else str(case.source_v)
    assert _source_v(case.moderation, case.reason) == want
    if case.generation is not None:
        assert _source_v(case.generation, case.reason) == want


def _reason_clause() -> str:
    schema = json.loads((SCHEMAS / "dlq-record.schema.json").read_text())
    for clause in schema["properties"]["headers"]["allOf"]:
        text: str = clause["contains"]["description"]
        if text.startswith("ktw.dlq.error.reason:"):
            return text
    raise AssertionError("no ktw.dlq.error.reason clause")


@pytest.mark.parametrize("name", CASES)
def test_the_contract_names_each_class(name: str) -> None:
    case = CASES[name]
    clause = _reason_clause()
    assert case.doc in clause
    assert case.reason in clause

