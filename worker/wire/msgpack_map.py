"""A msgpack document as the contract allows it: one map, no extension types, checked fields.

Shared by every job codec (:mod:`worker.wire.moderation_codec`,
:mod:`worker.wire.generation_codec`): each raises a :class:`JobRejected` subclass, which the
loop dead-letters with its reason.
"""

from __future__ import annotations

from typing import Any

import msgpack

from worker.exceptions import JobRejected, MalformedPayload, SchemaViolation, UnsupportedVersion

MAX_ID_CHARS = 256
INT64_MAX = 2**63 - 1
# Bounds on what unpacking may build (see unpack_map): a job is one flat map of at most a dozen
# fields; a result holds a few small maps and at most 64 images.
MAX_CONTAINER_LEN = 1024
MAX_CONTAINERS = 1024


def type_name(value: object) -> str:
    return type(value).__name__


def unpack_map(payload: bytes) -> dict[Any, Any]:
    """The payload as a map. Bounded before anything large is built: an empty map or array
    costs one byte on the wire and ~60 in memory, so a 1 MB array of empty maps would cost
    ~73 MB and a second of the loop's time. Containers are capped in length
    (``MAX_CONTAINER_LEN``, checked from their headers) and in number (``MAX_CONTAINERS``,
    counted as they are built): no contract document comes near either."""
    hooks: dict[str, Any] = {}
    # Every container takes at least one byte, so a payload no longer than the cap cannot
    # exceed it: counting (a Python call per map or array, ~0.4 us per 1 KB job) is skipped.
    if len(payload) > MAX_CONTAINERS:
        budget = [MAX_CONTAINERS]

        def counted(container: Any) -> Any:
            budget[0] -= 1
            if budget[0] < 0:
                raise SchemaViolation(f"more than {MAX_CONTAINERS} nested maps or arrays")
            return container

        hooks = {"object_hook": counted, "list_hook": counted}
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            # Refuse ext types outright: the contract has none. (msgpack decodes its timestamp
            # type itself, without the hook; a Timestamp then fails the field's type check.)
            ext_hook=_reject_ext,
            max_map_len=MAX_CONTAINER_LEN,
            max_array_len=MAX_CONTAINER_LEN,
            **hooks,
        )
    except UnicodeDecodeError as exc:
        raise MalformedPayload(f"invalid UTF-8 in a msgpack string: {exc.reason}") from exc
    except SchemaViolation:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise MalformedPayload(f"not a msgpack document: {exc}") from exc
    if not isinstance(obj, dict):
        raise MalformedPayload(f"top level must be a msgpack map, got {type_name(obj)}")
    return obj


def _reject_ext(code: int, data: bytes) -> object:
    raise SchemaViolation(f"msgpack extension type {code} is not part of the contract")


def require_str(obj: dict[Any, Any], key: str, *, max_chars: int, min_chars: int = 1) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise SchemaViolation(f"field '{key}': expected string, got {type_name(value)}")
    if not min_chars <= len(value) <= max_chars:
        raise SchemaViolation(
            f"field '{key}': length {len(value)} outside [{min_chars}, {max_chars}]"
        )
    return value


def check_envelope(obj: dict[Any, Any], fields: frozenset[str], versions: frozenset[int]
                   ) -> int:
    """``v`` present, an integer, one of the ``versions`` this worker speaks; no field outside
    ``fields``. Returns ``v``. A float or a bool is a schema violation, not another version:
    msgpack tells the types apart, so ``1.0`` or ``true`` is a malformed ``v``."""
    if "v" not in obj:
        raise SchemaViolation("missing required field 'v'")
    v = obj["v"]
    if type(v) is not int:
        raise SchemaViolation(f"field 'v': expected integer, got {type_name(v)}")
    if v not in versions:
        speaks = ", ".join(map(str, sorted(versions)))
        raise UnsupportedVersion(f"schema version v={v} is not supported (this worker: {speaks})")
    unknown = set(obj) - fields
    if unknown:
        # repr: a key holding a newline or control characters stays on the reason's one line
        raise SchemaViolation(f"unknown field(s): {', '.join(sorted(map(repr, unknown)))}")
    return v


def peek_version(payload: bytes | None) -> int | None:
    """The integer ``v`` of a payload that is a contract map, else None (not msgpack, no
    ``v``, or a ``v`` that is no integer). For dead letters, which name the version of the job
    they reject; never on the path of a job that is answered."""
    try:
        v = unpack_map(payload or b"").get("v")
    except JobRejected:
        return None
    return v if type(v) is int else None
