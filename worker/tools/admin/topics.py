"""``topics create``: what to create and what to report about existing topics (pure).

The jobs topic must take any job the worker takes: a value of up to ``limits.max_message_bytes``
plus its key and headers. So a new jobs topic's ``max.message.bytes`` is that limit plus
:data:`HEADROOM_BYTES` (unless ``--topic-config max.message.bytes`` says otherwise); the
broker's default (1 MB) would refuse most of what the worker is configured for. The DLQ must
take any job the jobs topic takes: a dead letter is the whole job plus the worker's headers.
So the DLQ's ``max.message.bytes`` is the jobs topic's effective value (the existing topic's,
else the value it is created with) plus :data:`HEADROOM_BYTES`. Existing topics are never
altered; where they differ from what was asked, or are too small for the worker's limit, that
is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from worker.kafka.admin import TopicInfo
from worker.tools.admin.common import TaskTopics
from worker.tools.admin.errors import BadOption

HEADROOM_BYTES = 64 * 1024
MAX_BYTES = "max.message.bytes"
_KEY = re.compile(r"^[a-z][a-z0-9._-]*$")


def parse_topic_configs(items: list[str]) -> dict[str, str]:
    """``["retention.ms=86400000", ...]`` -> ``{"retention.ms": "86400000"}``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not _KEY.match(key) or not value:
            raise BadOption(f"--topic-config {item!r}: expected key=value, "
                            "e.g. retention.ms=604800000")
        if out.get(key, value) != value:
            raise BadOption(f"--topic-config sets {key} twice ({out[key]} and {value})")
        out[key] = value
    if MAX_BYTES in out and not (out[MAX_BYTES].isdigit() and int(out[MAX_BYTES]) > 0):
        raise BadOption(f"--topic-config {MAX_BYTES}={out[MAX_BYTES]}: expected a byte count")
    return out


def jobs_max_message_bytes(limit: int) -> int:
    """The jobs topic's ``max.message.bytes`` for a worker taking values up to ``limit``
    (``limits.max_message_bytes``): the broker counts the key, headers and framing too."""
    return limit + HEADROOM_BYTES


def dlq_max_message_bytes(jobs_max: int) -> int:
    """The DLQ's ``max.message.bytes`` for a jobs topic taking records up to ``jobs_max``."""
    return jobs_max + HEADROOM_BYTES


@dataclass(frozen=True, slots=True)
class BrokerDefaults:
    partitions: int
    replication: int
    max_message_bytes: int

    @classmethod
    def from_configs(cls, configs: dict[str, str]) -> BrokerDefaults:
        return cls(int(configs.get("num.partitions", "1")),
                   int(configs.get("default.replication.factor", "1")),
                   int(configs.get("message.max.bytes", "1048588")))


@dataclass(frozen=True, slots=True)
class Request:
    """What the command line asked for; None: the default."""

    partitions: int | None = None  # the jobs topic's (default: the broker's num.partitions)
    results_partitions: int | None = None  # default: the jobs topic's count
    dlq_partitions: int | None = None  # default: the jobs topic's count
    replication: int | None = None  # default: the broker's default.replication.factor
    configs: dict[str, str] = field(default_factory=dict)  # for all three topics


@dataclass(frozen=True, slots=True)
class NewTopicPlan:
    role: str
    name: str
    partitions: int
    replication: int
    configs: dict[str, str]


@dataclass(slots=True)
class Plan:
    create: list[NewTopicPlan]
    notes: list[str]  # existing topics that differ from the request (left alone)
    jobs_max_message_bytes: int


def plan(names: TaskTopics, existing: dict[str, TopicInfo], broker: BrokerDefaults,
         req: Request, job_limit: int | None = None) -> Plan:
    """``job_limit``: the worker's ``limits.max_message_bytes``, which sizes a new jobs topic
    (None: the broker's ``message.max.bytes``, as a topic created without the setting gets)."""
    jobs = existing.get(names.jobs)
    jobs_partitions = jobs.partitions if jobs else req.partitions or broker.partitions
    jobs_configs = dict(req.configs)
    if job_limit is not None and MAX_BYTES not in jobs_configs:
        jobs_configs[MAX_BYTES] = str(jobs_max_message_bytes(job_limit))
    jobs_max = (jobs.max_message_bytes if jobs
                else int(jobs_configs.get(MAX_BYTES, broker.max_message_bytes)))
    dlq_configs = {**req.configs, MAX_BYTES: str(dlq_max_message_bytes(jobs_max))}
    wanted = [("jobs", names.jobs, req.partitions, jobs_configs),
              ("results", names.results, req.results_partitions, req.configs),
              ("dlq", names.dlq, req.dlq_partitions, dlq_configs)]
    out = Plan([], [], jobs_max)
    for role, name, asked, configs in wanted:
        info = existing.get(name)
        if info is None:
            out.create.append(NewTopicPlan(role, name, asked or jobs_partitions,
                                           req.replication or broker.replication, configs))
            continue
        diffs = []
        if asked is not None and asked != info.partitions:
            diffs.append(f"{info.partitions} partitions (asked {asked})")
        if req.replication is not None and req.replication != info.replication:
            diffs.append(f"replication {info.replication} (asked {req.replication})")
        diffs += [f"{k}={info.configs.get(k, '?')} (asked {v})"
                  for k, v in req.configs.items()
                  if info.configs.get(k) != v and not (role == "dlq" and k == MAX_BYTES)]
        if diffs:
            out.notes.append(f"{role} topic {name} exists with {', '.join(diffs)}: "
                             "left unchanged")
    return out


def check_jobs(names: TaskTopics, jobs_max: int, job_limit: int) -> list[str]:
    """Notes about a jobs topic taking records up to ``jobs_max`` bytes for a worker taking
    values up to ``job_limit``: the broker refuses a larger job at its producer, so the worker
    never sees it (nor dead-letters it as ``oversized``)."""
    need = jobs_max_message_bytes(job_limit)
    if jobs_max >= need:
        return []
    return [f"jobs topic {names.jobs} has {MAX_BYTES}={jobs_max}, under the {need} that "
            f"limits.max_message_bytes={job_limit} needs (a value at the limit plus "
            f"{HEADROOM_BYTES} bytes for its key and headers): the broker refuses larger jobs "
            "at their producer. Raise it (kafka-configs --alter --entity-type topics "
            f"--entity-name {names.jobs} --add-config {MAX_BYTES}={need}, then the DLQ's to "
            f"{dlq_max_message_bytes(need)}) or lower limits.max_message_bytes"]


def check_dlq(names: TaskTopics, dlq_max: int, jobs_max: int) -> tuple[list[str], list[str]]:
    """(problems, notes) about a DLQ taking records up to ``dlq_max`` bytes."""
    if dlq_max < jobs_max:
        return [f"dlq topic {names.dlq} has {MAX_BYTES}={dlq_max}, less than the jobs topic "
                f"{names.jobs} ({jobs_max}): a large job cannot be dead-lettered whole. Raise "
                f"it to at least {dlq_max_message_bytes(jobs_max)} (kafka-configs --alter "
                f"--entity-type topics --entity-name {names.dlq} --add-config "
                f"{MAX_BYTES}={dlq_max_message_bytes(jobs_max)})"], []
    if dlq_max < dlq_max_message_bytes(jobs_max):
        return [], [f"dlq topic {names.dlq} has {MAX_BYTES}={dlq_max}, under the jobs topic's "
                    f"{jobs_max} plus {HEADROOM_BYTES} bytes of headroom for the dead-letter "
                    "headers: the largest jobs will be dead-lettered by reference"]
    return [], []
