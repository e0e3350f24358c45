"""From the ``[moderation]`` config to the text and CLIP engines: runners, tokenizers, profiles.

Backends: a text/CLIP engine follows ``model.backend`` unless its section names one; TensorRT
machines run them on torch (the TensorRT path for these models is not built yet). Profiles
are per token-length bucket (text) or image size (CLIP image): a static bucket of batch sizes
on torch (one CUDA graph each), a range without padding on onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.backends.base import Runner
from engines.cache import BuildRecipe, CacheEntry, EngineCache, EngineFromCache
from engines.device import cpu_fingerprint
from engines.profiles import Profile, RangeProfile, StaticProfile
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer
from worker.config import WorkerConfig
from worker.text_scoring import embed_texts


def engine_backend(cfg: WorkerConfig, explicit: str | None) -> str:
    return explicit or ("onnxruntime" if cfg.model.backend == "onnxruntime" else "torch")


def shape_profiles(prefix: str, items: list[tuple[int, ...]], batch_sizes: list[int],
                   backend: str) -> tuple[Profile, ...]:
    if backend == "torch":
        return tuple(StaticProfile(f"{prefix}{i[0]}", i, tuple(batch_sizes)) for i in items)
    hi = batch_sizes[-1]
    return tuple(RangeProfile(f"{prefix}{i[0]}", i, i, i, 1, min(8, hi), hi) for i in items)


@dataclass(frozen=True)
class OrtArtifact:
    """Lazy: the ORT-optimised artifact of ``spec`` (its ONNX exported first, if need be)."""

    spec: EngineSpec
    cache: EngineCache
    profiles: tuple[Profile, ...]

    def __call__(self) -> CacheEntry:
        from engines.backends.onnxruntime import build_ort_artifact, ort_version

        recipe = BuildRecipe(
            model_id=self.spec.model_id, onnx_sha256=self.spec.onnx().sha256,
            backend="onnxruntime", backend_version=ort_version(), device=cpu_fingerprint(),
            precision="fp32", profiles=tuple(p.to_dict() for p in self.profiles),
            artifact_name="model.ort.onnx")
        return EngineFromCache(self.cache, recipe,
                               lambda out: build_ort_artifact(self.spec, out))()


def make_runner(cfg: WorkerConfig, spec: EngineSpec, build: Callable[[], object],
                identity: Callable[[], str], profiles: tuple[Profile, ...], backend: str,
                precision: str | None) -> Runner:
    if backend == "onnxruntime":
        from engines.backends.onnxruntime import OrtRunner

        cache = EngineCache(cfg.engines.cache_dir)
        engine = OrtArtifact(spec, cache, profiles) if cfg.engines.use_cache else None
        return OrtRunner(spec, intra_op_threads=cfg.model.intra_op_threads, engine=engine)
    from engines.backends.torch.module_runner import TorchModuleRunner

    return TorchModuleRunner(spec, build, profiles=profiles, identity=identity,
                             precision=precision or "fp16", device=cfg.model.device,
                             slots=cfg.engines.in_flight_slots)


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
    from engines.models import minilm

    s = cfg.moderation.text
    folder: Path = s.model_dir or minilm.bundled_model_dir()
    cache = EngineCache(cfg.engines.cache_dir)
    spec = minilm.minilm_spec(cache, s.model_dir)
    backend = engine_backend(cfg, s.backend)
    profiles = shape_profiles("tok", [(b,) for b in s.token_buckets], s.batch_sizes, backend)
    weights = minilm.weights_loader(s.model_dir)
    runner = make_runner(cfg, spec, lambda: minilm.build_encoder(folder),
                         lambda: weights().sha256, profiles, backend, s.precision)
    tokenizer = TextTokenizer(folder / "tokenizer.json", buckets=tuple(s.token_buckets),
                              overlap=s.overlap_tokens)
    return TextEngine(runner, spec, tokenizer, profiles, s.batch_sizes[-1])
