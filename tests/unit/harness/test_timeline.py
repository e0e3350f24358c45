"""The stall tests' timeline: worker and broker events as seconds from the resume."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.harness.faults.timeline import around_resume, formatted, group_reloaded_s

RESUME = dt.datetime(2026, 12, 6, 19, 58, 25, 600000)


def _worker_line(event: str, at: dt.datetime) -> str:
    stamp = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"event": event, "level": "info", "timestamp": stamp})


def _broker_line(at: dt.datetime, text: str) -> str:
    return f"[{at.strftime('%Y-%m-%d %H:%M:%S')},{at.microsecond // 1000:03d}] INFO {text}"


def test_events_of_both_logs_in_order_as_offsets_from_the_resume(tmp_path: Path) -> None:
    s = dt.timedelta(seconds=1)
    worker = "\n".join([
        _worker_line("partitions_lost", RESUME - 24 * s),
        _worker_line("worker_stats", RESUME + s),  # not a membership event
        "not json",
        _worker_line("consumer_reopened", RESUME + 3 * s),
        _worker_line("partitions_assigned", RESUME + 6.4 * s),
    ])
    broker = tmp_path / "broker.log"
    broker.write_text("\n".join([
        _broker_line(RESUME + 0.1 * s, "[QuorumController id=1] Fencing broker 1 at epoch 12 "
                                       "because its session has timed out."),
        _broker_line(RESUME + 0.4 * s, "[GroupCoordinator id=1] Loaded classic group g-1 with "
                                       "1 members."),
        _broker_line(RESUME + 0.5 * s, "[GroupCoordinator id=1] Loaded classic group other with "
                                       "1 members."),
        _broker_line(RESUME + 6.3 * s, "Member m-1 in group g-1 has failed, removing it from "
                                       "the group."),
        "  a continuation line without a stamp",
    ]))
    events = around_resume(worker, broker, "g-1", RESUME.timestamp())
    assert group_reloaded_s(events) == pytest.approx(0.4, abs=1e-3)
    assert formatted(events) == [
        "-24.00 worker partitions_lost",
        "+0.10 broker fenced",
        "+0.40 broker group_loaded",
        "+3.00 worker consumer_reopened",
        "+6.30 broker member_expired",
        "+6.40 worker partitions_assigned",
    ]


def test_a_missing_broker_log_leaves_the_worker_events(tmp_path: Path) -> None:
    worker = _worker_line("partitions_assigned", RESUME + dt.timedelta(seconds=2))
    events = around_resume(worker, tmp_path / "absent.log", "g", RESUME.timestamp())
    assert formatted(events) == ["+2.00 worker partitions_assigned"]
    assert group_reloaded_s(events) is None


def test_a_group_loaded_before_the_resume_is_no_reload(tmp_path: Path) -> None:
    broker = tmp_path / "broker.log"
    broker.write_text(_broker_line(RESUME - dt.timedelta(seconds=30),
                                   "Loaded classic group g with 1 members."))
    events = around_resume("", broker, "g", RESUME.timestamp())
    assert formatted(events) == ["-30.00 broker group_loaded"]
    assert group_reloaded_s(events) is None
