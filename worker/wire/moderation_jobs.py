"""Typed jobs and results: what the codec produces and what the tasks return.

These are plain frozen dataclasses so they cost little on the hot path; the wire contract they
mirror lives in ``schemas/`` (JSON Schema) and is enforced by :mod:`worker.wire.moderation_codec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from worker.wire.records import SourceRef
from worker.wire.versions import V1, schema_ids

# ktw.schema header values by contract version (worker.wire.versions).
JOB_SCHEMAS = schema_ids("moderation-job")
RESULT_SCHEMAS = schema_ids("moderation-result")
# contract v2: the ``rule`` of a result that no rule decided (any status but ok).
NO_RULE = "none"


class Status(StrEnum):
    OK = "ok"
    EXPIRED = "expired"
    REJECTED = "rejected"
    ERROR = "error"
    # Generation results v2 only: the job's prompt was blocked by the moderation policy, and
    # nothing was generated (worker.tasks.generation.safety).
    BLOCKED = "blocked"


class Verdict(StrEnum):
    ALLOW = "allow"
    REVIEW = "review"
    BLOCK = "block"


# Not frozen: made per message, and a frozen dataclass's __init__ costs ~1 us more per object.
@dataclass(slots=True)
class ModerationJob:
    id: str
    image: bytes | None  # None: a text-only job (the codec ensures image or text is present)
    text: str | None = None
    policy: str = "default"
    deadline_ms: int | None = None
    schema_version: int = V1  # the job's ``v``: its result is written in the same version


# Not frozen: made per message, and a frozen dataclass's __init__ costs ~1 us more per object.
@dataclass(slots=True)
class ModerationResult:
    id: str
    status: Status
    policy: str
    model_id: str
    engine_hash: str
    verdict: Verdict | None = None
    scores: dict[str, float] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    source: SourceRef | None = None
    # Image-and-text policies (worker.tasks.moderation.scoring.policies.Decision): the rule
    # that decided, e.g. "block:text.violence" or "allow", and the models that ran, in the
    # order they ran. Unset for open_nsfw-only results, which keep their v1 shape in v1 (the
    # open_nsfw task sets them when it encodes a v2 result), and for results not ok.
    rule: str | None = None
    models: tuple[str, ...] = ()
    schema_version: int = V1  # the job's: the version the result is encoded in
