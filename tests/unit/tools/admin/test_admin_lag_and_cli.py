"""Lag arithmetic, client settings, the redrive summary and the command line (no broker)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from worker.config import load_config
from worker.kafka.admin import admin_settings
from worker.tools.admin.common import default_redrive_group, task_topics
from worker.tools.admin.errors import AdminError, BadOption
from worker.tools.admin.lag import EXPIRED, NO_COMMIT, LagReport, partition_lag
from worker.tools.admin.redrive_kafka import reader_settings, scan_start, sender_settings
from worker.tools.admin.redrive_summary import RedriveSummary
from worker.tools.cli import app


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """Commands configure logging onto the CliRunner's stderr; put the root logger back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_partition_lag() -> None:
    assert partition_lag(0, 40, 10, 100).lag == 60
    assert partition_lag(0, 100, 10, 100).lag == 0
    none = partition_lag(1, None, 10, 100)
    assert (none.committed, none.lag, none.note) == (None, 90, NO_COMMIT)
    expired = partition_lag(2, 5, 10, 100)
    assert (expired.lag, expired.note) == (90, EXPIRED)
    assert partition_lag(3, 150, 10, 100).lag == 0


def test_lag_report_totals_and_json() -> None:
    r = LagReport("g", "t", [partition_lag(0, 40, 0, 100), partition_lag(1, None, 5, 8)])
    assert r.total == 63 and r.without_commit == 1
    doc = json.loads(json.dumps(r.as_json()))
    assert doc["total_lag"] == 63 and doc["partitions_without_commit"] == 1
    assert doc["partitions"][1] == {"partition": 1, "committed": None, "low": 5, "high": 8,
                                    "lag": 3, "note": NO_COMMIT}
    assert doc["partitions"][0]["note"] is None


def test_redrive_start_offset() -> None:
    assert scan_start(None, 3, 10) == 3, "no commit: from the beginning"
    assert scan_start(7, 3, 10) == 7 and scan_start(10, 3, 10) == 10
    assert scan_start(1, 3, 10) == 3, "expired under the commit: from the log start"
    assert scan_start(12, 3, 10) == 3, "beyond the end (DLQ recreated): from the beginning"


def test_settings_carry_security_and_the_guarantees() -> None:
    cfg = load_config(None, kafka={"bootstrap_servers": "b:9092", "group_id": "live",
                                   "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                   "sasl_username": "u", "sasl_password": "p"})
    a = admin_settings(cfg)
    assert (a["bootstrap.servers"], a["security.protocol"], a["sasl.password"]) == (
        "b:9092", "SASL_SSL", "p")
    assert "group.id" not in a and "enable.auto.commit" not in a
    r = reader_settings(cfg, default_redrive_group(cfg))
    assert r["group.id"] == "live.redrive" and r["enable.auto.commit"] is False
    assert r["isolation.level"] == "read_committed" and r["sasl.username"] == "u"
    s = sender_settings(cfg)
    assert s["enable.idempotence"] is True and s["acks"] == "all"
    assert s["message.timeout.ms"] == 120_000
    assert s["security.protocol"] == "SASL_SSL"


def test_task_topics() -> None:
    cfg = load_config(None, topics={"jobs": "a", "results": "b", "dlq": "c"})
    t = task_topics(cfg)
    assert (t.jobs, t.results, t.dlq) == ("a", "b", "c")
    g = task_topics(load_config(None, processing={"task": "generation"}))
    assert (g.jobs, g.results, g.dlq) == ("generation.jobs", "generation.results",
                                          "generation.dlq")


def test_summary_lines() -> None:
    s = RedriveSummary("dlq", "jobs", "g.redrive", dry_run=False, scanned=9, matched=5,
                       resent=3, passed_over=4, resent_by_reason=Counter(schema=3))
    s.skip("source_not_retained", "dlq/0/4", "jobs/1/2 no longer retained")
    s.skip("bad_reference", "dlq/0/5", "unreadable reference")
    text = "\n".join(s.lines())
    assert "scanned: 9  matched: 5  re-sent: 3  skipped: 2  not matching: 4" in text
    assert "re-sent by reason: schema=3" in text
    assert "skipped by reason: bad_reference=1, source_not_retained=1" in text
    assert "dlq/0/4 [source_not_retained] jobs/1/2 no longer retained" in text
    assert "group g.redrive has moved past them" in text
    dry = RedriveSummary("dlq", "jobs", "g", dry_run=True, resent=2, limit_reached=True, left=7)
    text = "\n".join(dry.lines())
    assert "would re-send: 2" in text and "--limit reached; 7 records left" in text
    assert "nothing sent, no offsets committed" in text


@pytest.mark.parametrize(("args", "error", "text"), [
    (["dlq", "redrive", "--since", "2024-05-01T10:00"], BadOption, "no time zone"),
    (["dlq", "redrive", "--since", "2024-05-02T00:00Z", "--until", "2024-05-01T00:00Z"],
     BadOption, "--until must be after --since"),
    (["topics", "create", "--topic-config", "retention.ms"], BadOption, "key=value"),
    (["lag"], AdminError, "no brokers configured"),
])
def test_cli_refuses_bad_input_before_connecting(args: list[str], error: type[Exception],
                                                 text: str) -> None:
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, error), result.output
    assert text in str(result.exception)


def test_cli_help() -> None:
    runner = CliRunner()
    for args, options in ((["topics", "create"], ("--partitions", "--replication-factor",
                                                  "--topic-config", "--dry-run")),
                          (["lag"], ("--group", "--topic", "--json")),
                          (["dlq", "redrive"], ("--reason", "--since", "--until", "--limit",
                                                "--dry-run", "--to-topic", "--group"))):
        result = runner.invoke(app, [*args, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        for opt in options:
            assert opt in result.output
