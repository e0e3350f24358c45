"""The tiny classifier as a moderation model: one part per job (its image), scored ``bright``
(a policy label, thresholds from the policy) and ``dark`` (reported only)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from engines.backends.base import Runner
from engines.profiles import Profile
from tests.unit.tasks.moderation.tiny_model.engine import INPUT, LABELS, OUTPUT, engine_plan
from tests.unit.tasks.moderation.tiny_model.preprocess import preprocess_tiny
from tests.unit.tasks.moderation.tiny_model.settings import settings_of
from worker.exceptions import JobRejected
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image
from worker.tasks.moderation.models.base import Finished, ModelContext, ModerationModel
from worker.tasks.moderation.parts import JobState, Part
from worker.wire.moderation_jobs import ModerationJob

KIND = "tiny_image"


class TinyModel(ModerationModel):
    name = "tiny"

    def __init__(self, runner: Runner, model_id: str, profiles: tuple[Profile, ...],
                 size: int, limits: ImageLimits) -> None:
        self.runner, self.model_id, self._profiles = runner, model_id, profiles
        self.size, self._limits = size, limits

    @classmethod
    def create(cls, ctx: ModelContext) -> TinyModel:
        plan = engine_plan(ctx.cfg)
        runner = plan.runner()
        runner.activate()
        lim = ctx.cfg.limits
        return cls(runner, plan.spec.model_id, plan.profiles, settings_of(ctx.cfg).size,
                   ImageLimits(lim.max_image_pixels, lim.max_image_side))

    def feeds(self, job: ModerationJob) -> bool:
        return bool(job.image)

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {KIND: self._profiles}

    def parts(self, state: JobState) -> list[Part]:
        return [Part(state, self.name, KIND, (3, self.size, self.size), key=KIND)]

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        done: list[Finished] = []
        good: list[tuple[Part, np.ndarray]] = []
        for p in batch.items:
            try:
                good.append((p, preprocess_tiny(decode_image(p.job.image or b"", self._limits),
                                                self.size)))
            except JobRejected as exc:
                done.append((p, exc))
        if good:
            probs = self.runner.infer({INPUT: np.stack([x for _, x in good])}).result()[OUTPUT]
            done += [(p, dict(zip(LABELS, map(float, row), strict=True)))
                     for (p, _), row in zip(good, probs, strict=True)]
        return done

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        scores: dict[str, float] = values[KIND]
        return scores

    def identity(self) -> tuple[str, str]:
        return self.model_id, self.runner.engine_hash

    def close(self) -> None:
        self.runner.deactivate()
