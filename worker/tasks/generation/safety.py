"""Moderation of generated content: a job's prompt before the UNet runs, every image before it
is published.

Nothing here knows a threshold, a label or a model by name. The policies are moderation's
(``model.policies`` and ``moderation.policies``, found by the names in
``generation.moderation``), the models are built through moderation's registry
(:func:`worker.tasks.moderation.models.make_models`), and each model says what it can score of
generated content (``ModerationModel.scores_texts`` / ``scores_pixels``). The verdict is
:func:`worker.tasks.moderation.scoring.policies.evaluate`'s, as for a moderation job.

- Prompt: the prompt and the negative prompt, scored as one text by the prompt policy's models
  that score text alone (the text model). The negative prompt is user text that steers the
  image too, so it is scored with the prompt (each label's maximum over both).
- Images: the VAE's pixels, scored by the image policy's models that score pixels (open_nsfw;
  CLIP with the prompt as the image's caption, so ``min_consistency`` sends an image that does
  not show what was asked to review).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.exceptions import ConfigError
from worker.tasks.moderation.models.base import ModerationModel
from worker.tasks.moderation.scoring.policies import evaluate
from worker.wire.generation_jobs import Check, GenerationJob

log = structlog.get_logger("worker.tasks.generation")
OFF = "off"


@dataclass
class Safety:
    """The models of the image policy and the prompt policy (either may be None: off)."""

    models: dict[str, ModerationModel]
    image_policy: str | None
    prompt_policy: str | None
    policies: dict[str, PolicySettings]
    own_models: bool = True

    def _runs(self, policy: str | None, able: str) -> list[str]:
        if policy is None:
            return []
        return [m for m in self.policies[policy].models if getattr(self.models[m], able)]

    @property
    def prompt_models(self) -> list[str]:
        return self._runs(self.prompt_policy, "scores_texts")

    @property
    def image_models(self) -> list[str]:
        return self._runs(self.image_policy, "scores_pixels")

    def check_prompts(self, jobs: Sequence[GenerationJob]) -> list[Check]:
        """One decision per job, on its prompt and negative prompt."""
        assert self.prompt_policy is not None
        texts = [[j.prompt, j.negative_prompt] for j in jobs]
        by_model = {m: self.models[m].score_texts(self.prompt_policy, texts)
                    for m in self.prompt_models}
        return [decide(self.policies[self.prompt_policy], {m: s[i] for m, s in by_model.items()})
                for i in range(len(jobs))]

    def check_images(self, pixels: Any, captions: Sequence[str]) -> list[Check]:
        """One decision per image of ``pixels`` (torch uint8 [N, H, W, 3] on any device)."""
        assert self.image_policy is not None
        by_model = {m: self.models[m].score_pixels(self.image_policy, pixels, captions)
                    for m in self.image_models}
        return [decide(self.policies[self.image_policy], {m: s[i] for m, s in by_model.items()})
                for i in range(len(captions))]

    def warm_up(self) -> None:
        for model in self.models.values():
            model.warm_up()

    def close(self) -> None:
        if self.own_models:
            from worker.tasks.moderation.models import close_models

            close_models(self.models)


def decide(policy: PolicySettings, scores_by_model: Mapping[str, Mapping[str, float]]) -> Check:
    d = evaluate(policy, scores_by_model)
    return Check(d.verdict, d.rule, d.label_scores, d.reason)


def _named(cfg: WorkerConfig, name: str, setting: str) -> PolicySettings:
    from worker.tasks.moderation.served_policies import effective_policies

    policies = effective_policies(cfg)
    if name not in policies:
        raise ConfigError(f"{setting} = {name!r} is not a configured moderation policy (known: "
                          f"{', '.join(sorted(policies)) or 'none'}; or 'off')")
    return policies[name]


def _able(policy: PolicySettings, able: str) -> list[str]:
    from worker.tasks.moderation.models import model_class

    return [m for m in policy.models if getattr(model_class(m), able)]


def resolve(cfg: WorkerConfig) -> tuple[str | None, str | None, dict[str, PolicySettings]]:
    """(image policy, prompt policy, the policies by name) from ``generation.moderation`` and
    ``generation.prompt_check``; ConfigError for a policy that is not there or cannot do its
    job (an image policy with no model that scores pixels, ``prompt_check = "on"`` with no
    model that scores text)."""
    g = cfg.generation
    m = g.moderation
    image = None if m.policy == OFF else m.policy
    prompt_name = m.policy if m.prompt_policy is None else m.prompt_policy
    prompt = None if prompt_name == OFF or g.prompt_check == OFF else prompt_name
    policies: dict[str, PolicySettings] = {}
    if image is not None:
        policies[image] = _named(cfg, image, "generation.moderation.policy")
        pixels = _able(policies[image], "scores_pixels")
        if not pixels:
            raise ConfigError(f"generation.moderation.policy = {image!r} runs no model that "
                              f"scores images ({', '.join(policies[image].models)}): name a "
                              "policy that runs one (open_nsfw, clip), or 'off'")
        # A model that neither scores pixels nor is a text model (whose part is the prompt)
        # would be left out of every image's verdict without a word: refused instead (a
        # plug-in model without score_pixels, say).
        texts = _able(policies[image], "scores_texts")
        unable = [n for n in policies[image].models if n not in pixels and n not in texts]
        if unable:
            raise ConfigError(f"generation.moderation.policy = {image!r} runs "
                              f"{', '.join(unable)}, which cannot score generated images: "
                              "name a policy without it, or 'off'")
    if prompt is not None:
        setting = "generation.moderation." + ("policy" if m.prompt_policy is None
                                              else "prompt_policy")
        policies[prompt] = _named(cfg, prompt, setting)
        if not _able(policies[prompt], "scores_texts"):
            if g.prompt_check == "on":
                raise ConfigError(f"generation.prompt_check = 'on' but {setting} = {prompt!r} "
                                  "runs no model that scores text alone (text): name one that "
                                  "does, or set generation.prompt_check = 'auto' or 'off'")
            prompt = None  # auto: no text policy, no prompt check
    elif g.prompt_check == "on":
        raise ConfigError("generation.prompt_check = 'on' needs a prompt policy: set "
                          "generation.moderation.policy (or prompt_policy)")
    return image, prompt, {n: p for n, p in policies.items() if n in (image, prompt)}


def make_safety(cfg: WorkerConfig, device: str = "cpu") -> Safety | None:
    """The models ``generation.moderation`` needs, built and activated, or None (all off).
    ``device``: where generation runs (resolved), which is where the checks run by default
    (:func:`checks_config`)."""
    from worker.tasks.moderation.models import make_models
    from worker.tasks.moderation.served_policies import check_runtime

    image, prompt, policies = resolve(cfg)
    if not policies:
        return None
    cfg = checks_config(cfg, device)
    check_runtime(cfg, policies)
    safety = Safety(make_models(cfg, policies), image, prompt, policies)
    log.info("generation_moderation", image_policy=image, image_models=safety.image_models,
             prompt_policy=prompt, prompt_models=safety.prompt_models,
             backend=cfg.model.backend, preprocess=cfg.model.preprocess)
    return safety


def checks_config(cfg: WorkerConfig, device: str) -> WorkerConfig:
    """The config the checks' models are built from: the worker's, except where generation runs
    on a CUDA device and ``model.backend`` is left unset. Then open_nsfw (and the towers that
    follow it) run on that device, through the registry's pipelined backend that needs no
    build step: the VAE's images are already there, and scoring them on the default CPU
    backend cost 3.4-4.6% of a 20-step batch on the H200 against 0.5-0.7% on the device
    (docs/generation.md), over the 3% a check may cost. A ``model.backend`` that is set is
    kept, as is the CPU where a setting the device backend refuses is set (logged)."""
    if not device.startswith("cuda") or "backend" in cfg.model.model_fields_set:
        return cfg
    from pydantic import ValidationError

    from engines.backends.registry import BACKENDS

    name = next((b.name for b in BACKENDS.values() if b.pipelined and not b.needs_artifact),
                None)
    if name is None:
        return cfg
    try:
        model = type(cfg.model).model_validate(
            {**cfg.model.model_dump(), "backend": name, "preprocess": "gpu",
             "jpeg_roundtrip": False, "device": int(device.partition(":")[2] or 0)})
    except ValidationError as exc:
        log.warning("generation_checks_on_cpu", device=device, backend=cfg.model.backend,
                    why=str(exc).splitlines()[-1].strip())
        return cfg
    return cfg.model_copy(update={"model": model})


def generated_pixels(rows: Sequence[Any]) -> Any:
    """Images of one size as the models take them: one torch uint8 tensor [N, H, W, 3], RGB.
    Rows that are torch tensors (the VAE's output where it stays on its device) are stacked
    where they live; host arrays become a CPU tensor without a copy of each row."""
    import numpy as np
    import torch

    if all(isinstance(r, torch.Tensor) for r in rows):
        return torch.stack(list(rows))
    return torch.from_numpy(np.stack(rows))
