"""An image-and-text job split into parts, one per engine input, and put back together.

Each model plug-in (:mod:`worker.tasks.moderation.models`) makes the parts of a job it scores:
open_nsfw its image, the text model each text chunk, CLIP its image and its caption. Each part
is batched with parts of other jobs of the same kind (engine) and profile (token-length
bucket, image size); the job's state collects what comes back, per model, and is decided once
nothing is outstanding, or as soon as one part fails (rejected image, inference error) or
expires.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected
from worker.tasks.moderation.open_nsfw import Pending
from worker.wire.moderation_jobs import ModerationJob


@dataclass(frozen=True, slots=True)
class PartFailed:
    """A part's value when its engine failed: the job is answered with status ``error``."""

    error: str


@dataclass(slots=True)
class JobState:
    pending: Pending
    policy: PolicySettings
    outstanding: int = 0
    started: float | None = None  # monotonic: the first of its parts began computing
    # model name -> part key -> value, as the model's parts finish (see Part.key)
    values: dict[str, dict[Hashable, Any]] = field(default_factory=dict)
    rejection: JobRejected | None = None
    error: str | None = None
    expired: bool = False
    finished: bool = False  # its outcome was handed out; late parts are ignored

    @property
    def failed(self) -> bool:
        return self.rejection is not None or self.error is not None or self.expired

    def apply(self, part: Part, value: Any) -> None:
        """Record what ``part`` came back with: a rejection (the job goes to the DLQ), a
        failure (an error result), or its model's value, kept under ``part.key``."""
        if isinstance(value, JobRejected):
            self.rejection = value
        elif isinstance(value, PartFailed):
            self.error = value.error
        else:
            self.values.setdefault(part.model, {})[part.key] = value


@dataclass(slots=True, eq=False)
class Part:
    """One engine input of a job; the batcher's view of it (``worker.tasks.batcher.Batchable``).

    ``kind`` names the engine (one batcher each, see ``ModerationModel.profiles``); ``key``
    where its value goes among its model's values; ``payload`` what the model needs to run it
    (e.g. a text chunk)."""

    state: JobState
    model: str
    kind: str
    shape: tuple[int, ...]
    key: Hashable = None
    payload: Any = None

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


def job_text(job: ModerationJob) -> str | None:
    """The job's text, if it has any to score (not blank)."""
    return job.text if job.text and job.text.strip() else None


def mark_started(state: JobState) -> None:
    if state.started is None:
        state.started = time.monotonic()
