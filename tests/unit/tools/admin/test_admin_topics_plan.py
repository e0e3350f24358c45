"""`topics create` decisions without a broker: --topic-config syntax, the DLQ's
max.message.bytes, partition defaults, and what is reported about existing topics."""

from __future__ import annotations

import pytest

from worker.kafka.admin import TopicInfo
from worker.tools.admin.common import TaskTopics
from worker.tools.admin.errors import BadOption
from worker.tools.admin.topics import (
    HEADROOM_BYTES,
    BrokerDefaults,
    Request,
    check_dlq,
    dlq_max_message_bytes,
    parse_topic_configs,
    plan,
)

NAMES = TaskTopics("jobs", "results", "dlq")
BROKER = BrokerDefaults(partitions=5, replication=3, max_message_bytes=1_048_588)


def info(name: str, partitions: int = 6, replication: int = 3, max_bytes: int = 1_048_588,
         **configs: str) -> TopicInfo:
    return TopicInfo(name, partitions, replication,
                     {"max.message.bytes": str(max_bytes), "retention.ms": "604800000",
                      **{k.replace("_", "."): v for k, v in configs.items()}})


def test_topic_config_parsing() -> None:
    assert parse_topic_configs(["retention.ms=86400000", " cleanup.policy = delete ",
                                "retention.ms=86400000"]) == {
        "retention.ms": "86400000", "cleanup.policy": "delete"}
    assert parse_topic_configs([]) == {}
    for bad in ("retention.ms", "=5", "retention.ms=", "Retention=1", "max.message.bytes=1MB",
                "max.message.bytes=0"):
        with pytest.raises(BadOption, match="--topic-config"):
            parse_topic_configs([bad])
    with pytest.raises(BadOption, match="twice"):
        parse_topic_configs(["retention.ms=1", "retention.ms=2"])


def test_dlq_limit_is_the_jobs_limit_plus_headroom() -> None:
    assert HEADROOM_BYTES == 65_536
    assert dlq_max_message_bytes(1_048_588) == 1_114_124


def test_nothing_exists_uses_broker_defaults_and_results_follow_jobs() -> None:
    p = plan(NAMES, {}, BROKER, Request())
    got = {t.role: (t.name, t.partitions, t.replication, t.configs) for t in p.create}
    assert got == {
        "jobs": ("jobs", 5, 3, {}),
        "results": ("results", 5, 3, {}),
        "dlq": ("dlq", 5, 3, {"max.message.bytes": str(1_048_588 + 65_536)}),
    }
    assert p.notes == [] and p.jobs_max_message_bytes == 1_048_588


def test_requested_sizes_and_configs_apply_and_the_dlq_keeps_its_headroom() -> None:
    req = Request(partitions=12, dlq_partitions=2, replication=2,
                  configs={"retention.ms": "3600000", "max.message.bytes": "5000000"})
    p = plan(NAMES, {}, BROKER, req)
    by_role = {t.role: t for t in p.create}
    assert [by_role[r].partitions for r in ("jobs", "results", "dlq")] == [12, 12, 2]
    assert {t.replication for t in p.create} == {2}
    assert by_role["jobs"].configs == by_role["results"].configs == req.configs
    assert by_role["dlq"].configs == {"retention.ms": "3600000",
                                      "max.message.bytes": "5065536"}


def test_existing_jobs_topic_sets_the_dlq_limit_and_partition_count() -> None:
    existing = {"jobs": info("jobs", partitions=8, max_bytes=26_214_400)}
    p = plan(NAMES, existing, BROKER, Request(results_partitions=4))
    by_role = {t.role: t for t in p.create}
    assert set(by_role) == {"results", "dlq"}, "the existing jobs topic is left alone"
    assert by_role["results"].partitions == 4 and by_role["dlq"].partitions == 8
    assert by_role["dlq"].configs["max.message.bytes"] == str(26_214_400 + 65_536)
    assert p.jobs_max_message_bytes == 26_214_400


def test_existing_topics_that_differ_are_reported_not_changed() -> None:
    existing = {n: info(n) for n in ("jobs", "results", "dlq")}
    req = Request(partitions=6, results_partitions=3, replication=1,
                  configs={"retention.ms": "1000", "max.message.bytes": "2000000"})
    p = plan(NAMES, existing, BROKER, req)
    assert p.create == []
    jobs, results, dlq = p.notes
    assert jobs.startswith("jobs topic jobs exists with replication 3 (asked 1)")
    assert "partitions" not in jobs, "6 partitions were asked and exist"
    assert "retention.ms=604800000 (asked 1000)" in jobs
    assert "max.message.bytes=1048588 (asked 2000000)" in jobs
    assert "6 partitions (asked 3)" in results
    assert "max.message.bytes" not in dlq, "the DLQ's limit is checked by check_dlq instead"
    assert all(n.endswith("left unchanged") for n in p.notes)
    assert plan(NAMES, existing, BROKER, Request()).notes == [], "nothing asked, nothing noted"


def test_dlq_check() -> None:
    problems, notes = check_dlq(NAMES, dlq_max=1_000_000, jobs_max=1_048_588)
    assert len(problems) == 1 and notes == []
    assert "less than the jobs topic jobs (1048588)" in problems[0]
    assert "max.message.bytes=1114124" in problems[0], "says what to set"
    problems, notes = check_dlq(NAMES, dlq_max=1_048_588, jobs_max=1_048_588)
    assert problems == [] and len(notes) == 1 and "by reference" in notes[0]
    assert check_dlq(NAMES, dlq_max=1_114_124, jobs_max=1_048_588) == ([], [])
