"""The moderation task a worker serves (``processing.task = "moderation"``), for
:mod:`worker.tasks.registry`: every served policy (``model.policies``, open_nsfw alone, and
``moderation.policies``) through one :class:`worker.tasks.moderation.task.ModerationTask`, its
models built from their packages (:mod:`worker.tasks.moderation.models`)."""

from __future__ import annotations

from engines.assembly import EnginePlan
from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.tasks.batched import make_batcher
from worker.tasks.moderation import models
from worker.tasks.moderation.models import make_models
from worker.tasks.moderation.served_policies import check_runtime, effective_policies
from worker.tasks.moderation.task import ModerationTask
from worker.tasks.protocol import TaskTopics


def moderation_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                    runner: Runner | None = None) -> ModerationTask:
    """``runner``: an open_nsfw runner to share, left active at close."""
    policies = effective_policies(cfg)
    check_runtime(cfg, policies)
    task = ModerationTask(cfg, policies, make_models(cfg, policies, runner=runner),
                          single_model_v1=not cfg.moderation.policies)
    task.serve(TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq),
               {kind: make_batcher(cfg.batch, profiles, expire_deadlines=not ignore_deadlines)
                for kind, profiles in task.profiles().items()},
               max_message_bytes=cfg.limits.max_message_bytes)
    return task


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The task's ``engines build`` entry: every engine of every model the served policies
    run, through each model package's own entry."""
    return models.engine_plans(cfg, effective_policies(cfg))
