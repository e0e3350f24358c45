"""Typed generation jobs and results (the wire contract lives in schemas/generation-*.json).

One job -> one result (key = job id) holding all ``num_images`` images in index order; image i
uses seed ``(seed + i) mod 2**32``. One record per job keeps offset tracking, exactly-once
transactions and replay dedup exactly as for moderation (one source record, one result record).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.wire.moderation_jobs import Status, Verdict
from worker.wire.records import SourceRef
from worker.wire.versions import V1, schema_ids

# ktw.schema header values by contract version (worker.wire.versions). v2 jobs are v1's; v2
# results add moderation's verdicts (per image, and on the prompt) and the status "blocked".
GENERATION_JOB_SCHEMAS = schema_ids("generation-job")
GENERATION_RESULT_SCHEMAS = schema_ids("generation-result")
SEED_MODULUS = 2**32


@dataclass(frozen=True, slots=True)
class GenerationJob:
    id: str
    prompt: str
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = 30
    guidance_scale: float = 7.5
    scheduler: str = "ddim"
    seed: int = 0
    num_images: int = 1
    deadline_ms: int | None = None
    schema_version: int = V1  # the job's ``v``: its result is written in the same version

    def image_seed(self, index: int) -> int:
        return (self.seed + index) % SEED_MODULUS


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where an image went when the result would exceed the results topic's size limit."""

    uri: str
    sha256: str
    bytes: int
    content_type: str = "image/png"


@dataclass(frozen=True, slots=True)
class Check:
    """A moderation policy's decision on a prompt or an image: the verdict, the rule that
    decided it, every score as ``<model>.<label>`` (worker.tasks.moderation.scoring)."""

    verdict: Verdict
    rule: str
    scores: dict[str, float]
    reason: str = ""  # for people (logs, a v1 result's error); not a field of its own


@dataclass(frozen=True, slots=True)
class GeneratedImage:
    index: int
    seed: int
    width: int
    height: int
    png: bytes | None = None
    blob: BlobRef | None = None
    check: Check | None = None  # the image's moderation, when a policy is configured
    quarantine: BlobRef | None = None  # a blocked image's PNG, when a quarantine is configured

    @property
    def withheld(self) -> bool:
        """Blocked by moderation: never published (no png, no blob)."""
        return self.check is not None and self.check.verdict is Verdict.BLOCK


@dataclass(frozen=True, slots=True)
class GenerationResult:
    id: str
    status: Status
    model_id: str
    engine_hashes: dict[str, str]
    random_weights: bool
    images: tuple[GeneratedImage, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    source: SourceRef | None = None
    schema_version: int = V1  # the job's: the version the result is encoded in
    prompt_check: Check | None = None  # the prompt's moderation, when it was checked
