"""msgpack <-> typed jobs and results, with precise validation errors.

The checks here are written by hand (not a JSON Schema validator at run time) because they run
once per Kafka record on the hot path; ``tests/unit/wire/test_schemas.py`` keeps them in
agreement with the JSON Schema files in ``schemas/`` on every example and on mutated examples.

Most jobs are decoded by msgspec (C) straight into a typed struct; a job msgspec or the few
checks after it do not accept goes through the msgpack path that names what is wrong, so a
refused job gets the same reason either way.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

import msgspec

from worker.exceptions import SchemaViolation, TextTooLong
from worker.wire.job_maps import NON_BLANK, declared_len, refuse_duplicate_keys
from worker.wire.moderation_jobs import (
    NO_RULE,
    ModerationJob,
    ModerationResult,
    Status,
    Verdict,
)
from worker.wire.msgpack_map import (
    INT64_MAX,
    MAX_ID_CHARS,
    check_envelope,
    require_str,
    type_name,
    unpack_map,
)
from worker.wire.versions import V1, V2, VERSIONS

# Contract maxima (mirrored in schemas/moderation-job[.v2].schema.json). Operational limits from
# config may be stricter, never looser.
MAX_TEXT_CHARS = 100_000
MAX_IMAGE_BYTES = 64 * 1024 * 1024
POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# A text counts as present when it has a character outside ECMA-262's whitespace (the schema's
# anyOf pattern, spelled out: worker.wire.job_maps); a job needs an image, such a text, or both.
TEXT_PRESENT = re.compile(NON_BLANK)
JOB_FIELDS = frozenset({"v", "id", "image", "text", "policy", "deadline_ms"})


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Operational limits applied on top of the contract's maxima."""

    max_image_bytes: int = 20 * 1024 * 1024
    max_text_chars: int = 20_000


_DEFAULT_LIMITS = DecodeLimits()


class _WireJob(msgspec.Struct, forbid_unknown_fields=True):
    """A job's map as msgspec reads it: exact msgpack types (no bool for an int, no str for
    bytes, no ext type), strict UTF-8, no trailing bytes, no field outside the contract's.
    Every optional field defaults to None, so the fields that are not None are keys the map
    holds: :func:`decode_moderation_job` compares their count with the map's header."""

    v: int
    id: str
    image: bytes | None = None
    text: str | None = None
    policy: str | None = None
    deadline_ms: int | None = None


_coders = threading.local()


def _job_decoder() -> msgspec.msgpack.Decoder[_WireJob]:
    # One per thread, as the result encoder below: msgspec does not document its coders as
    # safe to share between threads.
    decoder: msgspec.msgpack.Decoder[_WireJob] | None = getattr(_coders, "jobs", None)
    if decoder is None:
        decoder = _coders.jobs = msgspec.msgpack.Decoder(_WireJob)
    return decoder


def decode_moderation_job(payload: bytes, limits: DecodeLimits | None = None) -> ModerationJob:
    """Decode and validate one moderation job; raise a :class:`JobRejected` subclass if bad.

    Most jobs are read by msgspec and a few checks of what it cannot say (lengths against
    the limits, a text that is not blank, the policy name, no duplicate key: the map's header
    declares as many entries as the struct has fields set). They accept only jobs
    :func:`_decoded` accepts too, into the same job; anything else (every bad job, and good
    ones of a rarer shape, e.g. an explicit nil) goes through :func:`_decoded`, which names
    what is wrong. The loop thread pays this for every record: 1.7 us per 1 KB text job with
    the msgpack path alone, 0.4 us this way (timeit on the 2-core machine)."""
    limits = limits or _DEFAULT_LIMITS
    try:
        wire = _job_decoder().decode(payload)
    except (msgspec.MsgspecError, ValueError):  # (invalid UTF-8 is a UnicodeDecodeError)
        return _decoded(payload, limits)
    image, text, policy, deadline = wire.image, wire.text, wire.policy, wire.deadline_ms
    set_fields = (2 + (image is not None) + (text is not None) + (policy is not None)
                  + (deadline is not None))
    job_id = wire.id
    if (wire.v in VERSIONS and declared_len(payload) == set_fields
            and 0 < len(job_id) <= MAX_ID_CHARS
            and (image is None or 0 < len(image) <= min(limits.max_image_bytes,
                                                        MAX_IMAGE_BYTES))
            and (text is None or len(text) <= min(limits.max_text_chars, MAX_TEXT_CHARS))
            # an image, or a text that is not blank (an image goes with any text)
            and (image is not None or (text is not None and TEXT_PRESENT.search(text)))
            and (policy is None or policy == "default" or POLICY_NAME.fullmatch(policy))
            and (deadline is None or 0 <= deadline <= INT64_MAX)):
        return ModerationJob(job_id, image, text, policy or "default", deadline, wire.v)
    return _decoded(payload, limits)


def _decoded(payload: bytes, limits: DecodeLimits) -> ModerationJob:
    """The msgpack path: exact type and length checks on the unpacked map that accept only
    jobs :func:`_validated` accepts too, into the same job; anything else goes through
    :func:`_validated`, which names what is wrong."""
    obj = unpack_map(payload)
    refuse_duplicate_keys(payload, obj)
    v, job_id, image = obj.get("v"), obj.get("id"), obj.get("image")
    text, policy, deadline = obj.get("text"), obj.get("policy", "default"), obj.get("deadline_ms")
    if (type(v) is int and v in VERSIONS and obj.keys() <= JOB_FIELDS
            and type(job_id) is str and 0 < len(job_id) <= MAX_ID_CHARS
            and (image is None or (type(image) is bytes
                                   and 0 < len(image) <= min(limits.max_image_bytes,
                                                             MAX_IMAGE_BYTES)))
            and (text is None or _short_str(text, min(limits.max_text_chars, MAX_TEXT_CHARS)))
            # an image, or a text that is not blank (an image goes with any text)
            and (image is not None or (text is not None and TEXT_PRESENT.search(text)))
            and (policy == "default" or (type(policy) is str and POLICY_NAME.fullmatch(policy)))
            and (deadline is None or (type(deadline) is int and 0 <= deadline <= INT64_MAX))):
        return ModerationJob(job_id, image, text, policy, deadline, v)
    return _validated(obj, limits)


def _short_str(value: object, max_chars: int) -> bool:
    return type(value) is str and len(value) <= max_chars


def _validated(obj: dict[Any, Any], limits: DecodeLimits) -> ModerationJob:
    """Every check of the contract, each with its own one-line reason; then the worker's own
    text limit. A text the contract allows (at most ``MAX_TEXT_CHARS``) but over
    ``limits.max_text_chars`` is ``text_too_long``, not ``schema``: the job is valid, this
    worker does not take it. Checked last, so an invalid job is ``schema`` whatever its text."""
    version = check_envelope(obj, JOB_FIELDS, VERSIONS)
    if "id" not in obj:
        raise SchemaViolation("missing required field 'id'")

    job_id = require_str(obj, "id", max_chars=MAX_ID_CHARS)
    image = obj.get("image")
    if image is not None:
        if not isinstance(image, bytes):
            raise SchemaViolation(f"field 'image': expected binary, got {type_name(image)}")
        if not image:
            raise SchemaViolation("field 'image': empty")
        max_image = min(limits.max_image_bytes, MAX_IMAGE_BYTES)
        if len(image) > max_image:
            raise SchemaViolation(
                f"field 'image': {len(image)} bytes exceeds the limit {max_image}")

    text = None
    if obj.get("text") is not None:
        text = require_str(obj, "text", min_chars=0, max_chars=MAX_TEXT_CHARS)
    policy = "default"
    if obj.get("policy") is not None:
        policy = require_str(obj, "policy", max_chars=64)
        if not POLICY_NAME.fullmatch(policy):
            raise SchemaViolation(f"field 'policy': {policy!r} is not a valid policy name")
    deadline = obj.get("deadline_ms")
    if deadline is not None and (type(deadline) is not int or not 0 <= deadline <= INT64_MAX):
        raise SchemaViolation(
            f"field 'deadline_ms': expected a non-negative integer (epoch ms), got {deadline!r}"
        )
    if image is None and (text is None or not TEXT_PRESENT.search(text)):
        raise SchemaViolation("job has neither image nor text")
    if text is not None and len(text) > limits.max_text_chars:
        raise TextTooLong(f"field 'text': {len(text)} characters, over this worker's "
                          f"limits.max_text_chars {limits.max_text_chars} (the contract "
                          f"allows {MAX_TEXT_CHARS})")
    return ModerationJob(id=job_id, image=image, text=text, policy=policy, deadline_ms=deadline,
                         schema_version=version)


# An enum member's ``.value`` is a descriptor call (~0.3 us); a dict lookup by member is not.
_STATUS = {m: m.value for m in Status}
_VERDICT = {m: m.value for m in Verdict}


def result_to_dict(result: ModerationResult) -> dict[str, Any]:
    """The result as a plain map (the msgpack payload) in its ``schema_version``.

    v1 omits absent optional fields, ``rule`` and ``models`` included (open_nsfw-only results
    have neither). v2 always writes both: ``rule`` is :data:`NO_RULE` when no rule decided
    (any status but ok), ``models`` empty then. The keys come in the same order in both, v1's
    exactly as before v2 existed, so a v1 payload is byte-identical to what it was.
    """
    version = result.schema_version
    out: dict[str, Any] = {
        "v": version,
        "id": result.id,
        "status": _STATUS[result.status],
        "policy": result.policy,
        "model_id": result.model_id,
        "engine_hash": result.engine_hash,
        # packed before anyone could change it: no copy (any other mapping becomes a dict)
        "scores": result.scores if type(result.scores) is dict else dict(result.scores),
        "timings_ms": {k: round(v, 3) for k, v in result.timings_ms.items()}
        if result.timings_ms else {},
    }
    if result.verdict is not None:
        out["verdict"] = _VERDICT[result.verdict]
    if result.error is not None:
        out["error"] = result.error
    if result.source is not None:
        out["source"] = {
            "topic": result.source.topic,
            "partition": result.source.partition,
            "offset": result.source.offset,
        }
    if version == V1:
        if result.rule is not None:
            out["rule"] = result.rule
        if result.models:
            out["models"] = list(result.models)  # a msgpack array decodes as a list
    elif version == V2:
        out["rule"] = _v2_rule(result)
        out["models"] = list(result.models)
    else:
        raise ValueError(f"result {result.id!r}: no contract version {version} "
                         f"(known: {sorted(VERSIONS)})")
    return out


def _v2_rule(result: ModerationResult) -> str:
    if result.status is not Status.OK:
        return NO_RULE
    if result.rule is None or not result.models:
        # A task bug, not a property of the job: every v2 ok result names its rule and models.
        raise ValueError(f"v2 result {result.id!r} is ok but has no rule or no models")
    return result.rule


def encode_result(result: ModerationResult) -> bytes:
    """:func:`result_to_dict` packed by msgspec, one Encoder per thread: the same bytes as
    msgpack's ``packb(..., use_bin_type=True)`` (tests/unit/wire/test_moderation_codec.py
    compares them), 0.5 us where the msgpack Packer took 0.9 per result (timeit, 2-core
    machine)."""
    encoder: msgspec.msgpack.Encoder | None = getattr(_coders, "results", None)
    if encoder is None:
        encoder = _coders.results = msgspec.msgpack.Encoder(enc_hook=_plain)
    return encoder.encode(result_to_dict(result))


def _plain(value: object) -> object:
    """A subclass of a msgpack type as that type, as msgpack packs it (e.g. a score that is a
    numpy float64, a float subclass); anything else is a TypeError, as msgpack raises.
    msgspec calls this only for values it cannot encode itself."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def decode_result(payload: bytes) -> dict[str, Any]:
    """Decode a result payload (used by the demo, replay and tests); no validation beyond map.

    The map is what :func:`result_to_dict` wrote, in the version its ``v`` names: optional
    fields (``verdict``, ``error``, ``source``; in v1 ``rule`` and ``models`` too) only where
    set, ``models`` as a list.
    """
    return unpack_map(payload)
