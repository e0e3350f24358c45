"""CLIP as a moderation model: the image for its image tower, the caption
(the job's text, first 77 tokens) for its text tower.

Scores: zero-shot label probabilities of the image against each policy's prompts, and the
image-caption consistency when the job has text
(:mod:`worker.tasks.moderation.models.clip.scoring`). Generated images are scored the same way,
their prompt as the caption (:meth:`ClipModel.score_pixels`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.exceptions import JobRejected, NothingToScore
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images.budgets import guard_for
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image
from worker.tasks.moderation.models.base import (
    Finished,
    ModelContext,
    ModerationModel,
    embed_parts,
    tokenizers_missing,
)
from worker.tasks.moderation.models.clip.engine import ClipEngines
from worker.tasks.moderation.models.clip.preprocess import preprocess_clip, preprocess_pixels
from worker.tasks.moderation.models.clip.scoring import PromptBank, prompt_bank
from worker.tasks.moderation.models.clip.settings import settings_of
from worker.tasks.moderation.parts import JobState, Part, job_text
from worker.wire.moderation_jobs import ModerationJob

IMAGE, CAPTION = "clip_image", "clip_text"  # part kinds, and keys of their values


class ClipModel(ModerationModel):
    name = "clip"
    scores_pixels = True

    def __init__(self, cfg: WorkerConfig, engines: ClipEngines,
                 banks: Mapping[str, PromptBank]) -> None:
        self.engines, self.banks = engines, dict(banks)
        self._limits = ImageLimits(cfg.limits.max_image_pixels, cfg.limits.max_image_side,
                                   guard_for(cfg))
        self._decode = ThreadPoolExecutor(cfg.model.decode_threads,
                                          thread_name_prefix="clip-dec")

    @classmethod
    def runtime_problems(cls, cfg: WorkerConfig, users: str) -> list[str]:
        from engines.exceptions import ModelNotFound
        from engines.models.clip import check_folder

        problems = tokenizers_missing()
        folder = settings_of(cfg).weights_dir
        try:
            if folder is None:
                raise ModelNotFound("moderation.clip.weights_dir is not set")
            check_folder(folder)
        except ModelNotFound as exc:
            problems.append(f"policies {users} run CLIP: {exc}")
        return problems

    @classmethod
    def create(cls, ctx: ModelContext) -> ClipModel:
        from worker.tasks.moderation.models.clip.engine import make_clip_engines

        engines = make_clip_engines(ctx.cfg)
        engines.image.activate()
        engines.text.runner.activate()
        try:
            banks = {name: prompt_bank(p, settings_of(ctx.cfg).neutral_prompts,
                                       engines.config.logit_scale, engines.text.embed)
                     for name, p in ctx.policies.items()}
        except BaseException:
            _deactivate(engines)
            raise
        return cls(ctx.cfg, engines, banks)

    def feeds(self, job: ModerationJob) -> bool:
        return bool(job.image)

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {IMAGE: self.engines.image_profiles, CAPTION: self.engines.text.profiles}

    def parts(self, state: JobState) -> list[Part]:
        size = self.engines.image_size
        parts = [Part(state, self.name, IMAGE, (3, size, size), key=IMAGE)]
        caption = job_text(state.pending.job)
        if caption is not None:
            c = self.engines.text.tokenizer.first_chunk(caption)  # one CLIP context (77 tokens)
            parts.append(Part(state, self.name, CAPTION, (c.bucket,), key=CAPTION, payload=c))
        return parts

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        if kind == CAPTION:
            return embed_parts(self.engines.text, batch.items)
        parts = batch.items
        started = time.monotonic()
        prepared = list(self._decode.map(self._prepare, parts))
        decoded = time.monotonic() - started
        done: list[Finished] = [(p, x) for p, x in zip(parts, prepared, strict=True)
                                if isinstance(x, JobRejected)]
        good = [(p, x) for p, x in zip(parts, prepared, strict=True) if isinstance(x, np.ndarray)]
        if good:
            emb = self.engines.image.infer({"pixel_values": np.stack([x for _, x in good])}
                                           ).result()
            for (p, _), e in zip(good, emb["embedding"], strict=True):
                p.decoded(decoded)
                done.append((p, e))
        return done

    def _prepare(self, p: Part) -> np.ndarray | JobRejected:
        image = p.job.image
        if image is None:  # parts() is called only for jobs with an image (feeds)
            return NothingToScore("a CLIP image part of a job without an image")
        try:
            img = decode_image(image, self._limits)
        except JobRejected as exc:
            return exc
        return preprocess_clip(img, self.engines.image_size)

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        return self.banks[policy].scores(values[IMAGE], values.get(CAPTION))

    def score_pixels(self, policy: str, pixels: Any, captions: Sequence[str]
                     ) -> list[dict[str, float]]:
        """Generated images with their prompts as captions: the scores a moderation job with
        the image and the prompt as its text gets (zero-shot labels and ``consistency``).
        Pixels on a device other than the CPU are preprocessed there
        (:mod:`.gpu_preprocess`) and only CLIP's input comes to the host, which the runners
        take; host pixels go through Pillow as a decoded job image does, without torch."""
        if not captions:
            return []
        size = self.engines.image_size
        device = getattr(pixels, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            from worker.tasks.moderation.models.clip.gpu_preprocess import preprocess_generated

            rows = preprocess_generated(pixels, size).cpu().numpy()
        else:
            rows = preprocess_pixels(np.asarray(pixels), size)
        images = self._embed_images(rows)
        texts = self.engines.text.embed(list(captions))
        bank = self.banks[policy]
        return [bank.scores(i, c) for i, c in zip(images, texts, strict=True)]

    def _embed_images(self, rows: np.ndarray) -> np.ndarray:
        """Image embeddings of preprocessed ``rows``, in calls of the largest batch the image
        engine's profiles take (a batch of generated images may hold more)."""
        step = max(p.max_batch for p in self.engines.image_profiles)
        return np.concatenate([
            self.engines.image.infer({"pixel_values": rows[lo:lo + step]}).result()["embedding"]
            for lo in range(0, len(rows), step)])

    def identity(self) -> tuple[str, str]:
        e = self.engines
        return "clip", f"{e.image.engine_hash}|{e.text.runner.engine_hash}"

    def close(self) -> None:
        try:
            self._decode.shutdown(wait=True)
        finally:
            _deactivate(self.engines)


def _deactivate(engines: ClipEngines) -> None:
    engines.image.deactivate()
    engines.text.runner.deactivate()
