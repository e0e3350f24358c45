"""Jobs as open_nsfw parts, run through a model's ``run`` without the task (model-level tests,
tests/gpu): each job's scores or rejection, in the batch's order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.profiles import Profile
from worker.config.policies import PolicySettings
from worker.exceptions import JobRejected
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.open_nsfw.model import IMAGE_ITEM_SHAPE, KIND
from worker.tasks.moderation.parts import JobState, Part, Pending
from worker.wire.moderation_jobs import ModerationJob
from worker.wire.records import SourceRecord, SourceRef

OPEN_NSFW_ONLY = PolicySettings(models=["open_nsfw"])


@dataclass
class Scored:
    job_id: str
    scores: dict[str, float] | None
    rejection: JobRejected | None


def image_part(job_id: str, image: bytes | None, offset: int = 0, consumed_at: float = 0.0,
               **job: Any) -> Part:
    record = SourceRecord("t", 0, offset, job_id.encode(), b"<msgpack>", None, None)
    p = Pending(SourceRef("t", 0, offset), ModerationJob(id=job_id, image=image, **job),
                consumed_at, record)
    return Part(JobState(p, OPEN_NSFW_ONLY), "open_nsfw", KIND, IMAGE_ITEM_SHAPE, key=KIND)


def image_batch(profile: Profile, images: list[bytes | None], padded: int | None = None
                ) -> Batch[Part]:
    parts = [image_part(f"j{i}", img, i) for i, img in enumerate(images)]
    return Batch(profile, parts, padded or profile.padded(len(parts)))


def run_batch(model: Any, batch: Batch[Part]) -> list[Scored]:
    """``batch`` through ``model.run``: one :class:`Scored` per part, in the batch's order."""
    order = {id(p): k for k, p in enumerate(batch.items)}
    done = sorted(model.run(KIND, batch), key=lambda d: order[id(d[0])])
    assert len(done) == len(batch.items), "one value per part"
    return [Scored(p.job.id, None if isinstance(v, JobRejected) else v,
                   v if isinstance(v, JobRejected) else None) for p, v in done]
