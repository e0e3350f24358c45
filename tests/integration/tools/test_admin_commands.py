"""`trt-worker topics create`, `lag` and `dlq redrive` against the real broker (no mocks).

Dead letters are built by the worker's own DLQ code (worker.wire.dlq), so the redrive is
checked against the records the worker really writes: inline copies and by-reference records.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from typer.testing import CliRunner, Result

from tests.harness.workers import Topics, committed, end_offsets, fresh_topics, worker_config
from worker.config import LimitsSettings
from worker.devkit.local_kafka.admin import create_topics
from worker.exceptions import ImageRejected, JobRejected, OversizedMessage, SchemaViolation
from worker.tools.admin.deadletters import REDRIVEN_FROM, Filter
from worker.tools.admin.redrive import RedriveRequest, redrive
from worker.tools.cli import app
from worker.wire.dlq import dead_letter, dead_letter_by_reference
from worker.wire.records import SourceRecord

pytestmark = pytest.mark.integration
DEFAULT_LIMIT = LimitsSettings().max_message_bytes  # limits.max_message_bytes by default


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """The commands configure logging onto the CliRunner's stderr; put the root logger back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def cli(tmp_path: Path, bootstrap: str, topics: Topics, *args: str, toml: str = "") -> Result:
    cfg = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(f'[kafka]\nbootstrap_servers = "{bootstrap}"\ngroup_id = "{topics.group}"\n'
                   f'[topics]\njobs = "{topics.jobs}"\nresults = "{topics.results}"\n'
                   f'dlq = "{topics.dlq}"\n[log]\nlevel = "WARNING"\n{toml}')
    return CliRunner().invoke(app, [*args, "--config", str(cfg)], terminal_width=200)


def describe(bootstrap: str, names: list[str]) -> dict[str, tuple[int, dict[str, str]]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(timeout=10).topics
    out = {}
    for name in names:
        if name in meta and meta[name].error is None:
            res = ConfigResource(ResourceType.TOPIC, name)
            conf = admin.describe_configs([res])[res].result(10)
            out[name] = (len(meta[name].partitions), {k: e.value for k, e in conf.items()})
    return out


def new_names() -> Topics:
    tag = uuid.uuid4().hex[:8]
    return Topics(f"ajobs-{tag}", f"aresults-{tag}", f"adlq-{tag}", f"agroup-{tag}")


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> list[int]:
    """Produce in order; return each record's offset."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "message.max.bytes": 10_000_000})
    offsets: list[int] = [-1] * len(records)

    def done(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            offsets[i] = msg.offset()
        return cb

    for i, r in enumerate(records):
        p.produce(topic, on_delivery=done(i), **r)
    assert p.flush(30) == 0
    return offsets


def read_all(bootstrap: str, topic: str, partitions: int) -> list[ck.Message]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}",
                     "enable.auto.commit": False})
    tps = [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)]
    want = sum(hi - lo for lo, hi in (c.get_watermark_offsets(tp, timeout=10) for tp in tps))
    c.assign(tps)
    out: list[ck.Message] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < want and time.monotonic() < deadline:
            out += [m for m in c.consume(500, timeout=0.2) if m.error() is None]
    finally:
        c.close()
    assert len(out) == want
    return sorted(out, key=lambda m: (m.partition(), m.offset()))


# -- topics create -----------------------------------------------------------------------

def test_topics_create_twice_sizes_the_dlq_for_whole_jobs(kafka_bootstrap: str,
                                                           tmp_path: Path) -> None:
    t = new_names()
    names = [t.jobs, t.results, t.dlq]
    dry = cli(tmp_path, kafka_bootstrap, t, "topics", "create", "--partitions", "3",
              "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.count("would create") == 3 and describe(kafka_bootstrap, names) == {}

    args = ("topics", "create", "--partitions", "3", "--dlq-partitions", "1",
            "--topic-config", "retention.ms=3600000", "--topic-config",
            "max.message.bytes=2000000")
    first = cli(tmp_path, kafka_bootstrap, t, *args)
    assert first.exit_code == 0, first.output
    assert first.stdout.count("created") == 3
    got = describe(kafka_bootstrap, names)
    assert {n: parts for n, (parts, _) in got.items()} == {t.jobs: 3, t.results: 3, t.dlq: 1}
    assert {c["retention.ms"] for _, c in got.values()} == {"3600000"}
    jobs_max = int(got[t.jobs][1]["max.message.bytes"])
    assert jobs_max == 2_000_000 == int(got[t.results][1]["max.message.bytes"])
    assert int(got[t.dlq][1]["max.message.bytes"]) == jobs_max + 65_536

    second = cli(tmp_path, kafka_bootstrap, t, *args)
    assert second.exit_code == 0, second.output
    assert second.stdout.count("exists") == 3 and "created" not in second.stdout
    assert describe(kafka_bootstrap, names) == got, "nothing changed"


def test_topics_create_reports_a_dlq_smaller_than_the_jobs_topic(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    t = new_names()
    create_topics(kafka_bootstrap, [t.dlq], config={"max.message.bytes": "500000"})
    res = cli(tmp_path, kafka_bootstrap, t, "topics", "create", "--partitions", "2")
    assert res.exit_code == 1, res.output
    jobs_max = DEFAULT_LIMIT + 65_536  # the jobs topic it created: the worker's limit
    assert f"problem: dlq topic {t.dlq} has max.message.bytes=500000, less than the jobs " \
           f"topic {t.jobs} ({jobs_max})" in res.stdout
    got = describe(kafka_bootstrap, [t.jobs, t.results, t.dlq])
    assert got[t.dlq][1]["max.message.bytes"] == "500000", "left alone"
    assert got[t.jobs][0] == got[t.results][0] == 2, "the missing topics were created"


def test_topics_create_sizes_the_jobs_topic_for_the_worker_s_limit(kafka_bootstrap: str,
                                                                  tmp_path: Path) -> None:
    """Not the broker's 1 MB: a job the worker takes (limits.max_message_bytes) gets in."""
    t = new_names()
    limit = 3_000_000
    res = cli(tmp_path, kafka_bootstrap, t, "topics", "create", "--partitions", "1",
              toml=f"[limits]\nmax_message_bytes = {limit}\n")
    assert res.exit_code == 0, res.output
    assert "note:" not in res.stdout, res.stdout
    got = describe(kafka_bootstrap, [t.jobs, t.results, t.dlq])
    jobs_max = int(got[t.jobs][1]["max.message.bytes"])
    assert jobs_max == limit + 65_536
    assert int(got[t.dlq][1]["max.message.bytes"]) == jobs_max + 65_536
    assert int(got[t.results][1]["max.message.bytes"]) < limit, "results: the broker's"
    # A value at the limit, with a key and headers, is taken by the jobs topic.
    produce(kafka_bootstrap, t.jobs, [{"key": b"k" * 200, "value": b"v" * limit,
                                       "headers": [("traceparent", b"t" * 55)]}])
    assert len(read_all(kafka_bootstrap, t.jobs, 1)[0].value()) == limit


def test_topics_create_notes_a_jobs_topic_smaller_than_the_limit(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    t = new_names()
    create_topics(kafka_bootstrap, [t.jobs])  # the broker's default max.message.bytes
    res = cli(tmp_path, kafka_bootstrap, t, "topics", "create")
    assert res.exit_code == 0, res.output
    jobs_max = int(describe(kafka_bootstrap, [t.jobs])[t.jobs][1]["max.message.bytes"])
    assert jobs_max < DEFAULT_LIMIT
    assert (f"note: jobs topic {t.jobs} has max.message.bytes={jobs_max}, under the "
            f"{DEFAULT_LIMIT + 65_536} that limits.max_message_bytes={DEFAULT_LIMIT} needs"
            ) in " ".join(res.stdout.split())
    got = describe(kafka_bootstrap, [t.jobs, t.dlq])
    assert int(got[t.jobs][1]["max.message.bytes"]) == jobs_max, "left alone"
    assert int(got[t.dlq][1]["max.message.bytes"]) == jobs_max + 65_536, "sized for it"


# -- lag ---------------------------------------------------------------------------------

def test_lag_before_and_after_the_group_commits(kafka_bootstrap: str, tmp_path: Path) -> None:
    t = fresh_topics(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, t.jobs, [{"value": b"x", "partition": i % 2} for i in range(7)])
    before = cli(tmp_path, kafka_bootstrap, t, "lag", "--json")
    assert before.exit_code == 0, before.output
    doc = json.loads(before.stdout)
    assert (doc["group"], doc["topic"], doc["total_lag"]) == (t.group, t.jobs, 7)
    assert [(p["committed"], p["high"], p["lag"], p["note"]) for p in doc["partitions"]] == [
        (None, 4, 4, "no commit"), (None, 3, 3, "no commit")]

    c = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": t.group,
                     "enable.auto.commit": False})
    c.commit(offsets=[ck.TopicPartition(t.jobs, 0, 1)], asynchronous=False)
    c.close()
    after = json.loads(cli(tmp_path, kafka_bootstrap, t, "lag", "--json").stdout)
    assert [(p["committed"], p["lag"]) for p in after["partitions"]] == [(1, 3), (None, 3)]
    assert after["total_lag"] == 6 and after["partitions_without_commit"] == 1
    text = cli(tmp_path, kafka_bootstrap, t, "lag")
    assert "total lag: 6 (1 of 2 partitions without a commit)" in text.stdout


# -- dlq redrive -------------------------------------------------------------------------

def _dl(src: SourceRecord, error: JobRejected, *, by_reference: bool = False) -> dict[str, Any]:
    d = (dead_letter_by_reference(src, error, "w") if by_reference
         else dead_letter(src, error, "w"))
    return {"key": d.key, "value": d.value, "headers": d.headers}


def _redriven(bootstrap: str, t: Topics) -> list[ck.Message]:
    return [m for m in read_all(bootstrap, t.jobs, 2)
            if REDRIVEN_FROM in dict(m.headers() or [])]


def test_redrive_inline_and_by_reference_by_reason_once(kafka_bootstrap: str,
                                                        tmp_path: Path) -> None:
    t = fresh_topics(kafka_bootstrap, partitions=2)
    # Two large jobs on the jobs topic, dead-lettered by reference; the first then expires.
    big = [bytes([i]) * 50_000 for i in (1, 2)]
    offs = produce(kafka_bootstrap, t.jobs, [
        {"key": f"big-{i}".encode(), "value": v, "partition": 0,
         "headers": [("trace", f"b{i}".encode())]} for i, v in enumerate(big)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    fut = admin.delete_records([ck.TopicPartition(t.jobs, 0, offs[1])])
    next(iter(fut.values())).result(10)

    def src(key: str, value: bytes, offset: int, headers: Any = None) -> SourceRecord:
        return SourceRecord(t.jobs, 0, offset, key.encode(), value, headers, 1)

    hdrs = [("trace", b"s1"), (REDRIVEN_FROM, b"older/0/1")]
    dls = [_dl(src("s-1", b"job-s1", 100, hdrs), SchemaViolation("x")),            # 0 resend
           _dl(src("i-1", b"job-i1", 101), ImageRejected("x")),                     # 1 resend
           _dl(src("o-1", b"job-o1", 102), OversizedMessage("x")),                  # 2 not asked
           _dl(src("big-1", big[1], offs[1], [("trace", b"b1")]), ImageRejected("x"),
               by_reference=True),                                                  # 3 re-fetch
           _dl(src("big-0", big[0], offs[0]), ImageRejected("x"), by_reference=True),  # 4 gone
           {"key": b"foreign", "value": b"v", "headers": [("ktw.dlq.error.reason", b"schema")]},
           ]
    produce(kafka_bootstrap, t.dlq, dls)
    jobs_end = end_offsets(kafka_bootstrap, t.jobs, 2)
    cfg = worker_config(kafka_bootstrap, t)
    flt = Filter(frozenset({"schema", "bad_image"}))

    dry = redrive(cfg, RedriveRequest(flt, dry_run=True))
    assert (dry.scanned, dry.matched, dry.resent, dry.passed_over) == (6, 5, 4, 1)
    assert dict(dry.skipped) == {"source_not_retained": 1}
    assert end_offsets(kafka_bootstrap, t.jobs, 2) == jobs_end, "a dry run sends nothing"
    assert committed(kafka_bootstrap, f"{t.group}.redrive", t.dlq, 1) == {0: ck.OFFSET_INVALID}

    run = cli(tmp_path, kafka_bootstrap, t, "dlq", "redrive", "--reason", "schema",
              "--reason", "bad_image")
    assert run.exit_code == 1, run.output  # one matching record could not be re-sent
    assert "scanned: 6  matched: 5  re-sent: 4  skipped: 1  not matching: 1" in run.stdout
    assert f"{t.dlq}/0/4 [source_not_retained] {t.jobs}/0/{offs[0]} no longer retained" \
        in run.stdout
    assert committed(kafka_bootstrap, f"{t.group}.redrive", t.dlq, 1) == {0: 6}

    got = {m.key(): m for m in _redriven(kafka_bootstrap, t)}
    assert sorted(got) == [b"big-1", b"foreign", b"i-1", b"s-1"]
    assert got[b"s-1"].value() == b"job-s1"
    assert got[b"s-1"].headers() == [("trace", b"s1"), (REDRIVEN_FROM, f"{t.dlq}/0/0".encode())]
    assert got[b"i-1"].headers() == [(REDRIVEN_FROM, f"{t.dlq}/0/1".encode())]
    assert got[b"big-1"].value() == big[1], "re-fetched whole from the source topic"
    assert got[b"big-1"].headers() == [("trace", b"b1"),
                                       (REDRIVEN_FROM, f"{t.dlq}/0/3".encode())]
    assert got[b"foreign"].headers() == [(REDRIVEN_FROM, f"{t.dlq}/0/5".encode())]

    again = redrive(cfg, RedriveRequest(flt))
    assert (again.scanned, again.resent, sum(again.skipped.values())) == (0, 0, 0)
    assert len(_redriven(kafka_bootstrap, t)) == 4, "the second run re-sent nothing"


def test_redrive_window_and_limit_leave_the_rest_for_later(kafka_bootstrap: str) -> None:
    t = fresh_topics(kafka_bootstrap, partitions=2)
    hour = 3_600_000
    now = int(time.time() * 1000)
    stamps = [now - (5 - i) * hour for i in range(5)]  # 5 h ago ... 1 h ago
    produce(kafka_bootstrap, t.dlq, [
        {**_dl(SourceRecord(t.jobs, 0, i, f"j-{i}".encode(), b"v", None, None),
               SchemaViolation("x")), "timestamp": ts} for i, ts in enumerate(stamps)])
    cfg = worker_config(kafka_bootstrap, t)
    window = Filter(since_ms=now - int(4.5 * hour), until_ms=now - int(1.5 * hour))

    first = redrive(cfg, RedriveRequest(window, limit=2))
    assert (first.passed_over, first.resent, first.limit_reached, first.left) == (1, 2, True, 2)
    second = redrive(cfg, RedriveRequest(window, limit=2))
    assert (second.scanned, second.resent, second.stopped_at_until, second.left) == (1, 1, 1, 1)
    assert committed(kafka_bootstrap, f"{t.group}.redrive", t.dlq, 1) == {0: 4}
    third = redrive(cfg, RedriveRequest())
    assert (third.scanned, third.resent, third.left) == (1, 1, 0)
    keys = sorted(m.key() for m in _redriven(kafka_bootstrap, t))
    assert keys == [b"j-1", b"j-2", b"j-3", b"j-4"], "j-0 was passed over, the rest sent once"
