"""Dead-letter records: the original key, value and headers untouched, plus why and whence;
or, for a record too large to copy, a reference to it (:func:`dead_letter_by_reference`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from worker.exceptions import JobRejected
from worker.wire.job_maps import source_version
from worker.wire.records import Headers, SourceRecord
from worker.wire.trace import trace_headers

HEADER_PREFIX = "ktw.dlq."
# Headers the worker's own tools trust (the DLQ's, and a replay's source coordinates and id):
# never copied from a record, so a job cannot forge them.
CONNECT_PREFIX = "__connect.errors."
RESERVED_PREFIXES = (HEADER_PREFIX, "ktw.source.", "ktw.replay.", CONNECT_PREFIX)
MAX_MESSAGE_CHARS = 1000
MAX_REFERENCE_KEY = 4096  # a larger key is left out of a by-reference DLQ record too


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    headers: Headers


def record_bytes(record: SourceRecord) -> int:
    """Key, value and header bytes of a record (what the producer's size limit counts)."""
    headers = sum(len(k) + len(v or b"") for k, v in record.headers or [])
    return len(record.key or b"") + len(record.value or b"") + headers


def dead_letter(record: SourceRecord, error: JobRejected, worker_id: str, *,
                inline_max_bytes: int | None = None) -> DeadLetter:
    """Build the DLQ record for one rejected Kafka record (see schemas/dlq-record.schema.json):
    the original, or a reference to it when the original is over ``inline_max_bytes`` or its
    headers could not be read (a copy without them would not be the original)."""
    if record.headers_error is not None or (
            inline_max_bytes is not None and record_bytes(record) > inline_max_bytes):
        return dead_letter_by_reference(record, error, worker_id)
    # The original headers in their order, but none in our namespace: a record must not be
    # able to forge the reason or the source a DLQ reader (or a redrive) goes by.
    copied = [(k, v) for k, v in record.headers or [] if not k.startswith(RESERVED_PREFIXES)]
    return DeadLetter(key=record.key, value=record.value,
                      headers=copied + _ours(record, error, worker_id))


def dead_letter_by_reference(record: SourceRecord, error: JobRejected, worker_id: str
                             ) -> DeadLetter:
    """A DLQ record for a record too large to copy (or whose headers could not be read): the
    value is a JSON reference to the source record (``headers``: their number, null when
    unreadable), its original headers are left out (but its W3C trace context), and
    ``ktw.dlq.value`` says so. The key is kept when it is small (it usually is the job id); a
    record without one (or with a larger one) is keyed ``<topic>/<partition>/<offset>``
    instead, so that a compacted DLQ topic, which refuses records without a key, takes it
    too."""
    value = record.value or b""
    ref = {"ref": "kafka", "topic": record.topic, "partition": record.partition,
           "offset": record.offset, "bytes": len(value),
           "sha256": hashlib.sha256(value).hexdigest(),
           "headers": None if record.headers_error is not None else len(record.headers or []),
           "record_bytes": record_bytes(record)}
    key = record.key if record.key is not None and len(record.key) <= MAX_REFERENCE_KEY \
        else f"{record.topic}/{record.partition}/{record.offset}".encode()
    headers = [*_ours(record, error, worker_id), (HEADER_PREFIX + "value", b"reference"),
               *trace_headers(record.headers)]
    return DeadLetter(key=key, value=json.dumps(ref, separators=(",", ":")).encode(),
                      headers=headers)


def _ours(record: SourceRecord, error: JobRejected, worker_id: str) -> Headers:
    message = str(error)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    ours: dict[str, str] = {
        "error.class": type(error).__name__,
        "error.reason": error.reason,
        "error.message": message,
        "source.topic": record.topic,
        "source.partition": str(record.partition),
        "source.offset": str(record.offset),
        "worker": worker_id,
    }
    if record.timestamp_ms is not None:
        ours["source.timestamp"] = str(record.timestamp_ms)
    # The job's contract version, when its value says (even one this worker does not speak):
    # a by-reference record has no value to read it from, and a redrive or a reader picks the
    # schema by it. Added in contract v2; readers that do not know it skip it.
    version = source_version(record.value)
    if version is not None:
        ours["source.v"] = str(version)
    # The same facts under Kafka Connect's dead-letter header names (KIP-298), so tooling
    # built for Connect's DLQs reads these records too.
    connect = {"topic": record.topic, "partition": str(record.partition),
               "offset": str(record.offset), "connector.name": "kafka-trt-worker",
               "task.id": worker_id, "stage": "TASK_PUT",
               "class.name": "worker.tasks", "exception.class.name": type(error).__name__,
               "exception.message": message}
    return [*((HEADER_PREFIX + k, v.encode("utf-8", "backslashreplace"))
              for k, v in ours.items()),
            *((CONNECT_PREFIX + k, v.encode("utf-8", "backslashreplace"))
              for k, v in connect.items())]
