"""The policies a worker serves, and the start-up checks that they can actually run.

``model.policies`` (open_nsfw thresholds by name, the walking skeleton's policies) become
open_nsfw-only policies; ``moderation.policies`` are added on top, a name there replacing the
same name from ``model.policies``. Start-up refuses (ConfigError) a policy whose model cannot
run here (each model plug-in says why: the text model without its package, CLIP without a
complete weights folder, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.config import WorkerConfig
from worker.config.policies import LabelSettings, PolicySettings
from worker.exceptions import ConfigError


def effective_policies(cfg: WorkerConfig) -> dict[str, PolicySettings]:
    # model.policies are open_nsfw's thresholds ([model] is its section), so this one place
    # names it and its label.
    legacy = {name: PolicySettings(models=["open_nsfw"], labels={
        "nsfw": LabelSettings(review=t.review, block=t.block)})
        for name, t in cfg.model.policies.items()}
    return {**legacy, **cfg.moderation.policies}


def models_needed(policies: Mapping[str, PolicySettings]) -> set[str]:
    return {m for p in policies.values() for m in p.models}


def check_runtime(cfg: WorkerConfig, policies: Mapping[str, PolicySettings]) -> None:
    """Raise ConfigError naming the policies that need something missing on this machine."""
    from worker.tasks.moderation.models import model_class, models_in_order, policies_running

    problems: list[str] = []
    for model in models_in_order(policies):
        users = ", ".join(repr(n) for n in policies_running(policies, model))
        problems += [p for p in model_class(model).runtime_problems(cfg, users)
                     if p not in problems]
    if problems:
        raise ConfigError("cannot serve the configured policies:\n  " + "\n  ".join(problems))
