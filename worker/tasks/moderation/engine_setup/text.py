"""From the ``[moderation]`` config to the text engine (MiniLM): runner, tokenizer, profiles.

Backends: a text/CLIP engine follows ``model.backend`` unless its section names one; TensorRT
machines run them on torch (the TensorRT path for these models is not built yet). The engines
themselves (spec, token-bucket profiles, cache, runner) come from
:mod:`engines.models.minilm.engine`; this module maps the config onto their parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.assembly import EngineParams
from engines.backends.base import Runner
from engines.backends.registry import backend as registered
from engines.models.minilm.engine import minilm_plan, minilm_tokenizer
from engines.profiles import Profile
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer
from worker.config import WorkerConfig
from worker.tasks.moderation.engine_setup.open_nsfw import engine_params
from worker.tasks.moderation.scoring.text import embed_texts


def engine_backend(cfg: WorkerConfig, explicit: str | None) -> str:
    return explicit or ("onnxruntime" if cfg.model.backend == "onnxruntime" else "torch")


def tower_params(cfg: WorkerConfig, explicit_backend: str | None,
                 precision: str | None) -> EngineParams:
    """A text or CLIP tower's engine parameters (fp16 on torch unless the section says)."""
    backend = engine_backend(cfg, explicit_backend)
    return engine_params(cfg, backend, registered(backend).precision(precision))


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


def make_text_engine(cfg: WorkerConfig) -> TextEngine:
    s = cfg.moderation.text
    plan = minilm_plan(tower_params(cfg, s.backend, s.precision), token_buckets=s.token_buckets,
                       batch_sizes=s.batch_sizes, folder=s.model_dir)
    tokenizer = minilm_tokenizer(token_buckets=s.token_buckets, overlap=s.overlap_tokens,
                                 folder=s.model_dir)
    return TextEngine(plan.runner(), plan.spec, tokenizer, plan.profiles, s.batch_sizes[-1])
