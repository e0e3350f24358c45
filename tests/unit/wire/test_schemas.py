"""The wire contract: schemas/*.json, their examples, and the hand-written codec agree.

The schema files use standard Draft 2020-12 keywords only (any strict validator compiles them:
tests/integration/contracts/test_schemas_ajv.py runs ajv's strict mode on them). Each example
is valid as JSON (bin as base64 text) and on its msgpack side (bin as bytes, checked through
its JSON view: tests/contract.py); job examples decode with the codec, result examples are what
the codec writes, and mutated jobs are refused by both the schema and the codec, in both
contract versions.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_specifications
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tests.contract import REPO, is_bin
from worker.config import load_config
from worker.config.policies import LABEL_NAME, info_labels
from worker.exceptions import (
    JobRejected,
    MalformedPayload,
    SchemaViolation,
    UnsupportedVersion,
)
from worker.kafka import producer_settings
from worker.tasks.moderation.served_policies import effective_policies
from worker.wire import moderation_codec as codec
from worker.wire.dlq import dead_letter
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job, result_to_dict
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.records import SourceRecord, SourceRef

SCHEMAS = REPO / "schemas"
EXAMPLES = sorted((SCHEMAS / "examples").glob("*.json"))
JOB_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("moderation-job.")]
RESULT_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("moderation-result.")]
DLQ_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("dlq-record.")]
# Examples with a bin field (a text-only job has none, so its JSON view is its msgpack side).
BIN_EXAMPLES = [p for p in JOB_EXAMPLES if "image" in json.loads(p.read_text())] + DLQ_EXAMPLES
# The contract never limits sizes below the schema's maxima; operational limits do.
NO_OPERATIONAL_LIMITS = DecodeLimits(max_image_bytes=codec.MAX_IMAGE_BYTES,
                                     max_text_chars=codec.MAX_TEXT_CHARS)
# The msgpack documents (the DLQ record is a Kafka record: bytes, not msgpack).
MSGPACK_SCHEMAS = ["generation-job", "generation-job.v2", "generation-result",
                   "generation-result.v2", "moderation-job", "moderation-job.v2",
                   "moderation-result", "moderation-result.v2"]
JOB = {1: "moderation-job", 2: "moderation-job.v2"}
RESULT = {1: "moderation-result", 2: "moderation-result.v2"}
EXAMPLE_CONFIG = load_config(REPO / "deploy" / "config.example.toml")


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _version(name: str) -> int:
    return int(name.rsplit(".v", 1)[1]) if ".v" in name else 1


# --- the schema files: standard keywords only, prose that states the transport ---------------

# Every keyword of the Draft 2020-12 vocabularies (core, applicator, unevaluated, validation,
# meta-data, format-annotation, content), read from the meta-schemas jsonschema ships.
_META = "https://json-schema.org/draft/2020-12/schema"
DRAFT_2020_12_KEYWORDS = frozenset(
    keyword
    for ref in jsonschema_specifications.REGISTRY.contents(_META)["allOf"]
    for keyword in jsonschema_specifications.REGISTRY.contents(
        "https://json-schema.org/draft/2020-12/" + ref["$ref"])["properties"])
# Where a keyword's value holds subschemas: one, a list of them, or a map of name -> subschema.
_ONE = {"additionalProperties", "items", "contains", "propertyNames", "if", "then", "else",
        "not", "unevaluatedItems", "unevaluatedProperties", "contentSchema"}
_LIST = {"prefixItems", "allOf", "anyOf", "oneOf"}
_MAP = {"properties", "patternProperties", "$defs", "dependentSchemas"}


def subschemas(schema: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in a schema document, walking keywords (never data such as a
    ``const``, nor property names as if they were keywords)."""
    if not isinstance(schema, dict):
        return  # a boolean schema
    yield where, schema
    for keyword, value in schema.items():
        if keyword in _ONE:
            yield from subschemas(value, f"{where}/{keyword}")
        elif keyword in _LIST:
            for i, sub in enumerate(value):
                yield from subschemas(sub, f"{where}/{keyword}/{i}")
        elif keyword in _MAP:
            for name, sub in value.items():
                yield from subschemas(sub, f"{where}/{keyword}/{name}")


def unknown_keywords(schema: dict[str, Any]) -> list[str]:
    return [f"{where}: {k}" for where, sub in subschemas(schema) for k in sub
            if k not in DRAFT_2020_12_KEYWORDS]


def test_every_example_has_a_schema_and_every_schema_an_example(contract: Any) -> None:
    assert EXAMPLES, "schemas/examples/ is empty"
    used = {contract.name_for_example(p) for p in EXAMPLES}
    assert used == set(contract.names)
    assert set(MSGPACK_SCHEMAS) | {"dlq-record"} == set(contract.names)


@pytest.mark.parametrize("name", [*MSGPACK_SCHEMAS, "dlq-record"])
def test_schema_is_a_valid_draft_2020_12_schema(contract: Any, name: str) -> None:
    schema = contract.schema(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("name", [*MSGPACK_SCHEMAS, "dlq-record"])
def test_schema_uses_no_keyword_outside_draft_2020_12(contract: Any, name: str) -> None:
    assert unknown_keywords(contract.schema(name)) == []


def test_the_keyword_check_finds_custom_keywords_anywhere() -> None:
    """What the check above refused in the v1 files (x-msgpack-type, x-dlq-headers)."""
    assert {"type", "contentEncoding", "prefixItems", "$defs", "description"} <= (
        DRAFT_2020_12_KEYWORDS)
    schema = {"type": "object", "x-dlq-headers": {"a": "b"},
              "properties": {"x-named-property-is-fine": {"type": "string"},
                             "id": {"type": "string", "x-msgpack-type": "str"}},
              "anyOf": [{"required": ["id"]}, {"if": {"const": {"x-data": 1}}, "then": {
                  "items": {"x-deep": True}}}]}
    assert unknown_keywords(schema) == [
        "#: x-dlq-headers", "#/properties/id: x-msgpack-type", "#/anyOf/1/then/items: x-deep"]


@pytest.mark.parametrize("name", [*MSGPACK_SCHEMAS, "dlq-record"])
def test_schema_id_names_its_document_and_version(contract: Any, name: str) -> None:
    document = name.split(".")[0]
    assert contract.schema(name)["$id"] == (
        f"https://kafka-trt-worker.dev/schemas/{document}/v{_version(name)}")


def _msgpack_type(schema: dict[str, Any]) -> str:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    main = [t for t in types if t != "null"]
    assert len(main) == 1, f"one type (and maybe null): {types}"
    if main == ["string"]:
        return "msgpack bin" if is_bin(schema) else "msgpack str"
    return {"integer": "msgpack integer", "number": "msgpack float", "boolean": "msgpack bool",
            "object": "msgpack map", "array": "msgpack array"}[main[0]]


def _fields(schema: dict[str, Any], where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """The schema and its fields (properties, map values, array items), not the branches of
    anyOf/if/then/...: the typed places of the document."""
    yield where, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _fields(sub, f"{where}/{name}")
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), dict):
            yield from _fields(schema[key], f"{where}/{key}")


@pytest.mark.parametrize("name", MSGPACK_SCHEMAS)
def test_every_field_states_its_msgpack_type_in_its_description(contract: Any, name: str
                                                               ) -> None:
    """No custom keyword carries the msgpack type any more: the prose does, and must match
    what the standard keywords say (contentEncoding base64 is bin, other strings str, ...)."""
    wrong = []
    for where, sub in _fields(contract.schema(name)):
        text = sub.get("description", "")
        if where == "#":
            assert "msgpack map" in text
            continue
        wanted = [_msgpack_type(sub)] + (["nil"] if "null" in str(sub["type"]) else [])
        wrong += [f"{where}: {w!r}" for w in wanted if w not in text]
    assert wrong == []


@pytest.mark.parametrize("name", [*MSGPACK_SCHEMAS, "dlq-record"])
def test_top_level_description_states_types_compression_key_partitioner_isolation(
        contract: Any, name: str) -> None:
    text = contract.schema(name)["description"]
    for part in ("Key:", "Compression:", "Partitioner:", "Isolation level:", "read_committed",
                 "murmur2_random", "kafka.compression, default \"none\"", "Topic:"):
        assert part in text, part
    assert "msgpack" in text
    assert f"v{_version(name)}" in text or name == "dlq-record"


def test_the_transport_prose_is_what_the_producer_does() -> None:
    """The facts every schema states, checked against the worker's producer settings."""
    conf = producer_settings(load_config())
    assert conf["compression.type"] == "none"
    assert conf["partitioner"] == "murmur2_random"


@pytest.mark.parametrize("document", ["moderation-job", "generation-job"])
def test_v2_differs_from_v1_only_in_its_version(contract: Any, document: str) -> None:
    """Jobs kept their fields in v2: only v and the prose moved."""
    def versionless(schema: dict[str, Any]) -> dict[str, Any]:
        s = json.loads(json.dumps(schema))
        for key in ("$id", "title", "description"):
            s.pop(key)
        s["properties"].pop("v")
        return s

    v1, v2 = contract.schema(document), contract.schema(f"{document}.v2")
    assert (v1["properties"]["v"]["const"], v2["properties"]["v"]["const"]) == (1, 2)
    assert versionless(v1) == versionless(v2)


def test_generation_result_v2_is_v1_plus_moderation(contract: Any) -> None:
    """v2 generation results keep every v1 field as it was and add moderation only: the status
    blocked, prompt_check, and an image's verdict, scores, rule and quarantine."""
    v1, v2 = contract.schema("generation-result"), contract.schema("generation-result.v2")
    added = {"prompt_check"}
    assert set(v2["properties"]) - set(v1["properties"]) == added
    assert set(v2["properties"]["status"]["enum"]) - set(v1["properties"]["status"]["enum"]) \
        == {"blocked"}
    i1, i2 = (s["properties"]["images"]["items"]["properties"] for s in (v1, v2))
    assert set(i2) - set(i1) == {"verdict", "scores", "rule", "quarantine"}
    assert {k: i2[k] for k in i1} == i1
    same = set(v1["properties"]) - {"v", "status", "images"}
    assert {k: v2["properties"][k] for k in same} == {k: v1["properties"][k] for k in same}


def _base64_length(n: int) -> int:
    return 4 * math.ceil(n / 3)


@pytest.mark.parametrize("name", ["moderation-job", "moderation-job.v2"])
def test_codec_constants_mirror_the_job_schema(contract: Any, name: str) -> None:
    props = contract.schema(name)["properties"]
    assert props["id"]["maxLength"] == codec.MAX_ID_CHARS
    assert props["text"]["maxLength"] == codec.MAX_TEXT_CHARS
    # maxLength counts the JSON view's base64 text; the codec counts bytes.
    assert props["image"]["maxLength"] == _base64_length(codec.MAX_IMAGE_BYTES)
    assert str(codec.MAX_IMAGE_BYTES) in props["image"]["description"]
    assert props["policy"]["pattern"] == codec.POLICY_NAME.pattern
    assert props["deadline_ms"]["maximum"] == codec.INT64_MAX
    assert props["v"]["const"] == _version(name)
    assert set(props) == codec.JOB_FIELDS
    image_branch, text_branch = contract.schema(name)["anyOf"]
    assert image_branch["required"] == ["image"] and text_branch["required"] == ["text"]
    assert text_branch["properties"]["text"]["pattern"] == codec.TEXT_PRESENT.pattern


def test_v2_result_schema_knows_the_label_and_model_names() -> None:
    from worker.tasks.moderation.models import MODELS

    schema = json.loads((SCHEMAS / "moderation-result.v2.schema.json").read_text())
    label = LABEL_NAME.pattern.removeprefix("^").removesuffix("$")
    models = "|".join(MODELS)
    assert schema["properties"]["scores"]["propertyNames"]["pattern"] == (
        f"^({models})\\.{label}$")
    assert schema["properties"]["models"]["items"]["enum"] == list(MODELS)
    assert f"(block|review):({models})\\.{label}" in schema["properties"]["rule"]["pattern"]


def _dlq_reasons(contract: Any) -> set[str]:
    for clause in contract.schema("dlq-record")["properties"]["headers"]["allOf"]:
        text = clause["contains"]["description"]
        if text.startswith("ktw.dlq.error.reason:"):
            listed = re.search(r"one of: ([a-z_, ]+)\.", text)
            assert listed is not None
            return {r.strip() for r in listed.group(1).split(",")}
    raise AssertionError("no ktw.dlq.error.reason clause")


def test_every_dlq_reason_is_listed_in_the_dlq_schema(contract: Any) -> None:
    """Each JobRejected subclass's reason code is documented for DLQ consumers."""
    import worker.tasks.generation.intake  # noqa: F401 - its JobRejected subclasses

    def subclasses(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    reasons = {cls.reason for cls in subclasses(JobRejected)
               if cls.__module__.startswith("worker.")}
    # Passed as reason= rather than by a class: worker/tasks/batched.py (no engine profile).
    reasons.add("no_profile")
    assert {"nothing_to_score", "text_too_long", "unsupported_size"} <= reasons
    assert _dlq_reasons(contract) == reasons


# --- the msgpack side, checked through the JSON view -------------------------------------------


@pytest.mark.parametrize("name", list(JOB.values()))
@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("id", "job-1", True),
        ("id", b"job-1", False),  # bin where a str is due
        ("image", b"\xff\xd8", True),
        ("image", "/9g=", False),  # a str (base64 text) where bin is due
        ("text", None, True),  # nullable
        ("policy", None, True),  # nullable
        ("id", None, False),  # not nullable
        ("image", b"", False),  # minLength: the empty image is the empty base64 text
        ("deadline_ms", 5, True),
        ("deadline_ms", 5.0, False),  # a msgpack float where an integer is due
        ("v", "1", False),
    ],
)
def test_msgpack_types_are_checked_through_the_json_view(
    contract: Any, name: str, field: str, value: Any, valid: bool
) -> None:
    job = {"v": _version(name), "id": "job-1", "image": b"\xff\xd8", field: value}
    assert (contract.errors(name, job) == []) is valid


def test_a_float_version_is_refused_by_schema_and_codec(contract: Any) -> None:
    """JSON Schema alone counts 1.0 as the integer 1; msgpack (and the codec) do not."""
    job = {"v": 1.0, "id": "j", "image": b"x"}
    # JSON alone: 1.0 passes "type": "integer", "const": 1.
    assert contract.json_errors("moderation-job", {**job, "image": "eA=="}) == []
    assert contract.errors("moderation-job", job) != []
    with pytest.raises(SchemaViolation, match="'v'"):
        decode_moderation_job(msgpack.packb(job, use_bin_type=True))


def test_the_json_view_and_the_wire_side_are_inverse(contract: Any) -> None:
    job = {"v": 2, "id": "j", "image": b"\x00\xff\x10", "text": "hi"}
    view = contract.to_json("moderation-job.v2", job)
    assert view == {**job, "image": base64.b64encode(b"\x00\xff\x10").decode()}
    assert contract.to_wire("moderation-job.v2", view) == job


@pytest.mark.parametrize("name", list(JOB.values()))
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
    contract: Any, name: str, fields: dict[str, Any], valid: bool
) -> None:
    job = {"v": _version(name), "id": "job-1", **fields}
    assert (contract.errors(name, job) == []) is valid
    payload = msgpack.packb(job, use_bin_type=True)
    if valid:
        decoded = decode_moderation_job(payload)
        assert decoded.image == fields.get("image")
        assert decoded.text == fields.get("text")
        assert decoded.schema_version == _version(name)
    else:
        with pytest.raises(SchemaViolation):
            decode_moderation_job(payload)


def test_patterns_are_read_with_the_ecma_end_anchor(contract: Any) -> None:
    assert contract.ecma_pattern("^[a-z]+$") == r"^[a-z]+\Z"
    job = {"v": 1, "id": "j", "image": b"x"}
    assert contract.errors("moderation-job", {**job, "policy": "strict"}) == []
    assert contract.errors("moderation-job", {**job, "policy": "strict\n"}) != []


# --- examples -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_is_valid_as_json(contract: Any, path: Path) -> None:
    assert contract.json_errors(contract.name_for_example(path), _load(path)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_is_valid_on_the_msgpack_side(contract: Any, path: Path) -> None:
    name = contract.name_for_example(path)
    doc = _load(path)
    wire = contract.to_wire(name, doc)
    assert contract.errors(name, wire) == []
    assert contract.to_json(name, wire) == doc  # its base64 is the canonical one


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
    name = contract.name_for_example(path)
    wire = contract.to_wire(name, _load(path))
    job = decode_moderation_job(msgpack.packb(wire, use_bin_type=True))
    assert job == ModerationJob(
        id=wire["id"],
        image=wire.get("image"),
        text=wire.get("text"),
        policy=wire.get("policy") or "default",
        deadline_ms=wire.get("deadline_ms"),
        schema_version=wire["v"],
    )


def test_examples_cover_both_versions_text_only_jobs_and_every_result_form() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"moderation-job.text-only.json", "moderation-job.v2.text-only.json",
            "moderation-job.v2.image.json", "moderation-result.multimodal.json",
            "moderation-result.v2.ok.json", "moderation-result.v2.text-only.json",
            "moderation-result.v2.expired.json", "generation-job.v2.minimal.json",
            "generation-result.v2.ok.json"} <= names
    for path in RESULT_EXAMPLES:
        doc = _load(path)
        if doc["v"] == 2:  # one shape: rule and models always there
            assert {"rule", "models"} <= set(doc), path.name
        elif path.name != "moderation-result.multimodal.json":  # v1, open_nsfw-only
            assert not {"rule", "models"} & set(doc), path.name


def _engine_hashes(doc: dict[str, Any]) -> list[str]:
    hashes = doc.get("engine_hashes", {}).values() if "engine_hashes" in doc else [
        doc["engine_hash"]]
    return [h for joined in hashes for part in joined.split("+") for h in part.split("|")]


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "result" in p.name],
                         ids=_ids([p for p in EXAMPLES if "result" in p.name]))
def test_example_engine_hashes_have_the_form_the_worker_sends(path: Path) -> None:
    """The default worker loads engines through its engine cache, so a runner's hash is
    ``<backend>-<12 hex digits of the cache key>`` (engines/backends: OrtRunner, TorchRunner)."""
    for h in _engine_hashes(_load(path)):
        assert re.fullmatch(r"(onnxruntime|torch|tensorrt)-[0-9a-f]{12}", h), h


def _expected_score_keys(policy: str, models: list[str]) -> tuple[set[str], set[str]]:
    """(keys a result of ``policy`` must have, informational keys it may have) under the
    example config, for the models that ran."""
    settings_ = effective_policies(EXAMPLE_CONFIG)[policy]
    must = {f"{m}.{label}" for label in settings_.labels for m in settings_.scorers(label)
            if m in models}
    may = {f"{m}.{info}" for m in models for info in info_labels(m)}
    return must, may


@pytest.mark.parametrize("path", [*JOB_EXAMPLES, *RESULT_EXAMPLES],
                         ids=_ids([*JOB_EXAMPLES, *RESULT_EXAMPLES]))
def test_example_policy_is_one_the_example_config_serves(path: Path) -> None:
    """Every example names a policy of deploy/config.example.toml (the built-in 'default' is
    open_nsfw-only: a text-only job needs a policy with the text model), and a result's scores
    are that policy's, named as its version names them."""
    doc = _load(path)
    policies = effective_policies(EXAMPLE_CONFIG)
    policy = doc.get("policy") or "default"
    assert policy in policies
    if "image" not in doc and "status" not in doc:  # a text-only job
        assert "text" in policies[policy].models
    if doc.get("status") != "ok":
        return
    models = doc.get("models", ["open_nsfw"])
    must, may = _expected_score_keys(policy, models)
    keys = set(doc["scores"])
    if doc["v"] == 1 and "models" not in doc:  # v1, open_nsfw-only: plain labels
        keys = {f"open_nsfw.{k}" for k in keys}
    assert must <= keys <= must | may


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
        # A task leaves the rule unset when none decided; v2 writes that as "none".
        rule=doc.get("rule") if doc.get("rule") != "none" else None,
        models=tuple(doc.get("models", ())),
        schema_version=doc["v"],
    )


@pytest.mark.parametrize("path", RESULT_EXAMPLES, ids=_ids(RESULT_EXAMPLES))
def test_result_to_dict_reproduces_the_result_example(path: Path) -> None:
    doc = _load(path)
    assert result_to_dict(_result_from_example(doc)) == doc


# --- results the codec builds -------------------------------------------------------------------


def _r(**kw: Any) -> ModerationResult:
    base: dict[str, Any] = dict(id="job-1", status=Status.OK, policy="default",
                                model_id="open_nsfw", engine_hash="onnxruntime-864bb37bf886")
    return ModerationResult(**{**base, **kw})


V1_RESULTS = {
    "ok-with-verdict": _r(verdict=Verdict.REVIEW, scores={"sfw": 0.7, "nsfw": 0.3},
                          timings_ms={"queue": 1.23456, "decode": 2.0, "infer": 30.0,
                                      "total": 33.3},
                          source=SourceRef("moderation.jobs", 0, 0)),
    "expired-without-verdict": _r(status=Status.EXPIRED, timings_ms={"queue": 250.0,
                                                                     "total": 250.0},
                                  error="deadline passed",
                                  source=SourceRef("moderation.jobs", 5, 99)),
    "error-minimal": _r(status=Status.ERROR, policy="strict", engine_hash="e",
                        error="onnxruntime run failed"),
    "ok-multimodal": _r(policy="captions", model_id="minilm_l6_v2", engine_hash="e",
                        verdict=Verdict.BLOCK, scores={"text.violence": 0.93, "text.scam": 0.01},
                        rule="block:text.violence", models=("text",)),
}
V2_RESULTS = {
    "ok-open-nsfw": _r(verdict=Verdict.BLOCK, scores={"open_nsfw.sfw": 0.1,
                                                      "open_nsfw.nsfw": 0.9},
                       rule="block:open_nsfw.nsfw", models=("open_nsfw",), schema_version=2),
    "ok-allow": _r(verdict=Verdict.ALLOW, scores={"open_nsfw.sfw": 0.9, "open_nsfw.nsfw": 0.1},
                   rule="allow", models=("open_nsfw",), schema_version=2),
    "ok-consistency": _r(verdict=Verdict.REVIEW, policy="ads", rule="review:clip.consistency",
                         scores={"clip.neutral": 0.9, "clip.consistency": 0.05},
                         models=("clip",), schema_version=2),
    "expired": _r(status=Status.EXPIRED, timings_ms={"queue": 250.0, "total": 250.0},
                  error="deadline passed", schema_version=2),
    "error-no-model": _r(status=Status.ERROR, model_id="-", engine_hash="-", error="x",
                         schema_version=2),
}


@pytest.mark.parametrize("result", V1_RESULTS.values(), ids=V1_RESULTS.keys())
def test_v1_result_built_by_the_codec_is_valid(contract: Any, result: ModerationResult) -> None:
    assert contract.errors("moderation-result", result_to_dict(result)) == []
    assert contract.errors("moderation-result.v2", result_to_dict(result)) != []


@pytest.mark.parametrize("result", V2_RESULTS.values(), ids=V2_RESULTS.keys())
def test_v2_result_built_by_the_codec_is_valid(contract: Any, result: ModerationResult) -> None:
    doc = result_to_dict(result)
    assert contract.errors("moderation-result.v2", doc) == []
    assert contract.errors("moderation-result", doc) != []  # v is 2, and one shape only


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(Status.OK, None), (Status.EXPIRED, Verdict.ALLOW), (Status.ERROR, Verdict.BLOCK)],
)
def test_v1_result_schema_ties_verdict_to_status_ok(
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
def test_v1_result_schema_refuses_inconsistent_rule_and_models(
    contract: Any, change: dict[str, Any]
) -> None:
    base = dict(id="j", status=Status.OK, policy="ads", model_id="m", engine_hash="e",
                verdict=Verdict.ALLOW, rule="allow", models=("open_nsfw", "text"))
    assert contract.errors("moderation-result", result_to_dict(ModerationResult(**base))) == []
    bad = result_to_dict(ModerationResult(**{**base, **change}))
    assert contract.errors("moderation-result", bad) != []


def _v2_ok() -> dict[str, Any]:
    return result_to_dict(V2_RESULTS["ok-open-nsfw"])


def _v2_expired() -> dict[str, Any]:
    return result_to_dict(V2_RESULTS["expired"])


@pytest.mark.parametrize(
    ("base", "change"),
    [
        (_v2_ok, {"scores": {"sfw": 0.1, "nsfw": 0.9}}),  # v1's open_nsfw-only keys
        (_v2_ok, {"scores": {"open_nsfw.NSFW": 0.9}}),
        (_v2_ok, {"scores": {"gpt.nsfw": 0.9}}),
        (_v2_ok, {"rule": "none"}),  # ok names what decided
        (_v2_ok, {"rule": "allow"}),  # a block verdict comes from a block rule
        (_v2_ok, {"rule": "review:open_nsfw.nsfw"}),
        (_v2_ok, {"verdict": "allow"}),  # ... and an allow verdict from the allow rule
        (_v2_ok, {"rule": "block:nsfw"}),
        (_v2_ok, {"models": []}),
        (_v2_ok, {"models": ["open_nsfw", "open_nsfw"]}),
        (_v2_ok, {"rule": None}),  # rule is required in v2 (None: left out below)
        (_v2_ok, {"models": None}),
        (_v2_ok, {"verdict": None}),
        (_v2_expired, {"rule": "allow"}),  # not ok: no rule decided
        (_v2_expired, {"models": ["open_nsfw"]}),
        (_v2_expired, {"scores": {"open_nsfw.nsfw": 0.5}}),
        (_v2_expired, {"verdict": "allow"}),
        (_v2_expired, {"v": 1}),
    ],
    ids=lambda x: x.__name__ if callable(x) else repr(x),
)
def test_v2_result_schema_refuses_what_v2_does_not_write(
    contract: Any, base: Callable[[], dict[str, Any]], change: dict[str, Any]
) -> None:
    doc = base()
    assert contract.errors("moderation-result.v2", doc) == []
    doc.update(change)
    doc = {k: v for k, v in doc.items() if v is not None}
    assert contract.errors("moderation-result.v2", doc) != []


# --- DLQ records --------------------------------------------------------------------------------


def _dlq_wire(record: Any) -> dict[str, Any]:
    """A DeadLetter as the schema's view {key, value, headers: [[name, value]]}."""
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
    assert contract.errors("dlq-record", wire) == []
    wire["headers"] = [h for h in wire["headers"] if h[0] != "ktw.dlq.source.offset"]
    assert contract.errors("dlq-record", wire) != []


@pytest.mark.parametrize("version", [1, 2])
def test_model_id_and_engine_hash_describe_what_a_result_not_ok_carries(contract: Any,
                                                                       version: int) -> None:
    """An open_nsfw-only worker's expired result names its model and engine (the examples
    are what it writes); only image-and-text policies write '-'. The descriptions say both."""
    props = contract.schema(RESULT[version])["properties"]
    expired = json.loads((SCHEMAS / "examples" / (
        f"moderation-result{'.v2' if version == 2 else ''}.expired.json")).read_text())
    assert expired["status"] == "expired" and expired["model_id"] == "open_nsfw"
    assert expired["engine_hash"] != "-"
    assert "still names the model it serves (open_nsfw" in props["model_id"]["description"]
    assert "'-' under an image-and-text policy" in props["engine_hash"]["description"]


def test_the_reference_document_s_headers_field_is_described_as_the_count_it_is(
        contract: Any) -> None:
    """A by-reference dead letter's ``headers`` is how many headers the source record had
    (they are left out), not a list: the contract says so, as a reader must parse it."""
    from worker.wire.dlq import dead_letter_by_reference

    src = SourceRecord("t", 0, 5, key=b"k", value=b"v" * 10,
                       headers=[("a", b"1"), ("traceparent", b"00-abc-01"), ("b", None)],
                       timestamp_ms=None)
    ref = json.loads(dead_letter_by_reference(src, SchemaViolation("x"), "w").value or b"")
    assert type(ref["headers"]) is int and ref["headers"] == 3
    description = contract.schema("dlq-record")["description"]
    assert "headers (an integer, not a list: how many headers the source record had" in \
        description


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


def _full(version: int) -> dict[str, Any]:
    path = SCHEMAS / "examples" / "moderation-job.full.json"
    doc = json.loads(path.read_text())
    doc["image"] = base64.b64decode(doc["image"])
    doc["v"] = version
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
    ("v=3", _set("v", 3), UnsupportedVersion),
    ("v=0", _set("v", 0), UnsupportedVersion),
    ('v="1"', _set("v", "1"), SchemaViolation),
    ("v=true", _set("v", True), SchemaViolation),
    ("v=1.0", _set("v", 1.0), SchemaViolation),
    ("v=2.0", _set("v", 2.0), SchemaViolation),
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
    ("deadline_ms=1.5e12", _set("deadline_ms", 1.5e12), SchemaViolation),
    ("unknown-field", _set("priority", 5), SchemaViolation),
    ("top-level-list", lambda d: list(d.values()), MalformedPayload),
    ("top-level-int", lambda d: 1, MalformedPayload),
]


@pytest.mark.parametrize("version", [1, 2])
def test_the_unmutated_base_is_accepted_by_both(contract: Any, version: int) -> None:
    doc = _full(version)
    assert contract.errors(JOB[version], doc) == []
    job = decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)
    assert job.schema_version == version


@pytest.mark.parametrize("version", [1, 2])
def test_each_version_is_refused_by_the_other_versions_schema(contract: Any, version: int
                                                              ) -> None:
    assert contract.errors(JOB[3 - version], _full(version)) != []


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "mutate",
    [_drop("image"), _set("image", None), _drop("text"), _set("text", None)],
    ids=["drop-image", "image=null", "drop-text", "text=null"],
)
def test_dropping_one_of_image_and_text_is_accepted_by_both(
    contract: Any, mutate: Callable[[dict[str, Any]], Any], version: int
) -> None:
    doc = mutate(_full(version))
    assert contract.errors(JOB[version], doc) == []
    job = decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)
    assert (job.image is None) is (doc.get("image") is None)
    assert (job.text is None) is (doc.get("text") is None)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    ("mutate", "expected"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_mutated_job_is_rejected_by_schema_and_codec(
    contract: Any,
    mutate: Callable[[dict[str, Any]], Any],
    expected: type[JobRejected],
    version: int,
) -> None:
    doc = mutate(_full(version))
    assert contract.errors(JOB[version], doc) != [], "schema accepted the mutation"
    payload = msgpack.packb(doc, use_bin_type=True)
    with pytest.raises(JobRejected) as info:
        decode_moderation_job(payload, NO_OPERATIONAL_LIMITS)
    assert type(info.value) is expected


@pytest.mark.parametrize("version", [1, 2])
def test_policy_with_trailing_newline_is_rejected_by_schema_and_codec(
    contract: Any, version: int
) -> None:
    doc = {**_full(version), "policy": "default\n"}
    assert contract.errors(JOB[version], doc) != []
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
    "v": st.sampled_from([1, 2]),
    "id": st.text(min_size=1, max_size=300),
    "image": st.binary(min_size=1, max_size=64),
    "text": st.one_of(st.none(), st.text(max_size=50),
                      # blank, nearly, or blank only to Python (U+001C, U+0085) or ECMA (U+FEFF)
                      st.text(alphabet=" \t\n\u3000\u00a0\x1c\x85\ufeffx", max_size=4)),
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
        job = decode_moderation_job(msgpack.packb(doc, use_bin_type=True), NO_OPERATIONAL_LIMITS)
    except JobRejected:
        return
    assert contract.errors(JOB[job.schema_version], doc) == []
