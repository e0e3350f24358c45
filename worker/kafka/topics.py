"""Start-up checks of the topics a worker reads and writes: a clear error before the first job,
not a delivery failure at the first result or dead letter.

- every topic exists and is visible to this client (else :class:`UnknownTopic`, naming them and
  `trt-worker topics create`);
- this client may read the jobs topic, write the results and DLQ topics, and read (join and
  commit in) its consumer group, as the broker's ACLs say (else :class:`TopicNotAuthorized`
  naming each refused operation; a broker that reports nothing is not an error). The broker
  reports them with the topic and group descriptions (KIP-430), which any principal that may
  use them can ask for: a least-privilege principal is checked too;
- the DLQ takes records as large as the jobs topic does (else a warning: an oversized dead
  letter then goes by reference, worker.wire.dlq). That needs DescribeConfigs, which a
  least-privilege principal may lack: then only this comparison is skipped, with a warning.

Exactly-once also needs WRITE on its transactional id. The broker reports no authorized
operations for a transactional id, and DescribeAcls needs ALTER or DESCRIBE on the cluster
(which a least-privilege worker lacks) plus the authorizer's own matching rules (prefixes,
wildcards, DENY, super users) to be read right. So the authority is the worker's own
``init_transactions``: it runs before the group is joined, and its
TRANSACTIONAL_ID_AUTHORIZATION_FAILED is reported by :func:`transactional_id_refused` naming
the id and the operation, as a refusal here is, and start-up waits it out as it waits out
these (worker.loop.startup).

A cluster that does not answer within the timeout is not an error here: the worker starts and
librdkafka keeps trying, as it would without the check (a crash loop helps no one while the
brokers come back).
"""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import structlog
from confluent_kafka.admin._resource import ResourceType

from worker.config import WorkerConfig
from worker.exceptions import KafkaIOError, TopicNotAuthorized, UnknownTopic
from worker.kafka.admin import Admin, wait

log = structlog.get_logger("worker")

# A refusal, not a failure to answer: the request reached an authorizer that said no.
_REFUSED = frozenset({ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                      ck.KafkaError.GROUP_AUTHORIZATION_FAILED,
                      ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
_GRANT = ("grant it (kafka-acls --add --allow-principal <the worker's principal> --operation "
          "...) or fix the names")


def check_topics(cfg: WorkerConfig, jobs: str, results: str, dlq: str,
                 timeout_s: float = 15.0) -> None:
    names = [jobs, results, dlq]
    try:
        admin = Admin(cfg, timeout=timeout_s)
        topics = admin.metadata().topics
    except KafkaIOError as exc:
        log.warning("topics_not_checked", error=str(exc)[:300], topics=names)
        return
    found = {n: t for n in names
             if (t := topics.get(n)) is not None and t.error is None and t.partitions}
    missing = [n for n in names if n not in found]
    if missing:
        # Metadata lists only the topics this client may DESCRIBE; asked by name, the broker
        # tells a refusal from a topic that does not exist (without saying whether it does).
        try:
            ops = topic_operations(admin, missing)
            hidden = {n for n in missing if ops.get(n) == frozenset()}
        except KafkaIOError:
            hidden = set()
        unknown = [n for n in missing if n not in hidden]
        if unknown:
            raise UnknownTopic(
                f"topic(s) {', '.join(unknown)} do not exist on {cfg.kafka.bootstrap_servers} "
                "(or this client may not see them): create them with `trt-worker topics "
                "create`, or fix [topics] / [generation.topics]")
    check_authorized(admin, {jobs: "READ", results: "WRITE", dlq: "WRITE"},
                     group=cfg.kafka.group_id)
    _compare_sizes(admin, jobs, dlq)
    log.info("topics_checked", partitions={name: len(found[name].partitions) for name in names})


def topic_operations(admin: Admin, names: list[str]) -> dict[str, frozenset[str] | None]:
    """:meth:`Admin.authorized_operations`, with an empty set for each topic the broker
    refuses to describe (not even DESCRIBE: every operation is refused)."""
    try:
        return admin.authorized_operations(names)
    except KafkaIOError as exc:
        if exc.code not in _REFUSED:
            raise
    out: dict[str, frozenset[str] | None] = {}
    for name in names:  # one at a time: which of them were refused
        try:
            out[name] = admin.authorized_operations([name]).get(name)
        except KafkaIOError as exc:
            if exc.code not in _REFUSED:
                raise
            out[name] = frozenset()
    return out


def _compare_sizes(admin: Admin, jobs: str, dlq: str) -> None:
    try:
        jobs_max, dlq_max = (int(admin.configs(ResourceType.TOPIC, n)["max.message.bytes"])
                             for n in (jobs, dlq))
    except KafkaIOError as exc:  # DescribeConfigs refused (least privilege) or no answer
        log.warning("dlq_size_not_checked", error=str(exc)[:300], dlq=dlq, jobs=jobs)
        return
    if dlq_max < jobs_max:
        log.warning("dlq_smaller_than_jobs", dlq=dlq, dlq_max_message_bytes=dlq_max,
                    jobs=jobs, jobs_max_message_bytes=jobs_max,
                    effect="dead letters larger than the DLQ takes go by reference")


def may(operations: frozenset[str] | None, operation: str) -> bool:
    """Whether reported ``operations`` allow ``operation`` (None: not reported, assume so)."""
    return operations is None or "ALL" in operations or operation in operations


def check_authorized(admin: Admin, needs: dict[str, str], group: str | None = None) -> None:
    """Each topic allows the operation the worker needs on it, and ``group`` allows READ, or
    :class:`TopicNotAuthorized` naming every refusal. Asked after the topics were found: a
    producer that may not write fails at its first result otherwise, with every partition's
    work redone forever; a member that may not read its group never gets a partition."""
    try:
        allowed = topic_operations(admin, list(needs))
    except KafkaIOError as exc:  # an old broker, a slow one: the check is best effort
        log.warning("topic_acls_not_checked", error=str(exc)[:300])
        return
    # A topic it may not even DESCRIBE: the broker does not say whether it exists.
    refused = [f"{op} on {name}" + (" (not even DESCRIBE; it may not exist either)"
                                    if allowed.get(name) == frozenset() else "")
               for name, op in needs.items() if not may(allowed.get(name), op)]
    if group is not None and not may(group_operations(admin, group), "READ"):
        refused.append(f"READ on group {group}")
    if refused:
        raise TopicNotAuthorized(
            f"the broker's ACLs do not let this client {', '.join(refused)}: {_GRANT}")


def group_operations(admin: Admin, group: str) -> frozenset[str] | None:
    """What this client may do on ``group`` (as for topics, KIP-430); an empty set if the
    broker refuses to describe it, None if it reports nothing or does not answer. A group
    that does not exist yet is described too (no members), with its operations."""
    try:
        futures = admin.client.describe_consumer_groups(
            [group], include_authorized_operations=True, request_timeout=admin.timeout)
        described: Any = wait(futures[group], f"describe group {group!r}", admin.timeout)
    except KafkaIOError as exc:
        if exc.code in _REFUSED:
            return frozenset()
        log.warning("group_acls_not_checked", group=group, error=str(exc)[:300])
        return None
    except ck.KafkaException as exc:  # raised by the call itself (e.g. a bad argument)
        log.warning("group_acls_not_checked", group=group, error=str(exc)[:300])
        return None
    ops = described.authorized_operations
    return None if ops is None else frozenset(op.name for op in ops)


def transactional_id_refused(exc: KafkaIOError, transactional_id: str
                             ) -> TopicNotAuthorized | None:
    """``init_transactions``' refusal of ``transactional_id`` as the start-up check reports
    a refusal (the operation and the id by name); None for any other error."""
    if exc.code != ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return None
    return TopicNotAuthorized(f"the broker's ACLs do not let this client WRITE on "
                              f"transactional id {transactional_id}: {_GRANT}")
