"""Running a batch of parts on its engine, and turning a complete job into its result."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

from engines.exceptions import InferenceFailed
from engines.profiles import Profile
from worker.clip_engines import ClipEngines
from worker.config import WorkerConfig
from worker.config.policies import ModelName
from worker.exceptions import JobRejected, NothingToScore
from worker.moderation_engines import TextEngine
from worker.tasks.batcher import Batch
from worker.tasks.moderation.clip_images import preprocess_clip
from worker.tasks.moderation.clip_scoring import PromptBank
from worker.tasks.moderation.images import ImageLimits, decode_image
from worker.tasks.moderation.parts import JobState, Part, PartKind, mark_started
from worker.tasks.moderation.policies import Decision, ScoresByModel, evaluate
from worker.tasks.moderation.text_scoring import LabelBank
from worker.wire.moderation_jobs import ModerationResult, Status, Verdict

Value: TypeAlias = np.ndarray | dict[str, float] | JobRejected | str
Finished: TypeAlias = tuple[Part, Value]


@dataclass
class Engines:
    """What the task runs: engines (already active) and each policy's label embeddings."""

    text: TextEngine | None = None
    clip: ClipEngines | None = None
    image_profiles: tuple[Profile, ...] = ()  # open_nsfw's, when a policy runs it
    image_hash: Callable[[], str] = lambda: ""
    text_banks: dict[str, LabelBank] = field(default_factory=dict)
    prompt_banks: dict[str, PromptBank] = field(default_factory=dict)

    def profiles(self) -> dict[PartKind, tuple[Profile, ...]]:
        out: dict[PartKind, tuple[Profile, ...]] = {}
        if self.image_profiles:
            out["open_nsfw"] = self.image_profiles
        if self.text is not None:
            out["text"] = self.text.profiles
        if self.clip is not None:
            out["clip_image"], out["clip_text"] = self.clip.image_profiles, self.clip.text.profiles
        return out

    def identity(self, model: ModelName) -> tuple[str, str]:
        """(model id, engine hash) for a result."""
        if model == "open_nsfw":
            return "open_nsfw", self.image_hash()
        if model == "text" and self.text is not None:
            return self.text.spec.model_id, self.text.runner.engine_hash
        assert self.clip is not None
        return "clip", f"{self.clip.image.engine_hash}|{self.clip.text.runner.engine_hash}"


class PartRunner:
    def __init__(self, cfg: WorkerConfig, engines: Engines,
                 score_images: Callable[[Batch[Part]], list[Finished]]) -> None:
        self.engines, self._score_images = engines, score_images
        self._limits = ImageLimits(cfg.limits.max_image_pixels, cfg.limits.max_image_side)
        self._decode = ThreadPoolExecutor(cfg.model.decode_threads, thread_name_prefix="mm-dec")

    def text_parts(self, state: JobState, text: str) -> list[Part]:
        assert self.engines.text is not None
        return [Part(state, "text", (c.bucket,), chunk=c, index=i)
                for i, c in enumerate(self.engines.text.tokenizer.chunks(text))]

    def clip_parts(self, state: JobState, caption: str | None) -> list[Part]:
        clip = self.engines.clip
        assert clip is not None
        parts = [Part(state, "clip_image", (3, clip.image_size, clip.image_size))]
        if caption is not None:
            c = clip.text.tokenizer.first_chunk(caption)  # one CLIP context (77 tokens)
            parts.append(Part(state, "clip_text", (c.bucket,), chunk=c))
        return parts

    def run(self, kind: PartKind, batch: Batch[Part]) -> list[Finished]:
        for part in batch.items:
            mark_started(part.state)
        if kind == "open_nsfw":
            return self._score_images(batch)
        try:
            if kind == "clip_image":
                return self._clip_images(batch.items)
            engine = self.engines.text if kind == "text" else self._clip().text
            assert engine is not None
            feeds = engine.tokenizer.pad([p.chunk for p in batch.items if p.chunk],
                                         batch.items[0].shape[0])
            emb = engine.runner.infer(feeds).result()["embedding"]
            return list(zip(batch.items, emb, strict=True))
        except InferenceFailed as exc:
            return [(p, str(exc)) for p in batch.items]

    def _clip(self) -> ClipEngines:
        assert self.engines.clip is not None
        return self.engines.clip

    def _clip_images(self, parts: list[Part]) -> list[Finished]:
        clip = self._clip()

        def prepare(p: Part) -> np.ndarray | JobRejected:
            image = p.state.pending.job.image
            if image is None:  # plan_models gives CLIP image parts only to jobs with an image
                return NothingToScore("a CLIP image part of a job without an image")
            try:
                img = decode_image(image, self._limits)
            except JobRejected as exc:
                return exc
            return preprocess_clip(img, clip.image_size)

        prepared = list(self._decode.map(prepare, parts))
        done: list[Finished] = [(p, x) for p, x in zip(parts, prepared, strict=True)
                                if isinstance(x, JobRejected)]
        good = [(p, x) for p, x in zip(parts, prepared, strict=True) if isinstance(x, np.ndarray)]
        if good:
            emb = clip.image.infer({"pixel_values": np.stack([x for _, x in good])}).result()
            done += [(p, e) for (p, _), e in zip(good, emb["embedding"], strict=True)]
        return done

    @staticmethod
    def apply(part: Part, value: Value) -> None:
        s = part.state
        if isinstance(value, JobRejected):
            s.rejection = value
        elif isinstance(value, str):
            s.error = value
        elif isinstance(value, dict):
            s.nsfw = value
        elif part.kind == "text":
            s.text[part.index] = value
        elif part.kind == "clip_image":
            s.clip_image = value
        else:
            s.clip_caption = value


def scores_of(engines: Engines, state: JobState) -> ScoresByModel:
    name = state.pending.job.policy
    out: dict[ModelName, dict[str, float]] = {}
    if state.nsfw is not None:
        out["open_nsfw"] = state.nsfw
    if state.text:
        out["text"] = engines.text_banks[name].scores(np.stack([state.text[i]
                                                                 for i in sorted(state.text)]))
    if state.clip_image is not None:
        out["clip"] = engines.prompt_banks[name].scores(state.clip_image, state.clip_caption)
    return out


def decide(engines: Engines, state: JobState, now_ms: int
           ) -> tuple[ModerationResult, Decision | None]:
    p, now = state.pending, time.monotonic()
    started = state.started or now
    timings = {"queue": (started - p.consumed_at) * 1e3, "infer": (now - started) * 1e3,
               "total": (now - p.consumed_at) * 1e3}

    def result(status: Status, model_id: str = "-", engine_hash: str = "-", *,
               verdict: Verdict | None = None, scores: dict[str, float] | None = None,
               error: str | None = None, rule: str | None = None,
               models: tuple[str, ...] = ()) -> ModerationResult:
        return ModerationResult(id=p.job.id, status=status, policy=p.job.policy,
                                model_id=model_id, engine_hash=engine_hash, source=p.ref,
                                timings_ms=timings, verdict=verdict, scores=scores or {},
                                error=error, rule=rule, models=models)

    if state.expired:
        late = now_ms - (p.job.deadline_ms or now_ms)
        return result(Status.EXPIRED, error=f"deadline passed {late} ms before all parts of "
                                            "the job reached their engines"), None
    if state.error is not None:
        return result(Status.ERROR, error=state.error), None
    decision = evaluate(state.policy, scores_of(engines, state))
    ids = [engines.identity(m) for m in decision.models_run]
    return result(Status.OK, "+".join(i for i, _ in ids), "+".join(h for _, h in ids),
                  verdict=decision.verdict, scores=decision.label_scores,
                  rule=decision.rule, models=decision.models_run), decision
