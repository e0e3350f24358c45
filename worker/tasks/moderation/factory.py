"""The moderation task a worker serves (``processing.task = "moderation"``), for
:mod:`worker.tasks.registry`.

With no ``[moderation.policies]``: open_nsfw alone, one batcher in front of its engine
(:class:`worker.tasks.moderation.open_nsfw.OpenNsfwTask`, or its GPU pipeline subclass on the
torch backend). Otherwise image-and-text moderation
(:class:`worker.tasks.moderation.policy_task.PolicyModerationTask`): every policy
(``model.policies`` too) runs through it, its models built as plug-ins.
"""

from __future__ import annotations

from engines.backends.base import Runner
from worker.config import WorkerConfig
from worker.tasks.batched import make_batcher
from worker.tasks.protocol import Task, TaskTopics


def moderation_task(cfg: WorkerConfig, *, ignore_deadlines: bool = False,
                    runner: Runner | None = None) -> Task:
    """``runner``: an open_nsfw runner to share, left active at close."""
    if cfg.moderation.policies:
        from worker.tasks.moderation.models import make_models
        from worker.tasks.moderation.policy_task import PolicyModerationTask
        from worker.tasks.moderation.served_policies import check_runtime, effective_policies

        policies = effective_policies(cfg)
        check_runtime(cfg, policies)
        return PolicyModerationTask(cfg, policies, make_models(cfg, policies, runner=runner),
                                    expire_deadlines=not ignore_deadlines)
    from worker.tasks.moderation.open_nsfw_gpu import make_open_nsfw_task

    task = make_open_nsfw_task(cfg, runner)
    task.serve(TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq),
               make_batcher(cfg.batch, task.profiles, expire_deadlines=not ignore_deadlines),
               max_message_bytes=cfg.limits.max_message_bytes)
    return task
