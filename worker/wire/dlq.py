"""Dead-letter records: the original key, value and headers untouched, plus why and whence."""

from __future__ import annotations

from dataclasses import dataclass

from worker.exceptions import JobRejected
from worker.wire.records import Headers, SourceRecord

HEADER_PREFIX = "ktw.dlq."
MAX_MESSAGE_CHARS = 1000

@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    headers: Headers


def dead_letter(record: SourceRecord, error: JobRejected, worker_id: str) -> DeadLetter:
    """Build the DLQ record for one rejected Kafka record (see schemas/dlq-record.schema.json)."""
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
    out: Headers = list(record.headers or [])
    out.extend((HEADER_PREFIX + k, v.encode("utf-8", "backslashreplace")) for k, v in ours.items())
    return DeadLetter(key=record.key, value=record.value, headers=out)
