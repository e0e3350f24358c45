"""Image-and-text moderation's models, as plug-ins: :data:`MODELS` names each one's class.

Adding a model: one module here with a :class:`~worker.tasks.moderation.models.base.
ModerationModel` subclass, and one line in :data:`MODELS`. Its name must also be in
``worker.config.policies.ModelName`` (the config validates policies without importing any
model; its informational score names, if any, go in ``INFO_LABELS`` there too). Modules are
imported only when a served policy runs their model.
"""

from __future__ import annotations

from collections.abc import Mapping

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.tasks.moderation.models.base import ModelContext, ModerationModel
from worker.tasks.registry import load_entry

MODELS: dict[str, str] = {
    "open_nsfw": "worker.tasks.moderation.models.open_nsfw.model:OpenNsfwModel",
    "text": "worker.tasks.moderation.models.text.model:TextModel",
    "clip": "worker.tasks.moderation.models.clip.model:ClipModel",
}


def model_class(name: str) -> type[ModerationModel]:
    if name not in MODELS:
        raise KeyError(f"no moderation model {name!r} (known: {', '.join(MODELS)})")
    cls: type[ModerationModel] = load_entry(MODELS[name])
    return cls


def policies_running(policies: Mapping[str, PolicySettings], model: str
                     ) -> dict[str, PolicySettings]:
    """The policies that run ``model``, by name."""
    return {n: p for n, p in sorted(policies.items()) if model in p.models}


def models_in_order(policies: Mapping[str, PolicySettings]) -> list[str]:
    """The models the policies run, in :data:`MODELS` order (unregistered names last)."""
    wanted: set[str] = {m for p in policies.values() for m in p.models}
    return [m for m in MODELS if m in wanted] + sorted(wanted - set(MODELS))


def make_models(cfg: WorkerConfig, policies: Mapping[str, PolicySettings], *,
                runner: Runner | None = None) -> dict[str, ModerationModel]:
    """The plug-ins ``policies`` run, built and activated, by name in :data:`MODELS` order
    (``runner``: an open_nsfw runner to share). If one fails to build, those built are
    closed."""
    built: dict[str, ModerationModel] = {}
    try:
        for name in models_in_order(policies):
            built[name] = model_class(name).create(
                ModelContext(cfg, policies_running(policies, name), runner))
    except BaseException:
        close_models(built)
        raise
    return built


def close_models(models: Mapping[str, ModerationModel]) -> None:
    """Close every model, even if one raises (the first error is raised after)."""
    error: BaseException | None = None
    for model in models.values():
        try:
            model.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            error = error or exc
    if error is not None:
        raise error
