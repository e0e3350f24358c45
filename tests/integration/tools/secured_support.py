"""A worker configured as a least-privilege principal of the secured LocalKafka."""

from __future__ import annotations

import uuid

from tests.harness.workers import Topics, worker_config
from worker.config import WorkerConfig
from worker.devkit.local_kafka import LocalKafka, Principal
from worker.devkit.local_kafka.security import Protocol, worker_kafka_section


def secured_worker_config(kafka: LocalKafka, topics: Topics, *, protocol: Protocol = "SASL_SSL",
                          leave_out: tuple[str, ...] = (), exactly_once: bool = False,
                          **overrides: dict[str, object]) -> tuple[WorkerConfig, Principal]:
    """A worker config for a new principal (returned too) holding the worker's grants on
    ``topics`` except those on ``leave_out`` (a topic, the group, or the transactional-id
    prefix)."""
    principal = kafka.add_principal(f"worker-{uuid.uuid4().hex[:8]}")
    prefix = f"ktw.{topics.group}."  # the worker's transactional ids: <prefix>.<group>.<id>
    kafka.acls.grant(kafka.acls.for_worker(
        principal.principal, jobs=topics.jobs, results=topics.results, dlq=topics.dlq,
        group=topics.group, transactional_id_prefix=prefix if exactly_once else None,
        leave_out=leave_out))
    section = worker_kafka_section(kafka.client_settings(principal, protocol))
    guarantee = {"guarantee": "exactly-once"} if exactly_once else {}
    processing = {**guarantee, **overrides.pop("processing", {})}
    cfg = worker_config(section.pop("bootstrap_servers"), topics,
                        kafka={**section, **overrides.pop("kafka", {})},
                        **({"processing": processing} if processing else {}), **overrides)
    return cfg, principal
