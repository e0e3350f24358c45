"""The MiniLM text engine from plain parameters: its plan (spec, token-bucket profiles) and its
tokenizer (sentence chunks in the same buckets)."""

from __future__ import annotations

from pathlib import Path

from engines.assembly import EngineParams, EnginePlan, bucket_profiles
from engines.cache import EngineCache
from engines.models.minilm.spec import bundled_model_dir, minilm_spec
from engines.tokens import TextTokenizer


def minilm_plan(params: EngineParams, *, token_buckets: list[int], batch_sizes: list[int],
                folder: Path | None = None) -> EnginePlan:
    """``folder`` overrides the bundled files (another Hugging Face BERT sentence encoder)."""
    spec = minilm_spec(EngineCache(params.cache_dir), folder)
    profiles = bucket_profiles("tok", [(b,) for b in token_buckets], batch_sizes, params.backend)
    return EnginePlan(spec, profiles, params)


def minilm_tokenizer(*, token_buckets: list[int], overlap: int, folder: Path | None = None
                     ) -> TextTokenizer:
    src = folder or bundled_model_dir()
    return TextTokenizer(src / "tokenizer.json", buckets=tuple(token_buckets), overlap=overlap)
