"""The CLIP engines from plain parameters: the image and text towers' plans (specs, image-size
and token-bucket profiles), the checkpoint's config and the caption tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engines.assembly import EngineParams, EnginePlan, bucket_profiles
from engines.cache import EngineCache
from engines.models.clip.build import ClipConfig, pad_token_id, read_config
from engines.models.clip.spec import clip_specs
from engines.tokens import TextTokenizer


@dataclass(frozen=True)
class ClipPlans:
    image: EnginePlan
    text: EnginePlan
    config: ClipConfig  # the logit scale is read from the weights once the towers load


def clip_plans(params: EngineParams, folder: Path, *, token_buckets: list[int],
               batch_sizes: list[int]) -> ClipPlans:
    image_spec, text_spec = clip_specs(EngineCache(params.cache_dir), folder)
    config = read_config(folder)
    size = config.vision.image_size
    image = bucket_profiles("px", [(3, size, size)], batch_sizes, params.backend)
    text = bucket_profiles("tok", [(b,) for b in token_buckets], batch_sizes, params.backend)
    return ClipPlans(EnginePlan(image_spec, image, params), EnginePlan(text_spec, text, params),
                     config)


def clip_tokenizer(folder: Path, *, token_buckets: list[int]) -> TextTokenizer:
    return TextTokenizer(folder / "tokenizer.json", buckets=tuple(token_buckets),
                         pad_id=pad_token_id(folder))
