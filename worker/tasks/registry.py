"""Which task a worker process serves: ``processing.task``, looked up in :data:`TASKS`.

- ``"moderation"`` (default): moderation jobs from ``topics``, every policy (``model.policies``
  and ``moderation.policies``) through one task
  (:class:`worker.tasks.moderation.task.ModerationTask`), scored by its models' packages
  (:mod:`worker.tasks.moderation.models`).
- ``"generation"``: text-to-image jobs from ``generation.topics``.

Each entry names its factory and its ``engines build`` entry as ``"module:function"``, imported
only when used: a moderation worker never imports generation's modules (nor torch on the CPU
path). What the tools ask of a task (its topics, the config section its engine options live
in, its backend) is read from the entry, so nothing else branches on the task's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from worker.tasks.protocol import TaskTopics

if TYPE_CHECKING:
    from engines.assembly import EnginePlan
    from engines.backends.base import Runner
    from worker.config import WorkerConfig
    from worker.tasks.protocol import Task


class TaskFactory(Protocol):
    def __call__(self, cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                 runner: Runner | None = None) -> Task: ...


@dataclass(frozen=True)
class TaskEntry:
    """``factory``: ``(cfg, *, ignore_deadlines, runner) -> Task``. ``engine_plans``:
    ``(cfg) -> {engine name: EnginePlan}``, every engine the task loads under ``cfg`` (what
    ``trt-worker engines build`` builds). ``engine_section``: the config section whose
    ``backend``/``precision`` the tools' options set. ``topics``: its jobs, results and DLQ
    topics. ``backend``: the backend its engines run on (the info metric). ``yields_gpu``:
    served beside other tasks in one process, its steps wait for their batches in flight
    (:mod:`worker.tasks.gpu_share`): long batches that would hold short ones up."""

    factory: str
    engine_plans: str
    engine_section: str
    topics: Callable[[WorkerConfig], TaskTopics]
    backend: Callable[[WorkerConfig], str]
    yields_gpu: bool = False


TASKS: dict[str, TaskEntry] = {
    "moderation": TaskEntry(
        factory="worker.tasks.moderation.factory:moderation_task",
        engine_plans="worker.tasks.moderation.factory:engine_plans",
        engine_section="model",
        topics=lambda cfg: TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq),
        backend=lambda cfg: cfg.model.backend),
    "generation": TaskEntry(
        factory="worker.tasks.generation.factory:generation_task",
        engine_plans="worker.tasks.generation.setup:engine_plans",
        engine_section="generation",
        topics=lambda cfg: TaskTopics(cfg.generation.topics.jobs, cfg.generation.topics.results,
                                      cfg.generation.topics.dlq),
        backend=lambda cfg: cfg.generation.backend,
        yields_gpu=True),
}


def load_entry(entry: str) -> Any:
    """The object a registry entry ``"package.module:name"`` names (its module imported now)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def task_entry(name: str) -> TaskEntry:
    entry = TASKS.get(name)
    if entry is None:  # the config allows only registered names; a new one needs its entry
        raise KeyError(f"no task {name!r} in the registry (known: {', '.join(sorted(TASKS))})")
    return entry


def only_task(cfg: WorkerConfig) -> TaskEntry:
    """The entry of the one task ``cfg`` serves; a config serving several is refused: the
    tools that ask (engines build, topics, lag, redrive, replay) work on one task."""
    tasks = cfg.processing.tasks
    if len(tasks) != 1:
        from worker.exceptions import ConfigError

        raise ConfigError(f"processing.task names several tasks ({cfg.processing.task}): "
                          "this command works on one; name it with --task where the command "
                          "has it, else KTW_PROCESSING__TASK")
    return task_entry(tasks[0])


def task_topics(cfg: WorkerConfig) -> TaskTopics:
    """The jobs, results and DLQ topics of the configured task."""
    return only_task(cfg).topics(cfg)


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """Every engine the configured task loads, by name (``trt-worker engines build``)."""
    plans: dict[str, EnginePlan] = load_entry(only_task(cfg).engine_plans)(cfg)
    return plans


def make_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
              runner: Runner | None = None) -> Task:
    """The task this process serves (engines built or loaded from the cache, not activated:
    :meth:`Task.warm_up` does that). ``ignore_deadlines``: the batchers never expire a
    job (replay asks what the model says now, not whether it would have been in time).
    ``runner``: an open_nsfw runner to share (moderation only), left active at close."""
    factory: TaskFactory = load_entry(only_task(cfg).factory)
    return factory(cfg, ignore_deadlines=ignore_deadlines, runner=runner)
