"""Start-up checks of the topics a worker reads and writes: a clear error before the first job,
not a delivery failure at the first result or dead letter.

- every topic exists and is visible to this client (else :class:`UnknownTopic`, naming them and
  `trt-worker topics create`);
- this client may read the jobs topic and write the results and DLQ topics, as the broker's
  ACLs say (else :class:`TopicNotAuthorized`; a broker that reports nothing is not an error);
- the DLQ takes records as large as the jobs topic does (else a warning: an oversized dead
  letter then goes by reference, worker.wire.dlq).

A cluster that does not answer within the timeout is not an error here: the worker starts and
librdkafka keeps trying, as it would without the check (a crash loop helps no one while the
brokers come back).
"""

from __future__ import annotations

import structlog

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError, TopicNotAuthorized, UnknownTopic
from worker.kafka.admin import Admin

log = structlog.get_logger("worker")


def check_topics(cfg: WorkerConfig, jobs: str, results: str, dlq: str,
                 timeout_s: float = 15.0) -> None:
    names = [jobs, results, dlq]
    try:
        admin = Admin(cfg, timeout=timeout_s)
        found = admin.describe(names)
    except KafkaIOError as exc:
        log.warning("topics_not_checked", error=str(exc)[:300], topics=names)
        return
    missing = [n for n in names if n not in found]
    if missing:
        raise UnknownTopic(
            f"topic(s) {', '.join(missing)} do not exist on {cfg.kafka.bootstrap_servers} (or "
            "this client may not see them): create them with `trt-worker topics create`, or "
            "fix [topics] / [generation.topics]")
    check_authorized(admin, {jobs: "READ", results: "WRITE", dlq: "WRITE"})
    jobs_max, dlq_max = found[jobs].max_message_bytes, found[dlq].max_message_bytes
    if dlq_max < jobs_max:
        log.warning("dlq_smaller_than_jobs", dlq=dlq, dlq_max_message_bytes=dlq_max,
                    jobs=jobs, jobs_max_message_bytes=jobs_max,
                    effect="dead letters larger than the DLQ takes go by reference")
    log.info("topics_checked", partitions={name: found[name].partitions for name in names})


def may(operations: frozenset[str] | None, operation: str) -> bool:
    """Whether reported ``operations`` allow ``operation`` (None: not reported, assume so)."""
    return operations is None or "ALL" in operations or operation in operations


def check_authorized(admin: Admin, needs: dict[str, str]) -> None:
    """Each topic allows the operation the worker needs on it, or :class:`TopicNotAuthorized`
    naming every refusal. Asked after the topics were found: a producer that may not write
    fails at its first result otherwise, with every partition's work redone forever."""
    try:
        allowed = admin.authorized_operations(list(needs))
    except KafkaIOError as exc:  # an old broker, a slow one: the check is best effort
        log.warning("topic_acls_not_checked", error=str(exc)[:300])
        return
    refused = [f"{op} on {name}" for name, op in needs.items() if not may(allowed.get(name), op)]
    if refused:
        raise TopicNotAuthorized(
            f"the broker's ACLs do not let this client {', '.join(refused)}: grant it "
            "(kafka-acls --add --allow-principal <the worker's principal> --operation ...) or "
            "fix the topic names")
