"""Whether the broker's ACLs refuse this worker's consumer: READ on the jobs topic, READ on
its consumer group. Readiness reports it (worker.observe.attach) and a gauge shows it
(``trt_worker_consumer_refused``), so an ACL revoked at run time does not stall a fleet
behind green readiness while the lag grows.

Two sources, because librdkafka's own reports are not enough:

- the consumer's errors, seen by the intake (:meth:`Refusal.note`). A refused fetch
  (TOPIC_AUTHORIZATION_FAILED) is reported once per partition and then never again while the
  refusal lasts (librdkafka reports a partition's fetch error only when it changes), so a
  refusal counts until a record is consumed after it or a check of the broker says READ is
  allowed again, not for a while after the last report. A refused group is not reported at
  all until the member's session times out (``kafka.session_timeout_ms``, 45 s by default):
  its heartbeats fail quietly; only then does librdkafka drop the partitions (a loss, not a
  fatal error) and report each JoinGroup refusal (GROUP_AUTHORIZATION_FAILED, every ~2 s).
  Against Apache Kafka 4.1 it rejoins by itself within seconds of the grant: no new client is
  needed;
- the broker's answer (:class:`AclWatch`, off the loop's thread): which operations this
  client may perform on the jobs topic and on the group (KIP-430, the start-up check's own
  look-ups in worker.kafka.topics), asked every ~10 s, every ~2 s while refused. That finds a
  refused group well before its session times out, and a grant without waiting for a job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck
import structlog

from worker.exceptions import KafkaIOError
from worker.loop.stats import Stats

log = structlog.get_logger("worker")

# What a consumer error refuses, by librdkafka's code.
REFUSED_BY_CODE: Mapping[int, str] = {ck.KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
                                      ck.KafkaError.GROUP_AUTHORIZATION_FAILED: "group"}
RESOURCES = ("topic", "group")
CHECK_EVERY_S = 8.0  # between checks while allowed (plus RECHECK_S and the request itself)
RECHECK_S = 2.0  # between checks while refused, and the least gap between any two checks
CHECK_TIMEOUT_S = 5.0

Check = Callable[[], dict[str, str] | None]


@dataclass(frozen=True, slots=True)
class _Seen:
    at: float
    resource: str
    text: str
    consumed: int  # Stats.consumed when it was seen


@dataclass(frozen=True, slots=True)
class _Checked:
    at: float  # when the request was sent: a refusal reported after it is not covered
    refused: dict[str, str]


class Refusal:
    """The consumer's refusal as the intake saw it and as the broker last answered."""

    def __init__(self, stats: Stats, clock: Callable[[], float] = time.monotonic) -> None:
        self._stats, self._clock = stats, clock
        self._seen: _Seen | None = None
        self._checked: _Checked | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def note(self, code: int, text: str) -> bool:
        """A consumer error: True if it is a refusal (then recorded, and the broker asked
        again soon)."""
        resource = REFUSED_BY_CODE.get(code)
        if resource is None:
            return False
        self._seen = _Seen(self._clock(), resource, text, self._stats.consumed)
        self._wake.set()
        return True

    def checked(self, refused: dict[str, str], at: float) -> None:
        """The broker's answer to a request sent at ``at``: ``refused`` maps each refused
        resource ("topic", "group") to what is refused."""
        before = self.refused()
        self._checked = _Checked(at, refused)
        after = self.refused()
        if after.keys() - before.keys():
            log.warning("consumer_refused", refused=sorted(after.values()),
                        effect="no jobs consumed until the ACLs allow it again")
        elif before and not after:
            log.info("consumer_allowed_again", was=sorted(before.values()))

    def refused(self) -> dict[str, str]:
        """Each refused resource with what is refused; empty while nothing is."""
        checked, seen = self._checked, self._seen
        out = dict(checked.refused) if checked is not None else {}
        if (seen is not None and self._stats.consumed == seen.consumed
                and (checked is None or checked.at < seen.at)):
            out.setdefault(seen.resource, seen.text)
        return out

    def reason(self) -> str | None:
        """Why readiness is off, or None."""
        refused = self.refused()
        if not refused:
            return None
        return ("consumer refused by the broker's ACLs: "
                + "; ".join(refused[r] for r in RESOURCES if r in refused))

    def watch(self, check: Check, *, active: Callable[[], bool],
              stopped: Callable[[], bool]) -> None:
        """Ask ``check`` on a side thread (once: later calls do nothing) while ``active()``,
        until ``stopped()``. ``check`` returns the refused resources, or None when the broker
        did not answer (the last answer stands)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, args=(check, active, stopped),
                                        name="acl-watch", daemon=True)
        self._thread.start()

    def _run(self, check: Check, active: Callable[[], bool],
             stopped: Callable[[], bool]) -> None:
        while not stopped():
            self._wake.wait(RECHECK_S if self.refused() else CHECK_EVERY_S)
            self._wake.clear()
            if stopped():
                return
            if not active():
                continue
            at = self._clock()
            refused = check()
            if refused is not None:
                self.checked(refused, at)
            # However often the consumer reports a refusal (a JoinGroup every ~2 s).
            time.sleep(RECHECK_S)


def acl_check(cfg: Any, jobs: str, group: str) -> Check:
    """What the broker's ACLs refuse this client (``cfg``: a WorkerConfig, its credentials)
    of READ on ``jobs`` and READ on ``group``; None when the cluster does not answer. The
    admin client is made at the first call and kept (one connection, no handshake per
    check)."""
    from worker.kafka.admin import Admin
    from worker.kafka.topics import group_operations, may, topic_operations

    admin: list[Admin] = []

    def check() -> dict[str, str] | None:
        try:
            if not admin:
                admin.append(Admin(cfg, timeout=CHECK_TIMEOUT_S))
            ops = topic_operations(admin[0], [jobs]).get(jobs)
        except KafkaIOError:  # no answer: a group look-up would only log the same outage
            return None
        refused: dict[str, str] = {}
        if not may(ops, "READ"):
            refused["topic"] = f"READ on topic {jobs} refused"
        if not may(group_operations(admin[0], group), "READ"):
            refused["group"] = f"READ on group {group} refused"
        return refused

    return check


def refusal_of(worker: Any) -> Refusal | None:
    """The worker's (worker.loop.worker.Worker) refusal, kept by its intake; None for a
    stand-in without one."""
    return getattr(getattr(worker, "intake", None), "refusal", None)


def watch_refusal(worker: Any) -> Callable[[], str | None]:
    """Start asking the broker whether it still lets ``worker``'s consumer read (once per
    worker; from the first subscription until the worker stops) and return the readiness
    reason it gives: :meth:`Refusal.reason`."""
    refusal = refusal_of(worker)
    if refusal is None:
        return lambda: None
    refusal.watch(acl_check(worker.cfg, worker.topics.jobs, worker.cfg.kafka.group_id),
                  active=lambda: bool(worker.vitals.subscribed),
                  stopped=lambda: bool(worker.vitals.stopping or worker.fatal_error is not None))
    return refusal.reason
