"""Put a worker's metrics and health on its HTTP port (``metrics.port``; 0: none)."""

from __future__ import annotations

from typing import Any

import structlog

from worker.loop.refusal import watch_refusal
from worker.observe.collector import WorkerCollector
from worker.observe.health import Health
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
