"""What happened around a broker's resume, from the worker's log and the broker's, as offsets in
seconds from the resume: a stall test's recovery figure alone cannot say whether the worker,
the group coordinator or the broker's own recovery took the time."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from tests.harness.faults.fleet import log_records
from worker.devkit.local_kafka.process import appended_since

# The worker's events that mark its way back into the group.
WORKER_EVENTS = frozenset({"partitions_lost", "consumer_reopened", "partitions_assigned",
                           "commit_failed", "transaction_abort", "producer_reset"})

# Broker log lines (Kafka 4.x wording) that mark the broker's own recovery; {group} is the
# worker's consumer group.
_BROKER_MARKS = (
    ("fenced", r"Fencing broker \d+ .*session has timed out"),
    ("unfenced", r"handleBrokerUnfenced"),
    ("group_loaded", r"Loaded classic group {group} "),
    ("member_joined", r"member with unknown member id joins group {group} "),
    ("member_expired", r"in group {group} has failed, removing it"),
    ("stabilized", r"Stabilized group {group} "),
)
_BROKER_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def _worker_events(text: str, resume_wall: float) -> list[tuple[float, str]]:
    return [(dt.datetime.fromisoformat(record["timestamp"]).timestamp() - resume_wall,
             f"worker {record['event']}")
            for record in log_records(text)
            if record.get("event") in WORKER_EVENTS and "timestamp" in record]


def _broker_events(log: Path, from_byte: int, group: str,
                   resume_wall: float) -> list[tuple[float, str]]:
    marks = [(name, re.compile(pattern.format(group=re.escape(group))))
             for name, pattern in _BROKER_MARKS]
    out: list[tuple[float, str]] = []
    for line in appended_since(log, from_byte).decode(errors="replace").splitlines():
        stamp = _BROKER_TIME.match(line)
        if stamp is None:
            continue
        for name, pattern in marks:
            if pattern.search(line):
                # The broker logs local time without a zone; this process shares its clock.
                at = dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                out.append((at.timestamp() - resume_wall, f"broker {name}"))
                break
    return out


def around_resume(worker_log: str, broker_log: Path, group: str, resume_wall: float, *,
                  broker_log_from: int = 0, before_s: float = 40.0,
                  after_s: float = 60.0) -> list[tuple[float, str]]:
    """Events from ``before_s`` before the resume to ``after_s`` after it, in order, each as
    (seconds from the resume, "worker partitions_assigned" or "broker member_expired").
    Only the broker log written from byte ``broker_log_from`` is read: a session's broker log
    holds every earlier test's lines."""
    events = _worker_events(worker_log, resume_wall) + _broker_events(
        broker_log, broker_log_from, group, resume_wall)
    return [(offset, what) for offset, what in sorted(events) if -before_s <= offset <= after_s]


def group_reloaded_s(events: list[tuple[float, str]]) -> float | None:
    """When, after the resume, the broker loaded the worker's group again (its controller fenced
    it, so it gave up and took back the group coordinator), or None if it did not."""
    return next((offset for offset, what in events
                 if offset >= 0 and what == "broker group_loaded"), None)


def formatted(events: list[tuple[float, str]]) -> list[str]:
    """["+6.30 broker member_expired", ...]: a figure's form."""
    return [f"{offset:+.2f} {what}" for offset, what in events]
