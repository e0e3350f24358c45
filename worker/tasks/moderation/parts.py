"""A multimodal job split into parts, one per engine input, and put back together.

A job becomes up to four kinds of part: its image for open_nsfw, each text chunk for the text
model, its image for CLIP's image tower, its caption for CLIP's text tower. Each part is batched
with parts of other jobs for the same engine and profile (token-length bucket, image size);
the job's state collects what comes back and is decided once nothing is outstanding, or as
soon as one part fails (rejected image, inference error) or expires.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from engines.tokens import Chunk
from worker.config.policies import ModelName, PolicySettings
from worker.exceptions import JobRejected
from worker.tasks.moderation.open_nsfw import IMAGE_ITEM_SHAPE, Pending

PartKind = Literal["open_nsfw", "text", "clip_image", "clip_text"]


@dataclass(slots=True)
class JobState:
    pending: Pending
    policy: PolicySettings
    outstanding: int = 0
    started: float | None = None  # monotonic: the first of its parts began computing
    nsfw: dict[str, float] | None = None
    text: dict[int, np.ndarray] = field(default_factory=dict)  # chunk index -> embedding
    clip_image: np.ndarray | None = None
    clip_caption: np.ndarray | None = None
    rejection: JobRejected | None = None
    error: str | None = None
    expired: bool = False
    finished: bool = False  # its outcome was handed out; late parts are ignored

    @property
    def failed(self) -> bool:
        return self.rejection is not None or self.error is not None or self.expired


@dataclass(slots=True, eq=False)
class Part:
    """One engine input of a job; the batcher's view of it (``worker.tasks.batcher.Batchable``)."""

    state: JobState
    kind: PartKind
    shape: tuple[int, ...]
    chunk: Chunk | None = None
    index: int = 0  # the chunk's position in its text

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


def plan_models(policy: PolicySettings, has_image: bool, has_text: bool) -> list[ModelName]:
    """The policy's models this job can feed: image models need an image, text needs text."""
    return [m for m in policy.models
            if (m == "text" and has_text) or (m != "text" and has_image)]


def mark_started(state: JobState) -> None:
    if state.started is None:
        state.started = time.monotonic()


def image_part(state: JobState) -> Part:
    return Part(state, "open_nsfw", IMAGE_ITEM_SHAPE)
