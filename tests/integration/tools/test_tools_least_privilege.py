"""`dlq redrive` and `replay` as least-privilege principals of a broker with an authorizer
(nothing allowed without an ACL): each command works with exactly the grants
docs/operations.md lists for it, and a missing grant ends it with a one-line reason naming
what was refused rather than a hang."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.harness.workers import fresh_topics, produce_records, worker_config
from tests.integration.tools.replay_support import (  # noqa: F401 - shared_runner is a fixture
    produce_jobs,
    read_all,
    replay_config,
    replay_topics,
    shared_runner,
    sources,
)
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.acls import Acls
from worker.devkit.local_kafka.security import worker_kafka_section
from worker.exceptions import WorkerError
from worker.tools.admin.deadletters import REDRIVEN_FROM, Filter
from worker.tools.admin.redrive import RedriveRequest, redrive
from worker.tools.replay.ranges import parse_bound
from worker.tools.replay.runner import ReplayRunner
from worker.tools.replay.start import ReplayRequest

pytestmark = pytest.mark.integration


def _principal(kafka: LocalKafka, bindings: Any) -> dict[str, Any]:
    """A new SASL_SSL principal holding ``bindings(principal)``: its kafka config section."""
    p = kafka.add_principal(f"tool-{uuid.uuid4().hex[:8]}")
    kafka.acls.grant(bindings(p.principal))
    return worker_kafka_section(kafka.client_settings(p, "SASL_SSL"))


def redrive_grants(principal: str, *, dlq: str, jobs: str, group: str,
                   leave_out: tuple[str, ...] = ()) -> list[Any]:
    """docs/operations.md's table for `dlq redrive`: READ on the DLQ and on its progress
    group, WRITE on the jobs topic, READ on the jobs topic (by-reference dead letters are
    fetched from it), idempotent writes."""
    skip = set(leave_out)
    return Acls.bindings(principal, read=[t for t in (dlq, jobs) if f"read:{t}" not in skip],
                         write=[jobs] if f"write:{jobs}" not in skip else [],
                         groups=[group] if group not in skip else [], idempotent_write=True)


def _dead_letters(bootstrap: str, dlq: str, n: int) -> None:
    produce_records(bootstrap, dlq, [
        (f"dl-{i}".encode(), f"job-{i}".encode(), [("ktw.dlq.error.reason", b"schema")])
        for i in range(n)])


def test_dlq_redrive_as_a_least_privilege_principal(secured_kafka: LocalKafka) -> None:
    admin = secured_kafka.bootstrap_servers  # the devkit's super-user listener
    t = fresh_topics(admin)
    group = f"{t.group}.redrive"
    _dead_letters(admin, t.dlq, 3)
    section = _principal(secured_kafka, lambda p: redrive_grants(
        p, dlq=t.dlq, jobs=t.jobs, group=group))
    cfg = worker_config(section.pop("bootstrap_servers"), t, kafka=section)
    summary = redrive(cfg, RedriveRequest(Filter(frozenset({"schema"}))))
    assert (summary.scanned, summary.resent) == (3, 3)
    sent = [m for m in read_all(admin, t.jobs) if REDRIVEN_FROM in dict(m.headers() or [])]
    assert sorted(m.key() for m in sent) == [b"dl-0", b"dl-1", b"dl-2"]


@pytest.mark.parametrize("missing", ["write", "group"])
def test_dlq_redrive_without_a_grant_says_which(secured_kafka: LocalKafka, missing: str
                                                ) -> None:
    admin = secured_kafka.bootstrap_servers
    t = fresh_topics(admin)
    group = f"{t.group}.redrive"
    _dead_letters(admin, t.dlq, 1)
    leave_out = (f"write:{t.jobs}",) if missing == "write" else (group,)
    section = _principal(secured_kafka, lambda p: redrive_grants(
        p, dlq=t.dlq, jobs=t.jobs, group=group, leave_out=leave_out))
    cfg = worker_config(section.pop("bootstrap_servers"), t, kafka=section)
    with pytest.raises(WorkerError) as err:
        redrive(cfg, RedriveRequest(Filter(frozenset({"schema"}))))
    text = str(err.value)
    assert "\n" not in text and ("authoriz" in text.lower() or "acls" in text.lower()), text
    assert (t.jobs if missing == "write" else group) in text, text


def test_replay_as_a_least_privilege_principal(secured_kafka: LocalKafka,
                                               shared_runner: Any,  # noqa: F811
                                               tmp_path: Path) -> None:
    """READ on the source topic and WRITE on the replay topic; no group: replay assigns
    partitions and keeps its progress in a state file."""
    admin = secured_kafka.bootstrap_servers
    t = replay_topics(admin)
    jobs = produce_jobs(admin, t.jobs, 3)
    section = _principal(secured_kafka, lambda p: Acls.bindings(
        p, read=[t.jobs], write=[t.replay], idempotent_write=True))
    bootstrap = section.pop("bootstrap_servers")
    req = ReplayRequest(topic=t.jobs, to_topic=t.replay, start=parse_bound("earliest"),
                        end=parse_bound("latest"), state_file=tmp_path / "s.json")
    summary = ReplayRunner(replay_config(bootstrap, kafka=section), req,
                           runner=shared_runner).run()
    assert summary.finished and summary.counts == {"result:ok": len(jobs)}
    assert sorted(sources(read_all(admin, t.replay))) == sorted(
        (j.partition, j.offset) for j in jobs)
