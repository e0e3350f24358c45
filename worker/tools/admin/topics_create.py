"""``topics create`` against the cluster: describe, create what is missing, describe again."""

from __future__ import annotations

import time
from dataclasses import dataclass

import confluent_kafka as ck
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError
from worker.kafka.admin import Admin, TopicInfo, wait
from worker.tools.admin.common import task_topics
from worker.tools.admin.topics import (
    BrokerDefaults,
    NewTopicPlan,
    Request,
    check_dlq,
    check_jobs,
    plan,
)


@dataclass(frozen=True, slots=True)
class Row:
    role: str
    name: str
    status: str  # created | exists | would create
    partitions: int
    replication: int
    max_message_bytes: int


@dataclass(slots=True)
class Outcome:
    rows: list[Row]
    notes: list[str]
    problems: list[str]


def create_topics(cfg: WorkerConfig, req: Request, *, dry_run: bool = False) -> Outcome:
    names = task_topics(cfg)
    roles = {names.jobs: "jobs", names.results: "results", names.dlq: "dlq"}
    admin = Admin(cfg)
    existing = admin.describe(list(roles))
    limit = cfg.limits.max_message_bytes
    the_plan = plan(names, existing, BrokerDefaults.from_configs(admin.broker_configs()), req,
                    job_limit=limit)
    _create(admin, the_plan.create, validate_only=dry_run)
    rows = [Row(roles[t.name], t.name, "exists", t.partitions, t.replication,
                t.max_message_bytes) for t in existing.values()]
    if dry_run:
        rows += [Row(p.role, p.name, "would create", p.partitions, p.replication,
                     int(p.configs["max.message.bytes"]) if "max.message.bytes" in p.configs
                     else the_plan.jobs_max_message_bytes)
                 for p in the_plan.create]
        jobs_max = the_plan.jobs_max_message_bytes
        dlq = existing.get(names.dlq)
        dlq_max = dlq.max_message_bytes if dlq else None
    else:
        final = _describe_created(admin, list(roles), {p.name for p in the_plan.create})
        rows += [Row(roles[t.name], t.name, "created", t.partitions, t.replication,
                     t.max_message_bytes) for t in final.values() if t.name not in existing]
        jobs_max = final[names.jobs].max_message_bytes
        dlq_max = final[names.dlq].max_message_bytes
    rows.sort(key=lambda r: ("jobs", "results", "dlq").index(r.role))
    problems, notes = check_dlq(names, dlq_max, jobs_max) if dlq_max is not None else ([], [])
    return Outcome(rows, the_plan.notes + check_jobs(names, jobs_max, limit) + notes, problems)


def _create(admin: Admin, topics: list[NewTopicPlan], *, validate_only: bool) -> None:
    """Create (or only validate) the topics; one that appeared meanwhile is fine."""
    if not topics:
        return
    new = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=t.replication,
                    config=dict(t.configs)) for t in topics]
    try:
        futures = admin.client.create_topics(new, operation_timeout=admin.timeout,
                                             request_timeout=admin.timeout,
                                             validate_only=validate_only)
    except ck.KafkaException as exc:
        raise KafkaIOError(f"create topics: {exc}") from exc
    failed: dict[str, str] = {}
    for name, fut in futures.items():
        try:
            wait(fut, f"create topic {name!r}", admin.timeout)
        except KafkaIOError as exc:
            if exc.code != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                failed[name] = str(exc)
    if failed:
        done = sorted({t.name for t in topics} - set(failed))
        made = f" (created: {', '.join(done)})" if done and not validate_only else ""
        raise KafkaIOError("; ".join(failed.values()) + made)


def _describe_created(admin: Admin, names: list[str], created: set[str]
                      ) -> dict[str, TopicInfo]:
    """Describe the topics, waiting until every one just created shows in the metadata."""
    deadline = time.monotonic() + admin.timeout
    while True:
        found = admin.describe(names)
        if set(names) <= set(found) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    missing = sorted(set(names) - set(found))
    if missing:
        raise KafkaIOError(f"topics {', '.join(missing)} not in the cluster metadata "
                           f"{admin.timeout:.0f} s after creation"
                           + ("" if set(missing) <= created else " (nor before)"))
    return found
