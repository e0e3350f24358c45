"""A moderation job split into parts, one per engine input, and put back together.

Each model (:mod:`worker.tasks.moderation.models`) makes the parts of a job it scores:
open_nsfw its image, the text model each text chunk, CLIP its image and its caption. Each part
is batched with parts of other jobs of the same kind (engine) and profile (token-length
bucket, image size); the job's state collects what comes back, per model, and is decided once
nothing is outstanding, or as soon as one part is refused (a rejected image, a part that failed
alone) or expires.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected
from worker.tasks.batched import QueuedJob
from worker.wire.moderation_jobs import ModerationJob
from worker.wire.records import SourceRecord, SourceRef


@dataclass(slots=True)
class Pending(QueuedJob):
    """A consumed, decoded job waiting for its result."""

    ref: SourceRef
    job: ModerationJob
    consumed_at: float  # time.monotonic()
    record: SourceRecord
    # The source partition's epoch at intake (worker.loop.worker): an answer whose partition was
    # revoked, lost or rewound since is stale and discarded.
    epoch: int = 0
    # The policy's models that score this job, in the policy's order (ModerationTask.check
    # works them out at intake; its parts are made from them).
    plan: tuple[Any, ...] = ()


@dataclass(slots=True, eq=False)
class JobState:
    pending: Pending
    policy: PolicySettings
    outstanding: int = 0
    parts: int = 0  # how many parts it was split into
    started: float | None = None  # monotonic: the first of its parts began computing
    decode_s: float = 0.0  # the longest image decode of its parts (for the result's timings)
    # model name -> part key -> value, as the model's parts finish (see Part.key); None until
    # the first (a one-part job's value never lands here: worker.tasks.moderation.task)
    values: dict[str, dict[Hashable, Any]] | None = None
    rejection: JobRejected | None = None
    expired: bool = False
    finished: bool = False  # its outcome was handed out; late parts are ignored

    @property
    def failed(self) -> bool:
        return self.rejection is not None or self.expired

    def apply(self, part: Part, value: Any) -> None:
        """Record what ``part`` came back with: a rejection (the job goes to the DLQ) or its
        model's value, kept under ``part.key``."""
        if isinstance(value, JobRejected):
            self.rejection = value
        else:
            if self.values is None:
                self.values = {}
            self.values.setdefault(part.model, {})[part.key] = value


@dataclass(slots=True, eq=False)
class Part:
    """One engine input of a job; the batcher's item (``worker.tasks.batcher.Batchable``).

    ``kind`` names the engine (one batcher each, see ``ModerationModel.profiles``); ``key``
    where its value goes among its model's values; ``payload`` what the model needs to run it
    (e.g. a text chunk)."""

    state: JobState
    model: str
    kind: str
    shape: tuple[int, ...]
    key: Hashable = None
    payload: Any = None

    # The source record it came from (what the batched task's isolation and answers name).
    @property
    def ref(self) -> SourceRef:
        return self.state.pending.ref

    @property
    def record(self) -> SourceRecord:
        return self.state.pending.record

    @property
    def epoch(self) -> int:
        return self.state.pending.epoch

    @property
    def job(self) -> ModerationJob:
        return self.state.pending.job

    @property
    def consumed_at(self) -> float:
        return self.state.pending.consumed_at

    @property
    def deadline_ms(self) -> int | None:
        return self.state.pending.job.deadline_ms

    @property
    def partition_key(self) -> Hashable:
        return self.state.pending.partition_key

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self.shape

    def decoded(self, seconds: float) -> None:
        """The model spent ``seconds`` decoding this part's image (the job's decode timing)."""
        self.state.decode_s = max(self.state.decode_s, seconds)


def job_text(job: ModerationJob) -> str | None:
    """The job's text, if it has any to score (not blank)."""
    return job.text if job.text and job.text.strip() else None


def mark_started(state: JobState) -> None:
    if state.started is None:
        state.started = time.monotonic()
