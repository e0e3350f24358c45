"""One config per task a process serves (``processing.task``, one name or several).

With several tasks each loop gets the process's config with ``processing.task`` set to its own
task, and a consumer group of its own: two tasks in one group would split each other's
partitions, and a member subscribed to only one of the topics would be assigned partitions of
the other and never read them. The first task named keeps ``kafka.group_id``; every other one
uses ``<group_id>-<task>``. Exactly-once's ``transactional.id`` is
``<prefix>.<group_id>.<instance_id>`` (:func:`worker.kafka.clients.transactional_id`), so it
differs per task too: two loops sharing one would fence each other's producer.
"""

from __future__ import annotations

from worker.config import WorkerConfig


def group_id_of(cfg: WorkerConfig, task: str) -> str:
    """The consumer group ``task`` reads in, served by a process with config ``cfg``."""
    tasks = cfg.processing.tasks
    if task not in tasks:
        raise ValueError(f"task {task!r} is not served by this config ({cfg.processing.task})")
    return cfg.kafka.group_id if task == tasks[0] else f"{cfg.kafka.group_id}-{task}"


def per_task(cfg: WorkerConfig) -> dict[str, WorkerConfig]:
    """Each served task's config, in the order named; ``{task: cfg}`` itself with one task."""
    tasks = cfg.processing.tasks
    if len(tasks) == 1:
        return {tasks[0]: cfg}
    return {task: cfg.model_copy(update={
        "processing": cfg.processing.model_copy(update={"task": task}),
        "kafka": cfg.kafka.model_copy(update={"group_id": group_id_of(cfg, task)})})
        for task in tasks}
