"""The CLIP image and text engines from ``moderation.clip`` (a local Hugging Face folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.backends.base import Runner
from engines.cache import EngineCache
from engines.models.clip import ClipConfig, build_towers, check_folder, read_config
from engines.models.clip.spec import clip_specs
from engines.profiles import Profile
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer
from engines.weights import WeightsFromPath
from worker.config import WorkerConfig
from worker.exceptions import ConfigError
from worker.moderation_engines import TextEngine, engine_backend, make_runner, shape_profiles


@dataclass
class ClipEngines:
    image: Runner
    image_spec: EngineSpec
    image_profiles: tuple[Profile, ...]
    text: TextEngine
    config: ClipConfig

    @property
    def image_size(self) -> int:
        return self.config.vision.image_size


class _Towers:
    """Builds both towers once and hands out each (the torch runners need one module each)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._built: tuple[Any, Any, ClipConfig] | None = None

    def get(self, index: int) -> Any:
        if self._built is None:
            self._built = build_towers(self.folder)
        return self._built[index]


def make_clip_engines(cfg: WorkerConfig) -> ClipEngines:
    s = cfg.moderation.clip
    if s.weights_dir is None:
        raise ConfigError("moderation.clip.weights_dir is not set")
    folder = s.weights_dir
    check_folder(folder)
    config = read_config(folder)  # logit scale read from the weights once the towers load
    image_spec, text_spec = clip_specs(EngineCache(cfg.engines.cache_dir), folder)
    backend = engine_backend(cfg, s.backend)
    size = config.vision.image_size
    image_profiles = shape_profiles("px", [(3, size, size)], s.batch_sizes, backend)
    text_profiles = shape_profiles("tok", [(b,) for b in s.token_buckets], s.batch_sizes,
                                   backend)
    towers, weights = _Towers(folder), WeightsFromPath(folder / "model.safetensors")
    image = make_runner(cfg, image_spec, lambda: towers.get(0), lambda: weights().sha256,
                        image_profiles, backend, s.precision)
    text_runner = make_runner(cfg, text_spec, lambda: towers.get(1), lambda: weights().sha256,
                              text_profiles, backend, s.precision)
    tokenizer = TextTokenizer(folder / "tokenizer.json", buckets=tuple(s.token_buckets),
                              pad_id=_pad_id(folder))
    text = TextEngine(text_runner, text_spec, tokenizer, text_profiles, s.batch_sizes[-1])
    return ClipEngines(image, image_spec, image_profiles, text, config)


def _pad_id(folder: Path) -> int:
    """CLIP pads with its end-of-text token; any id works (attention is causal, the pooled
    token is the last real one), but a real vocabulary id keeps every row valid."""
    import json

    raw = json.loads((folder / "config.json").read_text()).get("text_config", {})
    return int(raw.get("pad_token_id", 1) or 0)
