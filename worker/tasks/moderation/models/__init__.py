"""Image-and-text moderation's models: a package each, known by one line in :data:`MODELS`.

A model package (``models/<name>/``) owns everything about its model: its config section
(``moderation.<name>``, a :class:`worker.config.moderation.ModelSection`), its preprocessing,
engine plans and ``engines build`` entry, the parts it makes of a job, its scoring and any
policy rule it adds. Its ``__init__.py`` declares it in a
:class:`~worker.tasks.moderation.models.package.ModelPackage` record (``PACKAGE``); the name in
:data:`SHIPPED` makes it known to the config, the task, the policies and the tools. A package
outside this folder (a plug-in) is known through an entry point in :data:`ENTRY_POINT_GROUP`
naming its record, found when this module is imported, or through :func:`register`. Only
records and settings classes are imported to know a model; its engines and runtime modules
load when a served policy runs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from worker.tasks.moderation.models.package import ModelPackage

if TYPE_CHECKING:
    from engines.assembly import EnginePlan
    from engines.backends.base import Runner
    from worker.config import WorkerConfig
    from worker.config.policies import PolicySettings
    from worker.tasks.moderation.models.base import ModerationModel

# The packages under this folder, in the order their engines build and their parts batch.
SHIPPED = ("open_nsfw", "text", "clip")


def _record(name: str) -> ModelPackage:
    package: ModelPackage = importlib.import_module(f"{__name__}.{name}").PACKAGE
    return package


MODELS: dict[str, ModelPackage] = {p.name: p for p in map(_record, SHIPPED)}

# Installed distributions declare plug-in models here, e.g. in pyproject.toml:
#   [project.entry-points."kafka_trt_worker.moderation_models"]
#   mymodel = "mypackage.mymodel:PACKAGE"
ENTRY_POINT_GROUP = "kafka_trt_worker.moderation_models"


def register(package: ModelPackage) -> None:
    """Make a model known (a package outside this folder: a plug-in, a test's model)."""
    if package.name in MODELS:
        raise ValueError(f"a model {package.name!r} is already registered")
    taken = {label for p in MODELS.values() for label in p.info_labels}
    clash = taken & (set(package.info_labels) | set(package.fixed_labels))
    if clash:
        raise ValueError(f"model {package.name!r}: labels {sorted(clash)} are already another "
                         "model's reported scores")
    MODELS[package.name] = package


def _load_plugins() -> None:
    """Register every model an installed distribution declares in :data:`ENTRY_POINT_GROUP`
    (once, when this module is imported). A plug-in that fails to load stops start-up with
    its name: a worker serving policies without one of their models would answer wrongly, not
    fail loudly."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            record = ep.load()
        except Exception as exc:  # any import error of foreign code
            raise ImportError(f"moderation model plug-in {ep.name!r} ({ep.value}) failed to "
                              f"load: {type(exc).__name__}: {exc}") from exc
        if not isinstance(record, ModelPackage) or record.name != ep.name:
            raise ImportError(f"moderation model plug-in {ep.name!r} ({ep.value}) is not a "
                              f"ModelPackage named {ep.name!r}")
        register(record)


def unregister(name: str) -> None:
    del MODELS[name]


def package(name: str) -> ModelPackage:
    if name not in MODELS:
        raise KeyError(f"no moderation model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]


def model_class(name: str) -> type[ModerationModel]:
    return package(name).model_class()


def policies_running(policies: Mapping[str, PolicySettings], model: str
                     ) -> dict[str, PolicySettings]:
    """The policies that run ``model``, by name."""
    return {n: p for n, p in sorted(policies.items()) if model in p.models}


def models_in_order(policies: Mapping[str, PolicySettings]) -> list[str]:
    """The models the policies run, in :data:`MODELS` order (unregistered names last)."""
    wanted: set[str] = {m for p in policies.values() for m in p.models}
    return [m for m in MODELS if m in wanted] + sorted(wanted - set(MODELS))


def engine_plans(cfg: WorkerConfig, policies: Mapping[str, PolicySettings]
                 ) -> dict[str, EnginePlan]:
    """Every engine the models ``policies`` run load under ``cfg``, by engine name (each
    package's ``engines build`` entry)."""
    plans: dict[str, EnginePlan] = {}
    for name in models_in_order(policies):
        for engine, plan in package(name).plans(cfg).items():
            if engine in plans:
                raise ValueError(f"engine name {engine!r} of model {name!r} is taken")
            plans[engine] = plan
    return plans


def make_models(cfg: WorkerConfig, policies: Mapping[str, PolicySettings], *,
                runner: Runner | None = None) -> dict[str, ModerationModel]:
    """The models ``policies`` run, built and activated, by name in :data:`MODELS` order
    (``runner``: an open_nsfw runner to share). If one fails to build, those built are
    closed."""
    from worker.tasks.moderation.models.base import ModelContext

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


_load_plugins()
