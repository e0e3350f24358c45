"""Which task a worker process serves: ``processing.task``, looked up in :data:`TASKS`.

- ``"moderation"`` (default): moderation jobs from ``topics``, every policy (``model.policies``
  and ``moderation.policies``) through one task
  (:class:`worker.tasks.moderation.task.ModerationTask`), scored by its models' packages
  (:mod:`worker.tasks.moderation.models`).
- ``"generation"``: text-to-image jobs from ``generation.topics``.

Each entry names its factory as ``"module:function"``, imported only when that task is served:
a moderation worker never imports generation's modules (nor torch on the CPU path).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.tasks.protocol import Task

TASKS: dict[str, str] = {
    "moderation": "worker.tasks.moderation.factory:moderation_task",
    "generation": "worker.tasks.generation.factory:generation_task",
}


class TaskFactory(Protocol):
    def __call__(self, cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                 runner: Runner | None = None) -> Task: ...


def load_entry(entry: str) -> Any:
    """The object a registry entry ``"package.module:name"`` names (its module imported now)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def make_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
              runner: Runner | None = None) -> Task:
    """The task this process serves (engines built or loaded from the cache, not activated:
    :meth:`Task.warm_up` does that). ``ignore_deadlines``: the batchers never expire a
    job (replay asks what the model says now, not whether it would have been in time).
    ``runner``: an open_nsfw runner to share (moderation only), left active at close."""
    entry = TASKS.get(cfg.processing.task)
    if entry is None:  # the config allows only registered names; a new one needs its entry
        raise KeyError(f"no task {cfg.processing.task!r} in the registry (known: "
                       f"{', '.join(sorted(TASKS))})")
    factory: TaskFactory = load_entry(entry)
    return factory(cfg, ignore_deadlines=ignore_deadlines, runner=runner)
