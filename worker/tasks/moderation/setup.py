"""Start-up for image-and-text moderation: check, build and activate what the policies need,
then embed every policy's label descriptions and CLIP prompts once."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.tasks.moderation.clip_scoring import prompt_bank
from worker.tasks.moderation.part_runner import Engines
from worker.tasks.moderation.served_policies import check_runtime, models_needed
from worker.tasks.moderation.text_scoring import label_bank


def make_engines(cfg: WorkerConfig, policies: Mapping[str, PolicySettings], *,
                 image_profiles: tuple[Profile, ...] = (),
                 image_hash: Callable[[], str] = lambda: "") -> Engines:
    """Active engines for ``policies`` (ConfigError if one cannot run here)."""
    check_runtime(cfg, policies)
    needed = models_needed(policies)
    engines = Engines(image_profiles=image_profiles if "open_nsfw" in needed else (),
                      image_hash=image_hash)
    if "text" in needed:
        from worker.moderation_engines import make_text_engine

        engines.text = make_text_engine(cfg)
        engines.text.runner.activate()
    if "clip" in needed:
        from worker.clip_engines import make_clip_engines

        engines.clip = make_clip_engines(cfg)
        engines.clip.image.activate()
        engines.clip.text.runner.activate()
    for name, policy in policies.items():
        if "text" in policy.models and engines.text is not None:
            engines.text_banks[name] = label_bank(policy, engines.text.embed)
        if "clip" in policy.models and engines.clip is not None:
            engines.prompt_banks[name] = prompt_bank(
                policy, cfg.moderation.clip.neutral_prompts, engines.clip.config.logit_scale,
                engines.clip.text.embed)
    return engines


def close_engines(engines: Engines) -> None:
    if engines.text is not None:
        engines.text.runner.deactivate()
    if engines.clip is not None:
        engines.clip.image.deactivate()
        engines.clip.text.runner.deactivate()
