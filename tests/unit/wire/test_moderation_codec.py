"""worker.wire.moderation_codec: msgpack payloads -> ModerationJob, with every bad input a
JobRejected."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.exceptions import (
    JobRejected,
    MalformedPayload,
    SchemaViolation,
    TextTooLong,
    UnsupportedVersion,
)
from worker.tools.produce import encode_job
from worker.wire import moderation_codec as codec
from worker.wire.moderation_codec import (
    DecodeLimits,
    decode_moderation_job,
    decode_result,
    encode_result,
    result_to_dict,
)
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.msgpack_map import unpack_map
from worker.wire.records import SourceRef

IMAGE = b"\xff\xd8\xff\xe0fake-jpeg"


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _job(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": "job-1", "image": IMAGE, **fields}


def _reject(payload: bytes, limits: DecodeLimits | None = None) -> JobRejected:
    with pytest.raises(JobRejected) as info:
        decode_moderation_job(payload, limits)
    return info.value


# --- not msgpack at all -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\xc1\x00\x00", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"],
    ids=["empty", "never-used-byte", "never-used-byte-then-data", "huge-map-header",
         "huge-bin-header"],
)
def test_non_msgpack_bytes_are_malformed_payload(payload: bytes) -> None:
    assert type(_reject(payload)) is MalformedPayload


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_are_rejected_not_crashed(seed: int) -> None:
    payload = random.Random(seed).randbytes(64)
    assert isinstance(_reject(payload), JobRejected)


def test_every_truncation_of_a_valid_job_is_malformed_payload() -> None:
    payload = _pack(_job(text="caption", policy="default", deadline_ms=123))
    decode_moderation_job(payload)  # the whole payload is fine
    for cut in range(len(payload)):
        err = _reject(payload[:cut])
        assert type(err) is MalformedPayload, f"cut at {cut}: {err!r}"


def test_trailing_garbage_after_the_map_is_malformed_payload() -> None:
    err = _reject(_pack(_job()) + b"\x00")
    assert type(err) is MalformedPayload
    assert "extra data" in str(err)


def test_two_concatenated_jobs_are_malformed_payload() -> None:
    assert type(_reject(_pack(_job()) * 2)) is MalformedPayload


@pytest.mark.parametrize("doc", [[1, 2, 3], "job", 1, None, b"bytes", True],
                         ids=["list", "str", "int", "nil", "bin", "bool"])
def test_top_level_other_than_a_map_is_malformed_payload(doc: Any) -> None:
    err = _reject(_pack(doc))
    assert type(err) is MalformedPayload
    assert "map" in str(err)


@pytest.mark.parametrize("where", ["value", "key"])
def test_invalid_utf8_in_a_str_is_malformed_payload(where: str) -> None:
    if where == "value":
        payload = _pack(_job(id="XX")).replace(b"\xa2XX", b"\xa2\xff\xfe")
    else:
        payload = _pack({**_job(), "XX": 1}).replace(b"\xa2XX", b"\xa2\xff\xfe")
    assert b"\xff\xfe" in payload
    err = _reject(payload)
    assert type(err) is MalformedPayload
    assert "UTF-8" in str(err)


def test_utf8_encoded_surrogate_is_malformed_payload() -> None:
    payload = _pack(_job(id="XXX")).replace(b"\xa3XXX", b"\xa3\xed\xa0\x80")
    assert type(_reject(payload)) is MalformedPayload


def test_non_string_map_key_is_malformed_payload() -> None:
    assert type(_reject(_pack({**_job(), 7: "x"}))) is MalformedPayload


def test_bin_map_key_is_an_unknown_field() -> None:
    err = _reject(_pack({**_job(), b"zz": 1}))
    assert type(err) is SchemaViolation
    assert "unknown field" in str(err)


def test_an_unknown_field_s_name_cannot_break_the_one_line_reason() -> None:
    err = _reject(_pack({**_job(), "a\nb": 1}))
    assert type(err) is SchemaViolation and "\n" not in str(err)
    assert "'a\\nb'" in str(err)


# --- msgpack features the contract does not have ------------------------------------------------


@pytest.mark.parametrize("field", ["text", "policy", "deadline_ms", "image", "id"])
def test_ext_type_in_a_field_is_schema_violation(field: str) -> None:
    err = _reject(_pack(_job(**{field: msgpack.ExtType(5, b"\x00\x01")})))
    assert type(err) is SchemaViolation
    assert "extension type 5" in str(err)


def test_ext_type_at_top_level_is_rejected() -> None:
    assert isinstance(_reject(_pack(msgpack.ExtType(1, b""))), JobRejected)


@pytest.mark.parametrize("field", ["text", "deadline_ms", "v"])
def test_msgpack_timestamp_is_not_accepted_for_any_field(field: str) -> None:
    # Timestamps (ext -1) are decoded by msgpack itself, bypassing ext_hook.
    err = _reject(_pack(_job(**{field: msgpack.Timestamp(1_700_000_000, 0)})))
    assert type(err) is SchemaViolation
    assert f"'{field}'" in str(err)


def test_malformed_timestamp_ext_is_malformed_payload() -> None:
    payload = _pack(_job(text="XY")).replace(b"\xa2XY", b"\xd4\xff\x00")  # fixext1, type -1
    assert type(_reject(payload)) is MalformedPayload


def test_deeply_nested_document_is_malformed_payload() -> None:
    assert type(_reject(b"\x91" * 100_000 + b"\xc0")) is MalformedPayload


def test_deeply_nested_field_value_is_malformed_payload() -> None:
    head = _pack(_job(text="XY"))
    payload = head.replace(b"\xa2XY", b"\x91" * 5_000 + b"\xc0")
    assert type(_reject(payload)) is MalformedPayload


def test_shallow_nested_field_value_is_schema_violation_naming_the_field() -> None:
    nested: Any = "x"
    for _ in range(50):
        nested = [nested]
    err = _reject(_pack(_job(text=nested)))
    assert type(err) is SchemaViolation
    assert "'text'" in str(err)


# --- the version field --------------------------------------------------------------------------


@pytest.mark.parametrize("v", [True, False], ids=["true", "false"])
def test_bool_is_not_accepted_as_version(v: bool) -> None:
    err = _reject(_pack(_job(v=v)))
    assert type(err) is SchemaViolation
    assert "'v'" in str(err)


@pytest.mark.parametrize("v", [1.0, "1", None, b"\x01", [1]], ids=["float", "str", "nil",
                                                                    "bin", "list"])
def test_non_integer_version_is_schema_violation(v: Any) -> None:
    err = _reject(_pack(_job(v=v)))
    assert type(err) is SchemaViolation
    assert "'v'" in str(err)


@pytest.mark.parametrize("v", [0, 3, -1, 2**64 - 1, -(2**63)])
def test_other_integer_version_is_unsupported_version(v: int) -> None:
    err = _reject(_pack(_job(v=v)))
    assert type(err) is UnsupportedVersion
    assert f"v={v}" in str(err) and "this worker: 1, 2" in str(err)


def test_unsupported_version_wins_over_unknown_fields() -> None:
    """A v3 job may carry v3 fields; say 'unsupported version', not 'unknown field'."""
    assert type(_reject(_pack(_job(v=3, priority=1)))) is UnsupportedVersion


@pytest.mark.parametrize("v", [1, 2])
def test_the_job_carries_its_version(v: int) -> None:
    job = decode_moderation_job(_pack(_job(v=v, text="caption", policy="strict")))
    assert job.schema_version == v
    assert (job.id, job.image, job.text, job.policy) == ("job-1", IMAGE, "caption", "strict")


def test_a_v2_job_has_v1_s_fields_and_no_others() -> None:
    assert type(_reject(_pack(_job(v=2, rule="allow")))) is SchemaViolation


def test_missing_version_is_schema_violation() -> None:
    doc = _job()
    del doc["v"]
    err = _reject(_pack(doc))
    assert type(err) is SchemaViolation
    assert "'v'" in str(err)


# --- field rules and messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"id": 5}, "id"),
        ({"id": ""}, "id"),
        ({"id": "x" * 257}, "id"),
        ({"id": b"job"}, "id"),
        ({"image": "not-bytes"}, "image"),
        ({"image": b""}, "image"),
        ({"image": b"", "text": "a caption"}, "image"),  # a caption does not excuse it
        ({"image": "not-bytes", "text": "a caption"}, "image"),
        ({"text": b"bytes"}, "text"),
        ({"text": 5}, "text"),
        ({"text": "t" * (codec.MAX_TEXT_CHARS + 1)}, "text"),
        ({"policy": "Bad Policy!"}, "policy"),
        ({"policy": ""}, "policy"),
        ({"policy": "-leading-dash"}, "policy"),
        ({"policy": "p" * 65}, "policy"),
        ({"policy": 3}, "policy"),
        ({"deadline_ms": -1}, "deadline_ms"),
        ({"deadline_ms": "soon"}, "deadline_ms"),
        ({"deadline_ms": 1.5}, "deadline_ms"),
        ({"deadline_ms": True}, "deadline_ms"),
        ({"deadline_ms": 2**63}, "deadline_ms"),
        ({"priority": 1}, "priority"),
    ],
    ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None,
)
def test_schema_violation_message_names_the_field(fields: dict[str, Any], named: str) -> None:
    err = _reject(_pack(_job(**fields)))
    assert type(err) is SchemaViolation
    assert named in str(err)


def test_missing_id_is_named() -> None:
    doc = _job()
    del doc["id"]
    err = _reject(_pack(doc))
    assert type(err) is SchemaViolation
    assert "missing required field 'id'" in str(err)


# --- image, text or both ------------------------------------------------------------------------


def _without_image(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in _job(**fields).items() if k != "image"}


@pytest.mark.parametrize("doc", [_without_image(text="a caption"),
                                 _job(image=None, text="a caption")],
                         ids=["image-absent", "image-nil"])
def test_text_only_job_is_accepted_with_image_none(doc: dict[str, Any]) -> None:
    job = decode_moderation_job(_pack(doc))
    assert job == ModerationJob(id="job-1", image=None, text="a caption")


@pytest.mark.parametrize("doc", [_job(), _job(text=None), _job(text=""), _job(text=" \n")],
                         ids=["text-absent", "text-nil", "text-empty", "text-blank"])
def test_image_only_job_is_accepted(doc: dict[str, Any]) -> None:
    job = decode_moderation_job(_pack(doc))
    assert job.image == IMAGE and job.text == doc.get("text")


@pytest.mark.parametrize(
    "doc",
    [_without_image(), _job(image=None), _without_image(text=None), _job(image=None, text=None),
     _without_image(text=""), _without_image(text="  \t\n"), _without_image(text="\u3000\u00a0")],
    ids=["neither", "image-nil", "text-nil", "both-nil", "text-empty", "text-blank",
         "text-unicode-blank"],
)
def test_job_with_neither_image_nor_text_is_schema_violation(doc: dict[str, Any]) -> None:
    err = _reject(_pack(doc))
    assert type(err) is SchemaViolation
    assert "job has neither image nor text" in str(err)


def test_zero_byte_image_is_schema_violation_even_with_text() -> None:
    for doc in (_job(image=b""), _job(image=b"", text="a caption")):
        err = _reject(_pack(doc))
        assert type(err) is SchemaViolation
        assert "field 'image': empty" in str(err)


# ECMA-262's \s (WhiteSpace and LineTerminator), what the job schema's "not blank" pattern means.
ECMA_WHITESPACE = ("\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
                   + "\u2028\u2029\u202f\u205f\u3000\ufeff")


@pytest.mark.parametrize("char", ECMA_WHITESPACE, ids=lambda c: f"U+{ord(c):04X}")
def test_a_text_of_ecma_whitespace_alone_is_blank(char: str) -> None:
    err = _reject(_pack(_without_image(text=char * 3)))
    assert type(err) is SchemaViolation and "neither image nor text" in str(err)


@pytest.mark.parametrize("char", ["\x1c", "\x1f", "\x85", "\u180e", "\u200b", "\x00"],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_a_character_outside_ecma_whitespace_is_text(char: str) -> None:
    """Python's str.isspace() counts U+001C-U+001F and U+0085 as whitespace; the contract (and
    ECMA-262, RE2) do not, so a text of them is not blank."""
    assert decode_moderation_job(_pack(_without_image(text=char))).text == char


def _map(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack map of ``pairs`` as given: repeated keys stay repeated."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(_pack(k) + _pack(v) for k, v in pairs)


@pytest.mark.parametrize(
    "pairs",
    [(("v", 1), ("id", "a"), ("image", IMAGE), ("id", "b")),
     (("v", 1), ("v", 1), ("id", "a"), ("image", IMAGE)),  # the same value twice too
     (("v", 3), ("id", "a"), ("image", IMAGE), ("v", 1)),  # the last v would pass
     (("v", 1), ("id", "a"), ("text", "ok"), ("text", " "))],
    ids=["id-twice", "v-twice-same", "v-3-then-1", "text-twice"],
)
def test_a_duplicate_key_is_a_schema_violation(pairs: tuple[tuple[Any, Any], ...]) -> None:
    err = _reject(_map(*pairs))
    assert type(err) is SchemaViolation and "duplicate key" in str(err)
    assert repr(next(k for k, _ in pairs if sum(k == q for q, _ in pairs) > 1)) in str(err)


def test_the_duplicate_check_counts_16_bit_map_headers_too() -> None:
    doc = {"v": 1, "id": "a", "image": IMAGE, **{f"x{i}": i for i in range(20)}}
    payload = _pack(doc)
    assert payload[0] == 0xDE
    err = _reject(payload)
    assert "unknown field" in str(err), "distinct keys: no duplicate reported"
    twice = payload.replace(b"\xa3x19", b"\xa3x18")  # two keys x18
    assert "duplicate key(s) in the map: 'x18'" in str(_reject(twice))


def test_text_only_job_still_obeys_the_text_limit() -> None:
    limits = DecodeLimits(max_image_bytes=1024, max_text_chars=10)
    assert decode_moderation_job(_pack(_without_image(text="t" * 10)), limits).text == "t" * 10
    err = _reject(_pack(_without_image(text="t" * 11)), limits)
    assert type(err) is TextTooLong
    assert "'text'" in str(err)


def test_absent_optional_fields_take_their_defaults() -> None:
    job = decode_moderation_job(_pack(_job()))
    assert job == ModerationJob(id="job-1", image=IMAGE, text=None, policy="default",
                                deadline_ms=None)


def test_explicit_nulls_for_optional_fields_take_their_defaults() -> None:
    job = decode_moderation_job(_pack(_job(text=None, policy=None, deadline_ms=None)))
    assert (job.text, job.policy, job.deadline_ms) == (None, "default", None)


@pytest.mark.parametrize(
    "fields",
    [
        {"id": "x" * 256},
        {"id": "é" * 256},  # the limit counts characters, not UTF-8 bytes
        {"text": ""},
        {"policy": "a"},
        {"policy": "a" * 64},
        {"policy": "v2.strict_mode-1"},
        {"deadline_ms": 0},
        {"deadline_ms": codec.INT64_MAX},
    ],
    ids=lambda f: f"{next(iter(f))}={next(iter(f.values()))!r:.20}",
)
def test_boundary_values_inside_the_contract_are_accepted(fields: dict[str, Any]) -> None:
    job = decode_moderation_job(_pack(_job(**fields)))
    key, value = next(iter(fields.items()))
    assert getattr(job, key) == value


def test_policy_name_with_trailing_newline_is_schema_violation() -> None:
    assert type(_reject(_pack(_job(policy="default\n")))) is SchemaViolation


# --- operational limits -------------------------------------------------------------------------


def test_image_at_the_configured_limit_is_accepted_one_byte_more_is_not() -> None:
    limits = DecodeLimits(max_image_bytes=1024, max_text_chars=100)
    assert decode_moderation_job(_pack(_job(image=b"i" * 1024)), limits).image == b"i" * 1024
    err = _reject(_pack(_job(image=b"i" * 1025)), limits)
    assert type(err) is SchemaViolation
    assert "'image'" in str(err) and "1025" in str(err) and "1024" in str(err)


def test_text_at_the_configured_limit_is_accepted_one_char_more_is_not() -> None:
    limits = DecodeLimits(max_image_bytes=1024, max_text_chars=10)
    assert decode_moderation_job(_pack(_job(text="t" * 10)), limits).text == "t" * 10
    err = _reject(_pack(_job(text="t" * 11)), limits)
    assert type(err) is TextTooLong and err.reason == "text_too_long"
    assert "'text'" in str(err) and "limits.max_text_chars 10" in str(err)


def test_default_limits_are_the_documented_defaults() -> None:
    assert DecodeLimits() == DecodeLimits(max_image_bytes=20 * 1024 * 1024,
                                          max_text_chars=20_000)
    err = _reject(_pack(_job(text="t" * 20_001)))
    assert type(err) is TextTooLong and "'text'" in str(err)


def test_a_configured_text_limit_cannot_loosen_the_contract() -> None:
    limits = DecodeLimits(max_text_chars=10**6)
    decode_moderation_job(_pack(_job(text="t" * codec.MAX_TEXT_CHARS)), limits)
    err = _reject(_pack(_job(text="t" * (codec.MAX_TEXT_CHARS + 1))), limits)
    assert type(err) is SchemaViolation and "'text'" in str(err)


def test_a_text_the_contract_allows_over_the_worker_limit_is_text_too_long() -> None:
    """25,000 characters: valid by the schema's 100,000, over the default 20,000."""
    for doc in (_job(text="t" * 25_000), _without_image(text="t" * 25_000)):
        err = _reject(_pack(doc))
        assert type(err) is TextTooLong and err.reason == "text_too_long"
        assert "25000" in str(err) and "20000" in str(err)


@pytest.mark.parametrize("fields", [{"policy": "Bad Policy!"}, {"deadline_ms": -1},
                                    {"image": b""}, {"colour": "red"}, {"v": 3}])
def test_a_job_invalid_otherwise_is_refused_for_that_whatever_its_text(
        fields: dict[str, Any]) -> None:
    """text_too_long is for valid jobs only: the contract's own reasons come first."""
    err = _reject(_pack(_job(**{"text": "t" * 25_000, **fields})))
    assert type(err) in (SchemaViolation, UnsupportedVersion)


def test_a_configured_image_limit_cannot_loosen_the_contract() -> None:
    limits = DecodeLimits(max_image_bytes=2 * codec.MAX_IMAGE_BYTES)
    err = _reject(_pack(_job(image=bytes(codec.MAX_IMAGE_BYTES + 1))), limits)
    assert type(err) is SchemaViolation
    assert str(codec.MAX_IMAGE_BYTES) in str(err)


# --- round trips --------------------------------------------------------------------------------


def test_producer_tool_encode_job_round_trips() -> None:
    payload = encode_job("frame-1", IMAGE, text="hello ✓", policy="strict",
                         deadline_ms=1_796_000_000_000)
    assert decode_moderation_job(payload) == ModerationJob(
        id="frame-1", image=IMAGE, text="hello ✓", policy="strict",
        deadline_ms=1_796_000_000_000,
    )


def test_producer_tool_omits_absent_optional_fields() -> None:
    doc = msgpack.unpackb(encode_job("j", IMAGE), raw=False)
    assert doc == {"v": 1, "id": "j", "image": IMAGE}


def test_producer_tool_writes_the_version_it_is_given() -> None:
    assert msgpack.unpackb(encode_job("j", IMAGE, version=2), raw=False)["v"] == 2
    assert decode_moderation_job(encode_job("j", IMAGE, version=2)).schema_version == 2


@settings(max_examples=300, deadline=None, database=None)
@given(
    job_id=st.text(min_size=1, max_size=256),
    image=st.binary(min_size=1, max_size=256),
    text=st.none() | st.text(max_size=200),
    policy=st.none() | st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,63}", fullmatch=True),
    deadline=st.none() | st.integers(min_value=0, max_value=codec.INT64_MAX),
)
def test_encode_job_then_decode_gives_the_same_fields(
    job_id: str, image: bytes, text: str | None, policy: str | None, deadline: int | None
) -> None:
    job = decode_moderation_job(
        encode_job(job_id, image, text=text, policy=policy, deadline_ms=deadline)
    )
    assert job == ModerationJob(id=job_id, image=image, text=text, policy=policy or "default",
                                deadline_ms=deadline)


def _result(**kw: Any) -> ModerationResult:
    base: dict[str, Any] = dict(id="j", status=Status.OK, policy="default",
                                model_id="open_nsfw", engine_hash="e", verdict=Verdict.ALLOW)
    return ModerationResult(**{**base, **kw})


def test_result_round_trips_through_msgpack() -> None:
    result = _result(scores={"sfw": 0.9, "nsfw": 0.1}, timings_ms={"infer": 3.0},
                     source=SourceRef("moderation.jobs", 1, 2))
    assert decode_result(encode_result(result)) == result_to_dict(result)


def test_result_to_dict_omits_absent_optional_fields() -> None:
    doc = result_to_dict(_result(status=Status.ERROR, verdict=None))
    assert not {"verdict", "error", "source", "rule", "models"} & set(doc)
    assert doc["status"] == "error" and doc["v"] == 1


def test_result_to_dict_writes_rule_and_models_when_set() -> None:
    doc = result_to_dict(_result(rule="block:text.violence", models=("open_nsfw", "text")))
    assert doc["rule"] == "block:text.violence"
    assert doc["models"] == ["open_nsfw", "text"]


@pytest.mark.parametrize("kw", [{"rule": "allow"}, {"models": ("text",)}], ids=repr)
def test_result_to_dict_writes_each_of_rule_and_models_on_its_own(kw: dict[str, Any]) -> None:
    doc = result_to_dict(_result(**kw))
    (key, value), = kw.items()
    assert doc[key] == (list(value) if isinstance(value, tuple) else value)
    assert not ({"rule", "models"} - {key}) & set(doc)


def test_result_with_rule_and_models_round_trips_through_msgpack() -> None:
    result = _result(scores={"text.violence": 0.95}, rule="block:text.violence",
                     models=("text",))
    decoded = decode_result(encode_result(result))
    assert decoded == result_to_dict(result)
    assert decoded["models"] == ["text"] and decoded["rule"] == "block:text.violence"


def test_open_nsfw_result_payload_is_byte_identical_to_v1() -> None:
    """Results without rule/models are exactly the v1 payload: same keys, same order."""
    result = _result(scores={"sfw": 0.9, "nsfw": 0.1}, timings_ms={"infer": 3.0},
                     source=SourceRef("moderation.jobs", 1, 2))
    v1 = {"v": 1, "id": "j", "status": "ok", "policy": "default", "model_id": "open_nsfw",
          "engine_hash": "e", "scores": {"sfw": 0.9, "nsfw": 0.1}, "timings_ms": {"infer": 3.0},
          "verdict": "allow", "source": {"topic": "moderation.jobs", "partition": 1,
                                         "offset": 2}}
    assert encode_result(result) == _pack(v1)


def test_a_v1_result_keeps_rule_and_models_out_when_unset_whatever_its_status() -> None:
    for status in Status:
        doc = result_to_dict(_result(status=status, verdict=None))
        assert doc["v"] == 1 and not {"rule", "models"} & set(doc)


def test_v2_result_always_writes_rule_and_models_in_v1_s_key_order() -> None:
    ok = _result(scores={"open_nsfw.sfw": 0.9, "open_nsfw.nsfw": 0.1}, rule="allow",
                 models=("open_nsfw",), schema_version=2, source=SourceRef("j", 1, 2))
    doc = result_to_dict(ok)
    assert list(doc) == ["v", "id", "status", "policy", "model_id", "engine_hash", "scores",
                         "timings_ms", "verdict", "source", "rule", "models"]
    assert (doc["v"], doc["rule"], doc["models"]) == (2, "allow", ["open_nsfw"])
    assert decode_result(encode_result(ok)) == doc


@pytest.mark.parametrize("status", [Status.EXPIRED, Status.REJECTED, Status.ERROR])
def test_v2_result_without_a_deciding_rule_says_none(status: Status) -> None:
    doc = result_to_dict(_result(status=status, verdict=None, error="x", schema_version=2))
    assert (doc["rule"], doc["models"], doc["scores"]) == ("none", [], {})
    assert "verdict" not in doc


@pytest.mark.parametrize("kw", [{"rule": None, "models": ("open_nsfw",)},
                                {"rule": "allow", "models": ()}], ids=repr)
def test_a_v2_ok_result_without_rule_or_models_is_a_bug_not_a_payload(kw: dict[str, Any]
                                                                      ) -> None:
    with pytest.raises(ValueError, match="no rule or no models"):
        result_to_dict(_result(schema_version=2, **kw))


def test_a_result_in_a_version_the_contract_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="no contract version 3"):
        result_to_dict(_result(schema_version=3))


def test_result_to_dict_rounds_timings_to_microseconds() -> None:
    doc = result_to_dict(_result(timings_ms={"total": 1.23456789}))
    assert doc["timings_ms"] == {"total": 1.235}


def test_result_to_dict_writes_plain_strings_for_enums() -> None:
    doc = result_to_dict(_result())
    assert type(doc["status"]) is str and type(doc["verdict"]) is str
    assert msgpack.unpackb(_pack(doc), raw=False)["verdict"] == "allow"


def test_decode_result_refuses_non_msgpack() -> None:
    with pytest.raises(MalformedPayload):
        decode_result(b"\xc1")


# --- properties: never anything but a job or a JobRejected --------------------------------------


def _assert_job_or_rejected(payload: bytes) -> None:
    try:
        job = decode_moderation_job(payload)
    except JobRejected:
        return
    assert isinstance(job, ModerationJob)


@settings(max_examples=300, deadline=None, database=None)
@given(payload=st.binary(max_size=512))
def test_arbitrary_bytes_give_a_job_or_job_rejected(payload: bytes) -> None:
    _assert_job_or_rejected(payload)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.binary(max_size=30),
)
_KEYS = st.one_of(st.sampled_from(sorted(codec.JOB_FIELDS)), st.text(max_size=8),
                  st.binary(max_size=4))
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, database=None)
@given(doc=st.dictionaries(_KEYS, _VALUES, max_size=8), with_base=st.booleans())
def test_arbitrary_msgpack_maps_give_a_job_or_job_rejected(
    doc: dict[Any, Any], with_base: bool
) -> None:
    if with_base:  # start from a valid job so later fields get checked too
        doc = {**_job(), **doc}
    _assert_job_or_rejected(_pack(doc))


@settings(max_examples=300, deadline=None, database=None)
@given(doc=st.dictionaries(_KEYS, _VALUES, max_size=8), cut=st.integers(min_value=0))
def test_truncated_arbitrary_maps_give_a_job_or_job_rejected(
    doc: dict[Any, Any], cut: int
) -> None:
    payload = _pack({**_job(), **doc})
    _assert_job_or_rejected(payload[: cut % (len(payload) + 1)])



_FIELD_VALUES: dict[str, list[Any]] = {
    "v": [1, 2, 3, 0, True, 1.0, "1", None],
    "id": ["j", "x" * 256, "x" * 257, "", 7, b"j", None],
    "image": [b"\xff\xd8", b"x" * 32, b"", b"x" * 33, "img", 3, None],
    "text": ["", " ", "\u3000", "hello", "x" * 40, "x" * 41, 5, b"t", None],
    "policy": ["default", "strict.v2", "x" * 64, "default\n", "Bad Name", "x" * 65, "", 3, None],
    "deadline_ms": [0, 1_700_000_000_000, 2**63 - 1, 2**63, -1, 1.5, True, "5", None],
}
_VALID = {"v": 1, "id": "job-1", "image": b"\xff\xd8"}
_fast_path_hits: list[int] = []


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_FIELD_VALUES)), st.just(None), max_size=3)
       .flatmap(lambda keys: st.fixed_dictionaries(
           {k: st.sampled_from([*_FIELD_VALUES[k], "ABSENT"]) for k in keys})),
       st.integers(0, 9))
def test_the_fast_path_decides_as_the_full_validation_does(changes: dict[str, Any],
                                                            extra: int) -> None:
    """decode_moderation_job's fast path accepts only what _validated accepts, into the same
    job (same field types too: True is not 1); everything else gets _validated's verdict and
    reason. Documents are a valid job with up to three fields changed or dropped."""
    doc = {**_VALID, **changes}
    doc = {k: v for k, v in doc.items() if v != "ABSENT"}
    if extra == 0:
        doc["colour"] = "red"
    limits = codec.DecodeLimits(max_image_bytes=32, max_text_chars=40)
    payload = msgpack.packb(doc, use_bin_type=True)

    def verdict(decode: Any) -> Any:
        try:
            job = decode()
        except JobRejected as exc:
            return type(exc), str(exc)
        return job, [type(getattr(job, f)) for f in job.__slots__]

    full = verdict(lambda: codec._validated(unpack_map(payload), limits))
    calls: list[int] = []
    real = codec._validated

    def counted(obj: Any, lim: Any) -> Any:
        calls.append(1)
        return real(obj, lim)

    codec._validated = counted  # type: ignore[assignment]
    try:
        assert verdict(lambda: decode_moderation_job(payload, limits)) == full
    finally:
        codec._validated = real
    if not calls:
        _fast_path_hits.append(1)


def test_the_fast_path_is_taken() -> None:
    """The property test above compared the two paths on documents the fast path took."""
    if not _fast_path_hits:
        test_the_fast_path_decides_as_the_full_validation_does()
    assert len(_fast_path_hits) >= 50
