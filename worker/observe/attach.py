"""Put a worker's metrics and health on its HTTP port (``metrics.port``; 0: none): one port
however many task loops the process runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from worker.loop.refusal import watch_refusal
from worker.observe.collector import TasksCollector, WorkerCollector
from worker.observe.health import Health, TasksHealth
from worker.observe.server import ObserveServer

log = structlog.get_logger("worker")


def health_of(worker: Any) -> Health:
    m = worker.cfg.metrics
    refused = watch_refusal(worker)  # READ on the jobs topic or the group (the ACLs)
    return Health(worker.vitals, heartbeat_timeout_s=m.heartbeat_timeout_s,
                  delivery_stall_s=m.delivery_stall_s,
                  fatal=lambda: worker.fatal_error,
                  oldest_unacked_s=worker.committer.unacked_for_s,
                  blocked=(worker.committer.blocked, worker.hold.reason,
                           worker.task.unavailable, refused))


def observe(worker: Any) -> ObserveServer | None:
    """Start serving /metrics, /healthz and /readyz for ``worker`` (a
    :class:`worker.loop.worker.Worker`); None when ``metrics.port`` is 0."""
    m = worker.cfg.metrics
    if m.port == 0:
        return None
    health = health_of(worker)
    server = ObserveServer(m.host, m.port, WorkerCollector(worker, health), health).start()
    log.info("metrics_serving", host=m.host, port=server.port,
             paths=["/metrics", "/healthz", "/readyz"])
    return server


def observe_all(workers: Mapping[str, Any]) -> ObserveServer | None:
    """:func:`observe` for the loops of a process, by task name: with several, ready only
    while all are (:class:`TasksHealth`), each loop's metrics labelled ``task``
    (:class:`TasksCollector`). The first loop's ``metrics`` settings are the process's."""
    if len(workers) == 1:
        return observe(next(iter(workers.values())))
    m = next(iter(workers.values())).cfg.metrics
    if m.port == 0:
        return None
    healths = {task: health_of(w) for task, w in workers.items()}
    shares = {getattr(w.task, "gpu_share", None) for w in workers.values()} - {None}
    collector = TasksCollector({task: WorkerCollector(w, healths[task])
                                for task, w in workers.items()},
                               next(iter(shares)) if shares else None)
    server = ObserveServer(m.host, m.port, collector, TasksHealth(healths)).start()
    log.info("metrics_serving", host=m.host, port=server.port, tasks=list(workers),
             paths=["/metrics", "/healthz", "/readyz"])
    return server
