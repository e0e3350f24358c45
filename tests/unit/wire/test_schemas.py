"""The wire contract: schemas/*.json, their examples, and the hand-written codec agree.

Each example is validated on its msgpack side (bin fields as bytes) by a Draft 2020-12
validator that understands ``x-msgpack-type``; job examples must also decode with the codec,
and mutated job examples must be refused by both the schema and the codec.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.exceptions import (
    JobRejected,
    MalformedPayload,
    SchemaViolation,
    UnsupportedVersion,
)
from worker.wire import moderation_codec as codec
from worker.wire.dlq import dead_letter
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, result_to_dict
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.records import SourceRecord, SourceRef

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
EXAMPLES = sorted((SCHEMAS / "examples").glob("*.json"))
JOB_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("moderation-job.")]
RESULT_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("moderation-result.")]
DLQ_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("dlq-record.")]
# Examples with a bin field (a text-only job has none, so its JSON view is its msgpack side).
BIN_EXAMPLES = [p for p in JOB_EXAMPLES if "image" in json.loads(p.read_text())] + DLQ_EXAMPLES
# The contract never limits sizes below the schema's maxima; operational limits do.
NO_OPERATIONAL_LIMITS = DecodeLimits(max_image_bytes=codec.MAX_IMAGE_BYTES,
                                     max_text_chars=codec.MAX_TEXT_CHARS)


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _walk(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema of a schema document, with a JSON-pointer-ish location."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}/{i}")


# --- the schema files themselves ----------------------------------------------------------------


def test_every_example_has_a_schema_and_every_schema_an_example(contract: Any) -> None:
    assert EXAMPLES, "schemas/examples/ is empty"
    used = {contract.name_for_example(p) for p in EXAMPLES}
    assert used == set(contract.names)
    assert JOB_EXAMPLES and RESULT_EXAMPLES and DLQ_EXAMPLES


@pytest.mark.parametrize("name", ["dlq-record", "moderation-job", "moderation-result"])
def test_every_string_typed_subschema_declares_its_msgpack_type(
    contract: Any, name: str
) -> None:
    missing, bad = [], []
    for where, sub in _walk(contract.schema(name)):
        types = sub.get("type")
        types = [types] if isinstance(types, str) else (types or [])
        if "string" in types and "x-msgpack-type" not in sub:
            missing.append(where)
        if "x-msgpack-type" in sub and sub["x-msgpack-type"] not in ("str", "bin"):
            bad.append(where)
    assert not missing, f"string fields without x-msgpack-type in {name}: {missing}"
    assert not bad, f"x-msgpack-type other than str/bin in {name}: {bad}"


def test_codec_constants_mirror_the_job_schema(contract: Any) -> None:
    props = contract.schema("moderation-job")["properties"]
    assert props["id"]["maxLength"] == codec.MAX_ID_CHARS
    assert props["text"]["maxLength"] == codec.MAX_TEXT_CHARS
    assert props["image"]["maxLength"] == codec.MAX_IMAGE_BYTES
    assert props["policy"]["pattern"] == codec.POLICY_NAME.pattern
    assert props["deadline_ms"]["maximum"] == codec.INT64_MAX
    assert props["v"]["const"] == 1
    assert set(props) == codec.JOB_FIELDS
    image_branch, text_branch = contract.schema("moderation-job")["anyOf"]
    assert image_branch["required"] == ["image"] and text_branch["required"] == ["text"]
    assert text_branch["properties"]["text"]["pattern"] == codec.TEXT_PRESENT.pattern


def test_every_dlq_reason_is_listed_in_the_dlq_schema(contract: Any) -> None:
    """Each JobRejected subclass's reason code is documented for DLQ consumers."""
    from worker import exceptions

    listed = contract.schema("dlq-record")["x-dlq-headers"]["ktw.dlq.error.reason"]
    listed = {r.strip() for r in listed.split(":", 1)[1].split(",")}
    reasons = {cls.reason for cls in vars(exceptions).values()
               if isinstance(cls, type) and issubclass(cls, JobRejected)
               and cls is not JobRejected}
    assert {"nothing_to_score", "text_too_long"} <= reasons
    assert reasons == listed


# --- the custom keyword and type checker --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("id", "job-1", True),
        ("id", b"job-1", False),  # x-msgpack-type str refuses bin
        ("image", b"\xff\xd8", True),
        ("image", "/9g=", False),  # x-msgpack-type bin refuses str
        ("text", None, True),  # nullable
        ("policy", None, True),  # nullable
        ("id", None, False),  # not nullable
        ("image", b"", False),  # minLength counts bytes
    ],
)
def test_wire_validator_enforces_x_msgpack_type(
    contract: Any, field: str, value: Any, valid: bool
) -> None:
    job = {"v": 1, "id": "job-1", "image": b"\xff\xd8", field: value}
    assert (contract.errors("moderation-job", job) == []) is valid


@pytest.mark.parametrize(
    ("fields", "valid"),
    [
        ({"image": b"\xff\xd8"}, True),  # image-only
        ({"image": b"\xff\xd8", "text": None}, True),
        ({"image": b"\xff\xd8", "text": "  "}, True),  # a blank caption beside an image
        ({"text": "hello"}, True),  # text-only
        ({"image": None, "text": "hello"}, True),  # image nullable
        ({"text": " \t\n\u3000 hi "}, True),
        ({}, False),  # neither
        ({"image": None}, False),
        ({"text": None}, False),
        ({"image": None, "text": None}, False),
        ({"text": ""}, False),  # blank text alone is nothing
        ({"text": " \t\n\u3000"}, False),
        ({"text": b"hello"}, False),  # bin where str is due
    ],
    ids=repr,
)
def test_job_needs_an_image_or_a_non_blank_text_in_schema_and_codec(
    contract: Any, fields: dict[str, Any], valid: bool
) -> None:
    job = {"v": 1, "id": "job-1", **fields}
    assert (contract.errors("moderation-job", job) == []) is valid
    payload = msgpack.packb(job, use_bin_type=True)
    if valid:
        decoded = decode_moderation_job(payload)
        assert decoded.image == fields.get("image")
        assert decoded.text == fields.get("text")
    else:
        with pytest.raises(SchemaViolation):
            decode_moderation_job(payload)


def test_wire_validator_applies_max_length_to_bytes(contract: Any) -> None:
    schema = {"type": "string", "x-msgpack-type": "bin", "maxLength": 3}
    validator = type(contract.validator("moderation-job"))(schema)
    assert validator.is_valid(b"abc")
    assert not validator.is_valid(b"abcd")


def test_wire_validator_reads_patterns_with_ecma_end_anchor(contract: Any) -> None:
    assert contract.ecma_pattern("^[a-z]+$") == r"^[a-z]+\Z"
    job = {"v": 1, "id": "j", "image": b"x"}
    assert contract.errors("moderation-job", {**job, "policy": "strict"}) == []
    assert contract.errors("moderation-job", {**job, "policy": "strict\n"}) != []


# --- examples -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_is_valid_on_the_msgpack_side(contract: Any, path: Path) -> None:
    name = contract.name_for_example(path)
    wire = contract.to_wire(name, _load(path))
    assert contract.errors(name, wire) == []


@pytest.mark.parametrize("path", BIN_EXAMPLES, ids=_ids(BIN_EXAMPLES))
def test_example_json_view_is_refused_as_msgpack_where_bin_is_due(
    contract: Any, path: Path
) -> None:
    """Guard for the conversion itself: base64 text where bytes are due must be refused."""
    name = contract.name_for_example(path)
    raw = _load(path)
    assert contract.to_wire(name, raw) != raw
    assert contract.errors(name, raw) != []


@pytest.mark.parametrize("path", JOB_EXAMPLES, ids=_ids(JOB_EXAMPLES))
def test_job_example_decodes_with_the_codec(contract: Any, path: Path) -> None:
    wire = contract.to_wire("moderation-job", _load(path))
    job = decode_moderation_job(msgpack.packb(wire, use_bin_type=True))
    assert job == ModerationJob(
        id=wire["id"],
        image=wire.get("image"),
        text=wire.get("text"),
        policy=wire.get("policy") or "default",
        deadline_ms=wire.get("deadline_ms"),
    )


def test_examples_cover_text_only_jobs_and_multimodal_results() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"moderation-job.text-only.json", "moderation-result.multimodal.json"} <= names
    text_only = _load(SCHEMAS / "examples" / "moderation-job.text-only.json")
    job = decode_moderation_job(msgpack.packb(text_only, use_bin_type=True))
    assert job.image is None and job.text == text_only["text"]
    multimodal = _load(SCHEMAS / "examples" / "moderation-result.multimodal.json")
    assert multimodal["rule"] and multimodal["models"]
    for path in RESULT_EXAMPLES:  # the open_nsfw-only results keep their v1 shape
        if path.name != "moderation-result.multimodal.json":
            assert not {"rule", "models"} & set(_load(path)), path.name


def _result_from_example(doc: dict[str, Any]) -> ModerationResult:
    src = doc.get("source")
    return ModerationResult(
        id=doc["id"],
        status=Status(doc["status"]),
        policy=doc["policy"],
        model_id=doc["model_id"],
        engine_hash=doc["engine_hash"],
        verdict=Verdict(doc["verdict"]) if "verdict" in doc else None,
        scores=doc["scores"],
        timings_ms=doc["timings_ms"],
        error=doc.get("error"),
        source=SourceRef(src["topic"], src["partition"], src["offset"]) if src else None,
        rule=doc.get("rule"),
        models=tuple(doc.get("models", ())),
    )


@pytest.mark.parametrize("path", RESULT_EXAMPLES, ids=_ids(RESULT_EXAMPLES))
def test_result_to_dict_reproduces_the_result_example(path: Path) -> None:
    doc = _load(path)
    assert result_to_dict(_result_from_example(doc)) == doc


@pytest.mark.parametrize(
    "result",
    [
        ModerationResult(
            id="job-1", status=Status.OK, policy="default", model_id="open_nsfw",
            engine_hash="onnxruntime-1.32.0-864bb37bf886", verdict=Verdict.REVIEW,
            scores={"sfw": 0.7, "nsfw": 0.3},
            timings_ms={"queue": 1.23456, "decode": 2.0, "infer": 30.0, "total": 33.3},
            source=SourceRef("moderation.jobs", 0, 0),
        ),
        ModerationResult(
            id="job-2", status=Status.EXPIRED, policy="default", model_id="open_nsfw",
            engine_hash="onnxruntime-1.32.0-864bb37bf886",
            timings_ms={"queue": 250.0, "total": 250.0},
            error="deadline passed", source=SourceRef("moderation.jobs", 5, 99),
        ),
        ModerationResult(
            id="job-3", status=Status.ERROR, policy="strict", model_id="open_nsfw",
            engine_hash="e", error="onnxruntime run failed",
        ),
        ModerationResult(
            id="job-4", status=Status.OK, policy="captions", model_id="minilm_l6_v2",
            engine_hash="e", verdict=Verdict.BLOCK,
            scores={"text.violence": 0.93, "text.scam": 0.01},
            rule="block:text.violence", models=("text",),
        ),
    ],
    ids=["ok-with-verdict", "expired-without-verdict", "error-minimal", "ok-multimodal"],
)
def test_result_built_by_the_codec_is_valid(contract: Any, result: ModerationResult) -> None:
    assert contract.errors("moderation-result", result_to_dict(result)) == []


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(Status.OK, None), (Status.EXPIRED, Verdict.ALLOW), (Status.ERROR, Verdict.BLOCK)],
)
def test_result_schema_ties_verdict_to_status_ok(
    contract: Any, status: Status, verdict: Verdict | None
) -> None:
    result = ModerationResult(id="j", status=status, policy="default", model_id="m",
                              engine_hash="e", verdict=verdict)
    assert contract.errors("moderation-result", result_to_dict(result)) != []


@pytest.mark.parametrize(
    "change",
    [
        {"rule": None},  # models without the rule that used them
        {"models": ()},  # a rule without the models it read
        {"status": Status.EXPIRED, "verdict": None},  # a rule needs a verdict, hence ok
        {"rule": ""},
        {"models": ("text", "text")},
        {"models": ("gpt",)},
    ],
    ids=repr,
)
def test_result_schema_refuses_inconsistent_rule_and_models(
    contract: Any, change: dict[str, Any]
) -> None:
    base = dict(id="j", status=Status.OK, policy="ads", model_id="m", engine_hash="e",
                verdict=Verdict.ALLOW, rule="allow", models=("open_nsfw", "text"))
    assert contract.errors("moderation-result", result_to_dict(ModerationResult(**base))) == []
    bad = result_to_dict(ModerationResult(**{**base, **change}))
    assert contract.errors("moderation-result", bad) != []


# --- DLQ records --------------------------------------------------------------------------------


def _dlq_wire(record: Any) -> dict[str, Any]:
    """A DeadLetter as the schema's JSON view {key, value, headers: [[name, value]]}."""
    return {
        "key": record.key,
        "value": record.value,
        "headers": [[name, value] for name, value in record.headers],
    }


@pytest.mark.parametrize("timestamp_ms", [1_796_000_000_000, None])
def test_dead_letter_record_is_valid(contract: Any, timestamp_ms: int | None) -> None:
    src = SourceRecord(
        topic="moderation.jobs", partition=2, offset=41, key=b"job-7", value=b"\xc1",
        headers=[("traceparent", b"00-abc-01"), ("empty", None)], timestamp_ms=timestamp_ms,
    )
    record = dead_letter(src, MalformedPayload("not a msgpack document"), "trt-worker-test")
    assert contract.errors("dlq-record", _dlq_wire(record)) == []


def test_dead_letter_record_with_null_key_and_value_is_valid(contract: Any) -> None:
    src = SourceRecord("t", 0, 0, key=None, value=None, headers=None, timestamp_ms=None)
    record = dead_letter(src, SchemaViolation("empty"), "w")
    assert contract.errors("dlq-record", _dlq_wire(record)) == []


def test_dlq_schema_refuses_a_record_missing_a_required_header(contract: Any) -> None:
    src = SourceRecord("t", 0, 0, key=b"k", value=b"v", headers=None, timestamp_ms=None)
    wire = _dlq_wire(dead_letter(src, SchemaViolation("x"), "w"))
    wire["headers"] = [h for h in wire["headers"] if h[0] != "ktw.dlq.source.offset"]
    assert contract.errors("dlq-record", wire) != []


@pytest.mark.parametrize("path", DLQ_EXAMPLES, ids=_ids(DLQ_EXAMPLES))
def test_dlq_example_is_what_the_worker_writes_for_its_payload(
    contract: Any, path: Path
) -> None:
    """Decode the example's original value, dead-letter it, and get the example's headers."""
    wire = contract.to_wire("dlq-record", _load(path))
    ours = {name: value for name, value in wire["headers"] if name.startswith("ktw.dlq.")}
    originals = [(n, v) for n, v in wire["headers"]
                 if not n.startswith(("ktw.dlq.", "__connect.errors."))]
    with pytest.raises(JobRejected) as info:
        decode_moderation_job(wire["value"])
    src = SourceRecord(
        topic=ours["ktw.dlq.source.topic"].decode(),
        partition=int(ours["ktw.dlq.source.partition"]),
        offset=int(ours["ktw.dlq.source.offset"]),
        key=wire["key"], value=wire["value"], headers=originals,
        timestamp_ms=int(ours["ktw.dlq.source.timestamp"]),
    )
    record = dead_letter(src, info.value, ours["ktw.dlq.worker"].decode())
    assert record.key == wire["key"]
    assert record.value == wire["value"]
    # Same headers; the schema does not fix the order of the ktw.dlq.* block.
    assert sorted(record.headers) == sorted((n, v) for n, v in wire["headers"])
    assert record.headers[: len(originals)] == originals


# --- mutated jobs: both the schema and the codec must refuse them -------------------------------


def _full() -> dict[str, Any]:
    path = SCHEMAS / "examples" / "moderation-job.full.json"
    doc = json.loads(path.read_text())
    doc["image"] = base64.b64decode(doc["image"])
    return doc


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda d: {k: v for k, v in d.items() if k != key}


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda d: {**d, key: value}


Mutation = tuple[str, Callable[[dict[str, Any]], Any], type[JobRejected]]
MUTATIONS: list[Mutation] = [
    ("drop-v", _drop("v"), SchemaViolation),
    ("drop-id", _drop("id"), SchemaViolation),
    ("drop-image-and-text", lambda d: _drop("text")(_drop("image")(d)), SchemaViolation),
    ("image=null-text=null", lambda d: {**d, "image": None, "text": None}, SchemaViolation),
    ('drop-image-text=""', lambda d: {**_drop("image")(d), "text": ""}, SchemaViolation),
    ("drop-image-blank-text", lambda d: {**_drop("image")(d), "text": " \t\n"}, SchemaViolation),
    ("image=null-text-as-bin", lambda d: {**d, "image": None, "text": b"hi"}, SchemaViolation),
    ("v=2", _set("v", 2), UnsupportedVersion),
    ("v=0", _set("v", 0), UnsupportedVersion),
    ('v="1"', _set("v", "1"), SchemaViolation),
    ("v=true", _set("v", True), SchemaViolation),
    ("id=123", _set("id", 123), SchemaViolation),
    ('id=""', _set("id", ""), SchemaViolation),
    ("id-257-chars", _set("id", "x" * 257), SchemaViolation),
    ("id-as-bin", _set("id", b"job"), SchemaViolation),
    ("image-as-str", _set("image", "/9j/4AAQ"), SchemaViolation),
    ("image-empty", _set("image", b""), SchemaViolation),
    ("text-as-bin", _set("text", b"caption"), SchemaViolation),
    ("text-100001-chars", _set("text", "t" * 100_001), SchemaViolation),
    ('policy="Bad Policy!"', _set("policy", "Bad Policy!"), SchemaViolation),
    ("policy-65-chars", _set("policy", "p" * 65), SchemaViolation),
    ("policy=7", _set("policy", 7), SchemaViolation),
    ("deadline_ms=-1", _set("deadline_ms", -1), SchemaViolation),
    ('deadline_ms="soon"', _set("deadline_ms", "soon"), SchemaViolation),
    ("deadline_ms=2**63", _set("deadline_ms", 2**63), SchemaViolation),
    ("deadline_ms=true", _set("deadline_ms", True), SchemaViolation),
    ("unknown-field", _set("priority", 5), SchemaViolation),
    ("top-level-list", lambda d: list(d.values()), MalformedPayload),
    ("top-level-int", lambda d: 1, MalformedPayload),
]


def test_the_unmutated_base_is_accepted_by_both(contract: Any) -> None:
    doc = _full()
    assert contract.errors("moderation-job", doc) == []
    decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)


@pytest.mark.parametrize(
    "mutate",
    [_drop("image"), _set("image", None), _drop("text"), _set("text", None)],
    ids=["drop-image", "image=null", "drop-text", "text=null"],
)
def test_dropping_one_of_image_and_text_is_accepted_by_both(
    contract: Any, mutate: Callable[[dict[str, Any]], Any]
) -> None:
    doc = mutate(_full())
    assert contract.errors("moderation-job", doc) == []
    job = decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)
    assert (job.image is None) is (doc.get("image") is None)
    assert (job.text is None) is (doc.get("text") is None)


@pytest.mark.parametrize(
    ("mutate", "expected"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_mutated_job_is_rejected_by_schema_and_codec(
    contract: Any,
    mutate: Callable[[dict[str, Any]], Any],
    expected: type[JobRejected],
) -> None:
    doc = mutate(_full())
    assert contract.errors("moderation-job", doc) != [], "schema accepted the mutation"
    payload = msgpack.packb(doc, use_bin_type=True)
    with pytest.raises(JobRejected) as info:
        decode_moderation_job(payload, NO_OPERATIONAL_LIMITS)
    assert type(info.value) is expected


def test_policy_with_trailing_newline_is_rejected_by_schema_and_codec(
    contract: Any,
) -> None:
    doc = {**_full(), "policy": "default\n"}
    assert contract.errors("moderation-job", doc) != []
    with pytest.raises(SchemaViolation):
        decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)


# --- property: whatever the codec accepts, the contract accepts ---------------------------------

_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
# Policy names that end in "\n" are the known bug above; keep the property about the rest.
_POLICY = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,63}", fullmatch=True),
    st.text(max_size=70).filter(lambda s: not s.endswith("\n")),
)
_PLAUSIBLE = {
    "v": st.just(1),
    "id": st.text(min_size=1, max_size=300),
    "image": st.binary(min_size=1, max_size=64),
    "text": st.one_of(st.none(), st.text(max_size=50),
                      st.text(alphabet=" \t\n\u3000\u00a0x", max_size=4)),  # blank or nearly
    "policy": st.one_of(st.none(), _POLICY),
    "deadline_ms": st.one_of(st.none(), st.integers(min_value=-5, max_value=2**64 - 1)),
}


@st.composite
def _near_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """Maps close to a valid job: each field absent, plausible (often valid) or arbitrary."""
    doc: dict[str, Any] = {}
    for key, plausible in _PLAUSIBLE.items():
        mode = draw(st.sampled_from(("absent", "any", *["plausible"] * 8)))
        if mode != "absent":
            doc[key] = draw(plausible if mode == "plausible" else _ANY_VALUE)
    if draw(st.integers(0, 9)) == 0:
        doc[draw(st.text(max_size=8))] = draw(_ANY_VALUE)
    return doc


@settings(max_examples=300, deadline=None, database=None)
@given(doc=_near_jobs())
def test_codec_never_accepts_a_job_the_schema_refuses(contract: Any, doc: Any) -> None:
    try:
        decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)
    except JobRejected:
        return
    assert contract.errors("moderation-job", doc) == []
