"""A static member killed inside a cooperative rebalance leaves partitions to nobody; the
restarted worker finds them and has the group hand them out (worker/loop/group/orphans.py).

Reproduced with real members: "w0" (a plain consumer) takes all six partitions, a second
member joins, and w0 is SIGKILLed inside its revoke callback, after giving up three partitions
and before the round that would hand them over. The worker then starts as w0 (same instance id,
as a StatefulSet restarts it) and gets w0's stored three back without a rebalance. Without the
watch, the other three stayed unassigned for as long as anyone watched (400 s by hand), their
jobs unanswered.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.harness.workers import (
    ThreadedWorker,
    fresh_topics,
    worker_config,
)
from worker.loop.group import orphans

pytestmark = pytest.mark.integration

SESSION_MS = 45_000  # the dead w0 stays a member for longer than the test needs

MEMBER = f"""
import json, os, signal, sys
import confluent_kafka as ck
boot, topic, group, inst, die = sys.argv[1:6]
def say(event, partitions):
    print(json.dumps({{"event": event,
                      "partitions": sorted(p.partition for p in partitions)}}), flush=True)
def on_revoke(consumer, partitions):
    if die == "1" and partitions:
        say("killed_in_revoke", partitions)
        os.kill(os.getpid(), signal.SIGKILL)
    say("revoke", partitions)
c = ck.Consumer({{"bootstrap.servers": boot, "group.id": group, "group.instance.id": inst,
                 "partition.assignment.strategy": "cooperative-sticky",
                 "session.timeout.ms": {SESSION_MS}, "enable.auto.commit": False}})
c.subscribe([topic], on_assign=lambda c, ps: say("assign", ps), on_revoke=on_revoke)
while True:
    c.poll(0.1)
"""


class Member:
    """A plain static member in a child process; its rebalance events, as they come."""

    def __init__(self, bootstrap: str, topic: str, group: str, instance: str, *,
                 die_in_revoke: bool) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER, bootstrap, topic, group, instance,
             "1" if die_in_revoke else "0"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[str] | None) -> None:
        for line in out or ():
            self.events.append(json.loads(line))

    def held(self) -> set[int]:
        owned: set[int] = set()
        for e in list(self.events):
            parts = set(e["partitions"])
            owned = owned | parts if e["event"] == "assign" else owned - parts
        return owned

    def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in list(self.events):
                if e["event"] == event:
                    return e
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} within {timeout} s: {self.events}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_partitions_left_by_a_member_killed_mid_rebalance_are_handed_out(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(orphans, "CHECK_EVERY_S", 1.0)
    # In service the orphans must outlast the session timeout (45 s here) first.
    monkeypatch.setattr(orphans, "persist_threshold", lambda *_args: 2.0)
    topics = fresh_topics(kafka_bootstrap, partitions=6)
    cfg = worker_config(kafka_bootstrap, topics, kafka={
        "static_membership": True, "instance_id": "w0", "session_timeout_ms": SESSION_MS})
    w0 = Member(kafka_bootstrap, topics.jobs, topics.group, "w0", die_in_revoke=True)
    other = None
    try:
        assert w0.wait_for("assign", 60)["partitions"] == [0, 1, 2, 3, 4, 5]
        other = Member(kafka_bootstrap, topics.jobs, topics.group, "other",
                       die_in_revoke=False)
        given_up = set(w0.wait_for("killed_in_revoke", 60)["partitions"])
        assert len(given_up) == 3, "w0 dies holding three and having given up three"
        assert w0.proc.wait(10) != 0
        other.wait_for("assign", 30)
        assert other.held() == set(), "the second round never came: the other member got none"

        with ThreadedWorker(cfg) as tw:  # w0 again, before its session expires
            deadline, held = time.monotonic() + 60, set()
            while time.monotonic() < deadline:
                mine = {p for t, p in set(tw.worker.assignment.owned) if t == topics.jobs}
                held = mine | other.held()
                if held == set(range(6)) and not mine & other.held():
                    break
                time.sleep(0.2)
            rejoins = tw.worker.guarantee_totals()["orphan_rejoins"]
        # Every partition has an owner again, those w0 gave up (nobody's until the rejoin)
        # among them, through the watch's rejoin.
        assert held == set(range(6)), f"held by nobody: {set(range(6)) - held}"
        assert rejoins >= 1
    finally:
        w0.kill()
        if other is not None:
            other.kill()
