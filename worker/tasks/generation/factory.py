"""The generation task a worker serves (``processing.task = "generation"``), for
:mod:`worker.tasks.registry`."""

from __future__ import annotations

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.tasks.batched import make_batcher
from worker.tasks.generation.setup import make_generation_task
from worker.tasks.generation.task import GenerationPending, GenerationTask
from worker.tasks.protocol import TaskTopics


def generation_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                    runner: Runner | None = None) -> GenerationTask:
    """Text-to-image jobs from ``generation.topics``, one batcher queue per resolution, at most
    ``generation.max_images_per_batch`` images a batch, each job weighed by its images.
    ``runner`` is moderation's (unused)."""
    del runner
    task = make_generation_task(cfg)
    g = cfg.generation.topics
    task.serve(TaskTopics(g.jobs, g.results, g.dlq),
               make_batcher(cfg.batch, task.batcher_profiles(),
                            max_batch_size=task.max_jobs_per_batch,
                            expire_deadlines=not ignore_deadlines,
                            weight=GenerationPending.images,
                            max_weight=cfg.generation.max_images_per_batch),
               max_message_bytes=cfg.limits.max_message_bytes)
    return task
