"""Options and configuration shared by the admin commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from worker.config import WorkerConfig, load_config
from worker.logs import configure_logging
from worker.tasks.protocol import TaskTopics
from worker.tasks.registry import task_topics
from worker.tools.admin.errors import AdminError

# The configured task's topics, as its registry entry names them.
__all__ = ["EXIT_PROBLEM", "BootstrapOpt", "TaskOpt", "TaskTopics", "default_redrive_group",
           "load", "task_topics"]

BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap-servers", "-b", help="Kafka brokers host:port,...")
]
TaskOpt = Annotated[str | None, typer.Option(
    "--task", help="Whose topics: a task name, worker.tasks.registry (default: "
                   "processing.task).")]

# Exit status of a command that ran but found something the operator must look at.
EXIT_PROBLEM = 1


def load(config: Path | None, bootstrap: str | None, task: str | None = None) -> WorkerConfig:
    """The config as the worker would load it, with the command's overrides; brokers needed."""
    overrides: dict[str, Any] = {}
    if bootstrap:
        overrides["kafka"] = {"bootstrap_servers": bootstrap}
    if task is not None:
        overrides["processing"] = {"task": task}
    cfg = load_config(config, **overrides)
    configure_logging(cfg.log.level, cfg.log.format)
    if not cfg.kafka.bootstrap_servers:
        raise AdminError("no brokers configured: set KAFKA_BOOTSTRAP_SERVERS or pass -b")
    return cfg


def default_redrive_group(cfg: WorkerConfig) -> str:
    return f"{cfg.kafka.group_id}.redrive"

