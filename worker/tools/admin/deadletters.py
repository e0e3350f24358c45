"""Dead-letter records as a redrive reads them (pure): the reason, where a by-reference job
is, the operator's filter, and the headers a re-sent job carries.

The DLQ contract is :mod:`worker.wire.dlq` (``schemas/dlq-record.schema.json``): an inline
record is the original key, value and headers plus ``ktw.dlq.*`` headers; a by-reference
record (``ktw.dlq.value: reference``) has a JSON value naming the source record instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime

from worker.tools.admin.errors import BadOption
from worker.wire.dlq import CONNECT_PREFIX, HEADER_PREFIX
from worker.wire.records import Headers

REDRIVEN_FROM = "ktw-redriven-from"  # "<dlq topic>/<partition>/<offset>" on a re-sent job
REASON = HEADER_PREFIX + "error.reason"
VALUE_KIND = HEADER_PREFIX + "value"
SOURCE = HEADER_PREFIX + "source."


@dataclass(frozen=True, slots=True)
class Reference:
    """Where the job of a by-reference dead letter is, and what it must hash to."""

    topic: str
    partition: int
    offset: int
    size: int | None = None
    sha256: str | None = None

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    reason: str | None  # None: no ktw.dlq.error.reason header (not written by the worker)
    reference: Reference | None = None  # set for a by-reference record
    bad_reference: str | None = None  # a by-reference record whose reference is unreadable


def header_map(headers: Headers | None) -> dict[str, bytes]:
    """confluent-kafka's header list (or None) as a dict; the last value of a name wins."""
    out: dict[str, bytes] = {}
    for name, value in headers or []:
        out[name] = value.encode() if isinstance(value, str) else (value or b"")
    return out


def inspect(headers: Headers | None, value: bytes | None) -> DeadLetterInfo:
    h = header_map(headers)
    reason = h[REASON].decode("utf-8", "replace") if REASON in h else None
    if h.get(VALUE_KIND) != b"reference":
        return DeadLetterInfo(reason)
    try:
        ref = Reference(h[SOURCE + "topic"].decode(), int(h[SOURCE + "partition"]),
                        int(h[SOURCE + "offset"]))
        doc = json.loads(value or b"")
        return DeadLetterInfo(reason, Reference(ref.topic, ref.partition, ref.offset,
                                                int(doc["bytes"]), str(doc["sha256"])))
    except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        return DeadLetterInfo(reason, bad_reference=f"unreadable reference ({what})")


def check_fetched(ref: Reference, value: bytes | None) -> str | None:
    """Why a re-fetched record is not the one the reference names (None: it is)."""
    data = value or b""
    if ref.size is not None and len(data) != ref.size:
        return f"{ref} holds {len(data)} bytes, the dead letter names {ref.size}"
    if ref.sha256 is not None and hashlib.sha256(data).hexdigest() != ref.sha256:
        return f"{ref} does not hash to the dead letter's sha256"
    return None


def redriven_headers(original: Headers | None, dlq: str, partition: int, offset: int
                     ) -> Headers:
    """The job's own headers, in order, without the DLQ's (``ktw.dlq.*`` and Kafka Connect's
    ``__connect.errors.*``) nor an earlier redrive's mark, then this redrive's mark."""
    kept: Headers = [(k, v) for k, v in original or []
                     if not k.startswith((HEADER_PREFIX, CONNECT_PREFIX))
                     and k != REDRIVEN_FROM]
    return [*kept, (REDRIVEN_FROM, f"{dlq}/{partition}/{offset}".encode())]


def parse_time(text: str, option: str) -> int:
    """An ISO-8601 time with a zone (``2024-05-01T12:00:00Z``) as epoch milliseconds."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise BadOption(f"{option} {text!r} is not an ISO-8601 time "
                        "(e.g. 2024-05-01T12:00:00Z)") from exc
    if when.tzinfo is None:
        base = text.strip() if len(text.strip()) > 10 else f"{text.strip()}T00:00:00"
        raise BadOption(f"{option} {text!r} has no time zone; add one "
                        f"(e.g. {base}Z for UTC or {base}+02:00)")
    return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which dead letters to re-send: any of ``reasons`` (empty: any reason), dead-lettered
    in ``[since, until)`` (the DLQ record's timestamp, epoch ms)."""

    reasons: frozenset[str] = field(default_factory=frozenset)
    since_ms: int | None = None
    until_ms: int | None = None

    def __post_init__(self) -> None:
        if self.since_ms is not None and self.until_ms is not None \
                and self.until_ms <= self.since_ms:
            raise BadOption("--until must be after --since (the window is [since, until))")

    def after_window(self, ts: int | None) -> bool:
        return self.until_ms is not None and ts is not None and ts >= self.until_ms

    def matches(self, reason: str | None, ts: int | None) -> bool:
        if self.reasons and reason not in self.reasons:
            return False
        timed = self.since_ms is not None or self.until_ms is not None
        if timed and ts is None:
            return False
        if self.since_ms is not None and ts is not None and ts < self.since_ms:
            return False
        return not self.after_window(ts)
