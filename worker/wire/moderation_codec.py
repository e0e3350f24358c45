"""msgpack <-> typed jobs and results, with precise validation errors.

The checks here are written by hand (not a JSON Schema validator at run time) because they run
once per Kafka record on the hot path; ``tests/unit/test_schemas.py`` keeps them in agreement
with the JSON Schema files in ``schemas/`` on every example and on mutated examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgpack

from worker.exceptions import SchemaViolation
from worker.wire.moderation_jobs import (
    SCHEMA_VERSION,
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

# Contract maxima (mirrored in schemas/moderation-job.schema.json). Operational limits from the
# config may be stricter, never looser.
MAX_TEXT_CHARS = 100_000
MAX_IMAGE_BYTES = 64 * 1024 * 1024
POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# A text counts as present when it has a non-whitespace character (the schema's anyOf
# pattern); a job needs an image, such a text, or both.
TEXT_PRESENT = re.compile(r"\S")
JOB_FIELDS = frozenset({"v", "id", "image", "text", "policy", "deadline_ms"})


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Operational limits applied on top of the contract's maxima."""

    max_image_bytes: int = 20 * 1024 * 1024
    max_text_chars: int = 20_000


def decode_moderation_job(payload: bytes, limits: DecodeLimits | None = None) -> ModerationJob:
    """Decode and validate one moderation job; raise a :class:`JobRejected` subclass if bad."""
    limits = limits or DecodeLimits()
    obj = unpack_map(payload)
    check_envelope(obj, JOB_FIELDS, SCHEMA_VERSION)
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
        text = require_str(obj, "text", min_chars=0,
                            max_chars=min(limits.max_text_chars, MAX_TEXT_CHARS))
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
    return ModerationJob(id=job_id, image=image, text=text, policy=policy, deadline_ms=deadline)


# An enum member's ``.value`` is a descriptor call (~0.3 us); a dict lookup by member is not.
_STATUS = {m: m.value for m in Status}
_VERDICT = {m: m.value for m in Verdict}


def result_to_dict(result: ModerationResult) -> dict[str, Any]:
    """The result as a plain map (the msgpack payload), omitting absent optional fields."""
    out: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "id": result.id,
        "status": _STATUS[result.status],
        "policy": result.policy,
        "model_id": result.model_id,
        "engine_hash": result.engine_hash,
        "scores": dict(result.scores),
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
    # Image-and-text policies only: open_nsfw-only results stay byte-identical to v1's.
    if result.rule is not None:
        out["rule"] = result.rule
    if result.models:
        out["models"] = list(result.models)  # a msgpack array decodes as a list
    return out


def encode_result(result: ModerationResult) -> bytes:
    return msgpack.packb(result_to_dict(result), use_bin_type=True)


def decode_result(payload: bytes) -> dict[str, Any]:
    """Decode a result payload (used by the demo, replay and tests); no validation beyond map.

    The map is what :func:`result_to_dict` wrote: optional fields (``verdict``, ``error``,
    ``source``, ``rule``, ``models``) only where set, ``models`` as a list.
    """
    return unpack_map(payload)
