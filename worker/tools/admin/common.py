"""Options and configuration shared by the admin commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from worker.config import WorkerConfig, load_config
from worker.logs import configure_logging
from worker.tools.admin.errors import AdminError

BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap-servers", "-b", help="Kafka brokers host:port,...")
]
TaskOpt = Annotated[str | None, typer.Option(
    "--task", help="Whose topics: moderation or generation (default: processing.task).")]

# Exit status of a command that ran but found something the operator must look at.
EXIT_PROBLEM = 1


@dataclass(frozen=True, slots=True)
class TaskTopics:
    jobs: str
    results: str
    dlq: str


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


def task_topics(cfg: WorkerConfig) -> TaskTopics:
    """The jobs, results and DLQ topics of the configured task (``processing.task``)."""
    if cfg.processing.task == "generation":
        g = cfg.generation.topics
        return TaskTopics(g.jobs, g.results, g.dlq)
    t = cfg.topics
    return TaskTopics(t.jobs, t.results, t.dlq)


def default_redrive_group(cfg: WorkerConfig) -> str:
    return f"{cfg.kafka.group_id}.redrive"

