"""What happened around a broker's resume, from the worker's log and the broker's, as offsets in
seconds from the resume: a stall test's recovery figure alone cannot say whether the worker,
the group coordinator or the broker's own recovery took the time."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

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
    out: list[tuple[float, str]] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") in WORKER_EVENTS and "timestamp" in record:
            at = dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
            out.append((at.timestamp() - resume_wall, f"worker {record['event']}"))
    return out


def _broker_events(log: Path, group: str, resume_wall: float) -> list[tuple[float, str]]:
    marks = [(name, re.compile(pattern.format(group=re.escape(group))))
             for name, pattern in _BROKER_MARKS]
    out: list[tuple[float, str]] = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
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


def around_resume(worker_log: str, broker_log: Path | None, group: str, resume_wall: float,
                  before_s: float = 40.0, after_s: float = 60.0) -> list[tuple[float, str]]:
    """Events from ``before_s`` before the resume to ``after_s`` after it, in order, each as
    (seconds from the resume, "worker partitions_assigned" or "broker member_expired")."""
    events = _worker_events(worker_log, resume_wall)
    if broker_log is not None:
        events += _broker_events(broker_log, group, resume_wall)
    return [(offset, what) for offset, what in sorted(events) if -before_s <= offset <= after_s]


def group_reloaded_s(events: list[tuple[float, str]]) -> float | None:
    """When, after the resume, the broker loaded the worker's group again (its controller fenced
    it, so it gave up and took back the group coordinator), or None if it did not."""
    return next((offset for offset, what in events
                 if offset >= 0 and what == "broker group_loaded"), None)


def formatted(events: list[tuple[float, str]]) -> list[str]:
    """["+6.30 broker member_expired", ...]: a figure's form."""
    return [f"{offset:+.2f} {what}" for offset, what in events]
