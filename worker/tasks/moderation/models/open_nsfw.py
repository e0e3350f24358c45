"""open_nsfw as an image-and-text moderation model: one part per job, its image.

Composition, not a rewrite: the parts run through
:class:`worker.tasks.moderation.open_nsfw.OpenNsfwTask` (its decode, preprocessing, padding and
GPU pipeline), fed a copy of each job under the always-present ``default`` policy; only its
``nsfw``/``sfw`` scores are used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from engines.profiles import Profile
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import Finished, ModelContext, ModerationModel
from worker.tasks.moderation.open_nsfw import IMAGE_ITEM_SHAPE, Outcome, Pending
from worker.tasks.moderation.parts import JobState, Part, PartFailed
from worker.wire.moderation_jobs import ModerationJob, Status

OPEN_NSFW_KIND = "open_nsfw"


class ImageScorer(Protocol):
    """What the plug-in runs its parts on: an :class:`OpenNsfwTask` (or a test's stand-in)."""

    @property
    def engine_hash(self) -> str: ...

    def submit(self, batch: Batch[Pending]) -> Future[list[Outcome]]: ...

    def warm_up(self) -> None: ...

    def ready(self) -> bool: ...

    def close(self) -> None: ...


class OpenNsfwModel(ModerationModel):
    name = "open_nsfw"

    def __init__(self, scorer: ImageScorer, profiles: tuple[Profile, ...]) -> None:
        self.scorer, self._profiles = scorer, profiles

    @classmethod
    def create(cls, ctx: ModelContext) -> OpenNsfwModel:
        from worker.tasks.moderation.open_nsfw_gpu import make_open_nsfw_task

        task = make_open_nsfw_task(ctx.cfg, ctx.runner)
        return cls(task, task.profiles)

    def feeds(self, job: ModerationJob) -> bool:
        return bool(job.image)

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {OPEN_NSFW_KIND: self._profiles}

    def parts(self, state: JobState) -> list[Part]:
        return [Part(state, self.name, OPEN_NSFW_KIND, IMAGE_ITEM_SHAPE, key=OPEN_NSFW_KIND)]

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        copies = [dataclasses.replace(part.state.pending, job=dataclasses.replace(
            part.state.pending.job, policy="default")) for part in batch.items]
        outcomes = self.scorer.submit(Batch(batch.profile, copies, batch.padded_size)).result()
        by_copy = {id(c): part for c, part in zip(copies, batch.items, strict=True)}
        done: list[Finished] = []
        for o in outcomes:
            part = by_copy[id(o.pending)]
            if o.rejection is not None:
                done.append((part, o.rejection))
            elif o.result is None or o.result.status is not Status.OK:
                done.append((part, PartFailed((o.result.error if o.result else None)
                                              or "image failed")))
            else:
                done.append((part, dict(o.result.scores)))
        return done

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        return dict(values[OPEN_NSFW_KIND])

    def identity(self) -> tuple[str, str]:
        return "open_nsfw", self.scorer.engine_hash

    def warm_up(self) -> None:
        self.scorer.warm_up()

    def ready(self) -> bool:
        return self.scorer.ready()

    def close(self) -> None:
        self.scorer.close()
