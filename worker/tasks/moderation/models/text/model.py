"""The text model (MiniLM) as a moderation model: one part per text chunk.

A job's text is chunked (``moderation.text``; more than ``max_chunks`` chunks is refused at
intake), each chunk embedded, and each policy label scored by calibrated similarity to its
descriptions, max over chunks (:mod:`worker.tasks.moderation.models.text.scoring`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.exceptions import TextTooLong
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import (
    Finished,
    ModelContext,
    ModerationModel,
    embed_parts,
    tokenizers_missing,
)
from worker.tasks.moderation.models.text.engine import TextEngine
from worker.tasks.moderation.models.text.scoring import LabelBank, embed_chunks, label_bank
from worker.tasks.moderation.models.text.settings import settings_of
from worker.tasks.moderation.parts import JobState, Part, job_text
from worker.wire.moderation_jobs import ModerationJob

TEXT_KIND = "text"


class TextModel(ModerationModel):
    name = "text"
    scores_texts = True  # a prompt is a text like a job's

    def __init__(self, engine: TextEngine, banks: Mapping[str, LabelBank], max_chunks: int
                 ) -> None:
        self.engine, self.banks, self.max_chunks = engine, dict(banks), max_chunks

    @classmethod
    def runtime_problems(cls, cfg: WorkerConfig, users: str) -> list[str]:
        from engines.models import minilm

        problems = tokenizers_missing()
        if settings_of(cfg).model_dir is None and not minilm.available():
            problems.append(f"policies {users} run the text model, whose weights ship in the "
                            f"`text` extra: {minilm.EXTRA_HINT}")
        return problems

    @classmethod
    def create(cls, ctx: ModelContext) -> TextModel:
        from worker.tasks.moderation.models.text.engine import make_text_engine

        engine = make_text_engine(ctx.cfg)
        engine.runner.activate()
        try:
            banks = {name: label_bank(p, engine.embed) for name, p in ctx.policies.items()}
        except BaseException:
            engine.runner.deactivate()
            raise
        return cls(engine, banks, settings_of(ctx.cfg).max_chunks)

    def feeds(self, job: ModerationJob) -> bool:
        return job_text(job) is not None

    def check(self, job: ModerationJob) -> None:
        n = len(self.engine.tokenizer.chunks(job.text or ""))
        if n > self.max_chunks:
            raise TextTooLong(f"text makes {n} chunks, over moderation.text.max_chunks "
                              f"{self.max_chunks}")

    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        return {TEXT_KIND: self.engine.profiles}

    def parts(self, state: JobState) -> list[Part]:
        chunks = self.engine.tokenizer.chunks(state.pending.job.text or "")
        return [Part(state, self.name, TEXT_KIND, (c.bucket,), key=i, payload=c)
                for i, c in enumerate(chunks)]

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        return embed_parts(self.engine, batch.items)

    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        chunks = np.stack([values[i] for i in range(len(values))])  # keys: chunk positions
        return self.banks[policy].scores(chunks)

    def score_texts(self, policy: str, texts: Sequence[Sequence[str]]) -> list[dict[str, float]]:
        """Each item's texts chunked as a job's text is, embedded together, and scored as one
        text: each label's score is its maximum over all of the item's chunks."""
        tok = self.engine.tokenizer
        chunks = [[c for t in item if t.strip() for c in tok.chunks(t)] for item in texts]
        flat = [c for item in chunks for c in item]
        emb = embed_chunks(self.engine.runner, tok, flat, self.engine.max_batch)
        out, at = [], 0
        for item in chunks:
            if not item:  # the contract refuses a blank prompt: an item without text is a bug
                raise ValueError("score_texts: an item without text")
            out.append(self.banks[policy].scores(emb[at:at + len(item)]))
            at += len(item)
        return out

    def identity(self) -> tuple[str, str]:
        return self.engine.spec.model_id, self.engine.runner.engine_hash

    def close(self) -> None:
        self.engine.runner.deactivate()
