"""The CLIP image and text engines from ``moderation.clip`` (a local Hugging Face folder); the
engines come from :mod:`engines.models.clip.engine`, this module maps the config onto them."""

from __future__ import annotations

from dataclasses import dataclass

from engines.assembly import EnginePlan
from engines.backends.base import Runner
from engines.models.clip import ClipConfig
from engines.models.clip.engine import ClipPlans, clip_plans, clip_tokenizer
from engines.profiles import Profile
from engines.spec import EngineSpec
from worker.config import WorkerConfig
from worker.exceptions import ConfigError
from worker.tasks.moderation.engine_params import tower_params
from worker.tasks.moderation.models.clip.settings import settings_of
from worker.tasks.moderation.models.text.engine import TextEngine


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


def plans_of(cfg: WorkerConfig) -> ClipPlans:
    s = settings_of(cfg)
    if s.weights_dir is None:
        raise ConfigError("moderation.clip.weights_dir is not set")
    return clip_plans(tower_params(cfg, s.backend, s.precision), s.weights_dir,
                      token_buckets=s.token_buckets, batch_sizes=s.batch_sizes)


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The model's ``engines build`` entry: its image and text towers."""
    plans = plans_of(cfg)
    return {"clip_image": plans.image, "clip_text": plans.text}


def make_clip_engines(cfg: WorkerConfig) -> ClipEngines:
    s = settings_of(cfg)
    plans = plans_of(cfg)
    assert s.weights_dir is not None  # plans_of refuses a missing folder
    tokenizer = clip_tokenizer(s.weights_dir, token_buckets=s.token_buckets)
    text = TextEngine(plans.text.runner(), plans.text.spec, tokenizer, plans.text.profiles,
                      s.batch_sizes[-1])
    return ClipEngines(plans.image.runner(), plans.image.spec, plans.image.profiles, text,
                       plans.config)
