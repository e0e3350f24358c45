"""Headers of replay output: what produced a record, and which source record it answers."""

from __future__ import annotations

from dataclasses import dataclass

from worker.wire.moderation_jobs import RESULT_SCHEMAS
from worker.wire.records import Headers, SourceRef
from worker.wire.versions import V1

SCHEMA = "ktw.schema"
MODEL = "ktw.model"
ENGINE = "ktw.engine"
SOURCE_TOPIC = "ktw.source.topic"
SOURCE_PARTITION = "ktw.source.partition"
SOURCE_OFFSET = "ktw.source.offset"
REPLAY_ID = "ktw.replay.id"
# DLQ records name their source with the DLQ contract's own headers.
DLQ_SOURCE_PARTITION = "ktw.dlq.source.partition"
DLQ_SOURCE_OFFSET = "ktw.dlq.source.offset"
DLQ_REASON = "ktw.dlq.error.reason"


def result_headers(model: str, engine: str, replay_id: str, ref: SourceRef,
                   version: int = V1) -> Headers:
    """A moderation result's headers (in contract ``version``) with its source's."""
    return [
        (SCHEMA, RESULT_SCHEMAS[version].encode()),
        (MODEL, model.encode()),
        (ENGINE, engine.encode()),
        *source_headers(replay_id, ref),
    ]


def source_headers(replay_id: str, ref: SourceRef) -> Headers:
    """Appended to the task's own result headers: which source record this answers."""
    return [
        (SOURCE_TOPIC, ref.topic.encode()),
        (SOURCE_PARTITION, str(ref.partition).encode()),
        (SOURCE_OFFSET, str(ref.offset).encode()),
        (REPLAY_ID, replay_id.encode()),
    ]


def as_dict(headers: object) -> dict[str, bytes]:
    """confluent-kafka's header list (or None) as a dict; the last value of a name wins."""
    out: dict[str, bytes] = {}
    if isinstance(headers, list):
        for item in headers:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                value = item[1]
                out[item[0]] = value.encode() if isinstance(value, str) else (value or b"")
    return out


@dataclass(frozen=True, slots=True)
class Written:
    """What an output record of a replay says about itself (see :func:`parse_written`)."""

    replay_id: str
    partition: int
    offset: int
    reason: str | None  # DLQ records: the rejection reason


def parse_written(headers: object) -> Written | None:
    """The replay id and source coordinates of a result or DLQ record written by a replay."""
    h = as_dict(headers)
    rid = h.get(REPLAY_ID)
    if rid is None:
        return None
    try:
        # A DLQ record's coordinates are the worker's own ktw.dlq.source.* headers, checked
        # first: ktw.source.* on a DLQ record could only have come from the job itself.
        if DLQ_SOURCE_OFFSET in h:
            return Written(rid.decode(), int(h[DLQ_SOURCE_PARTITION]),
                           int(h[DLQ_SOURCE_OFFSET]), h.get(DLQ_REASON, b"").decode())
        if SOURCE_OFFSET in h:
            return Written(rid.decode(), int(h[SOURCE_PARTITION]), int(h[SOURCE_OFFSET]), None)
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    return None
