"""The text model's engine (MiniLM) from ``moderation.text``: runner, tokenizer, profiles.

Backends: the engine follows ``model.backend`` unless its section names one
(:func:`worker.tasks.moderation.engine_params.engine_backend`). The engine itself (spec,
token-bucket profiles, cache, runner) comes from :mod:`engines.models.minilm.engine`; this
module maps the config onto its parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.assembly import EnginePlan
from engines.backends.base import Runner
from engines.models.minilm.engine import minilm_plan, minilm_tokenizer
from engines.profiles import Profile
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer
from worker.config import WorkerConfig
from worker.tasks.moderation.engine_params import tower_params
from worker.tasks.moderation.models.text.scoring import embed_texts
from worker.tasks.moderation.models.text.settings import settings_of


@dataclass
class TextEngine:
    """A text tower (MiniLM, or CLIP's) with its tokenizer: text -> unit embeddings."""

    runner: Runner
    spec: EngineSpec
    tokenizer: TextTokenizer
    profiles: tuple[Profile, ...]
    max_batch: int

    def embed(self, texts: list[str]) -> np.ndarray:
        return embed_texts(self.runner, self.tokenizer, texts, self.max_batch)


def engine_plan(cfg: WorkerConfig) -> EnginePlan:
    s = settings_of(cfg)
    return minilm_plan(tower_params(cfg, s.backend, s.precision), token_buckets=s.token_buckets,
                       batch_sizes=s.batch_sizes, folder=s.model_dir)


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The model's ``engines build`` entry: its one engine."""
    return {"text": engine_plan(cfg)}


def make_text_engine(cfg: WorkerConfig) -> TextEngine:
    s = settings_of(cfg)
    plan = engine_plan(cfg)
    tokenizer = minilm_tokenizer(token_buckets=s.token_buckets, overlap=s.overlap_tokens,
                                 folder=s.model_dir)
    return TextEngine(plan.runner(), plan.spec, tokenizer, plan.profiles, s.batch_sizes[-1])
