"""Names the config checks against the registries that define them, never against lists of its
own: backends (:data:`engines.backends.registry.BACKENDS`), tasks
(:data:`worker.tasks.registry.TASKS`) and moderation models
(:data:`worker.tasks.moderation.models.MODELS`).

The registries are read when a value is validated, not when the config is imported: the task and
model registries import the config themselves, and a model registered at run time (a plug-in, a
test's model) is known from then on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

if TYPE_CHECKING:
    from worker.tasks.moderation.models.package import ModelPackage


def _known(kind: str, name: str, known: list[str]) -> str:
    if name not in known:
        raise ValueError(f"unknown {kind} {name!r} (known: {', '.join(known)})")
    return name


def backend_name(name: str) -> str:
    from engines.backends.registry import BACKENDS

    return _known("backend", name, list(BACKENDS))


def task_name(name: str) -> str:
    from worker.tasks.registry import TASKS

    return _known("task", name, list(TASKS))


def task_names(value: object) -> object:
    """One task name or several, comma-separated, each registered and none twice; kept as the
    comma-separated names without blanks."""
    if not isinstance(value, str):
        return value  # (pydantic's own str check says what is wrong)
    names = [n.strip() for n in value.split(",")]
    if not all(names):
        raise ValueError(f"task {value!r}: an empty name (names are separated by commas)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"task {value!r} names {', '.join(twice)} twice")
    for name in names:
        task_name(name)
    return ",".join(names)


def model_name(name: str) -> str:
    from worker.tasks.moderation.models import MODELS

    return _known("model", name, list(MODELS))


def model_package(name: str) -> ModelPackage:
    """The registry record of a model (its name already validated)."""
    from worker.tasks.moderation.models import package

    return package(name)


def model_packages() -> list[ModelPackage]:
    """Every registered model's record, in registry order."""
    from worker.tasks.moderation.models import MODELS

    return list(MODELS.values())


BackendName = Annotated[str, AfterValidator(backend_name)]
TaskName = Annotated[str, AfterValidator(task_name)]
ModelName = Annotated[str, AfterValidator(model_name)]
