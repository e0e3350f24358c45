"""Feeding and reading real topics: a steady job feeder, a watcher of an output topic, a full
read at a given isolation level, and the audit of what a topic holds per key."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka as ck

from tests.harness.faults.corpus import good_job

# --- feeding and reading ------------------------------------------------------------------------

# The test's own clients recover from a frozen broker as fast as the worker's do (see
# worker.kafka.clients.common_settings), so a recovery time measured through them is the worker's.
CLIENT_RECOVERY = {"metadata.recovery.rebootstrap.trigger.ms": 5_000}


class Feeder(threading.Thread):
    """Produces jobs at a steady rate until stopped; every ``bad_every``-th one is malformed."""

    def __init__(self, bootstrap: str, topic: str, *, rate_per_s: float, prefix: str,
                 bad_every: int = 0, limit: int | None = None, burst: int = 0) -> None:
        super().__init__(name="feeder", daemon=True)
        self.topic, self.rate, self.prefix = topic, rate_per_s, prefix
        self.bad_every, self.limit, self.burst = bad_every, limit, burst
        self.good: list[str] = []
        self.bad: list[str] = []
        self.sent_at: dict[str, float] = {}
        self.failures: list[str] = []
        self._halt = threading.Event()
        self._steady_from: float | None = None
        self._last_sent = 0.0
        # A job sent while the broker is frozen waits for it: librdkafka's default 300 s
        # delivery timeout failed the feeder itself in a 300 s stall.
        self._producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                      "linger.ms": 5, "message.timeout.ms": 900_000,
                                      **CLIENT_RECOVERY})

    def fed_per_s(self) -> float | None:
        """The steady rate achieved (after the burst): below ``rate`` when this thread could
        not keep up (a loaded machine)."""
        steady = len(self.good) + len(self.bad) - self.burst
        if self._steady_from is None or steady < 2 or self._last_sent <= self._steady_from:
            return None
        return round(steady / (self._last_sent - self._steady_from), 1)

    def run(self) -> None:
        start = time.monotonic()
        i = 0
        while not self._halt.is_set() and (self.limit is None or i < self.limit):
            # The first ``burst`` jobs at once (a backlog), then the steady rate.
            wait = start + max(0, i - self.burst) / self.rate - time.monotonic()
            if wait > 0:
                self._halt.wait(wait)
                continue
            bad = self.bad_every > 0 and i % self.bad_every == self.bad_every - 1
            key = f"{self.prefix}{'bad' if bad else 'job'}-{i:06d}"
            value = b"\xc1 not msgpack" if bad else good_job(key)
            try:
                self._producer.produce(self.topic, key=key.encode(), value=value,
                                       on_delivery=self._acked)
            except BufferError:
                # librdkafka's queue is full (a frozen broker at 1,000 jobs/s fills its
                # 100,000 records in 100 s): wait for room, as a producing application does.
                self._producer.poll(0.1)
                continue
            (self.bad if bad else self.good).append(key)
            self.sent_at[key] = self._last_sent = time.monotonic()
            if i == self.burst:
                self._steady_from = self._last_sent
            self._producer.poll(0)
            i += 1

    def _acked(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(str(err))

    def stop(self, timeout: float = 120.0) -> None:
        """Stop feeding and wait until every job sent is acknowledged."""
        self._halt.set()
        if self.is_alive():
            self.join(30)
        left = self._producer.flush(timeout)
        assert left == 0 and not self.failures, (left, self.failures[:3])

    def halt(self) -> None:
        """Stop feeding, no questions asked (cleanup after a failure)."""
        self._halt.set()
        if self.is_alive():
            self.join(30)


class TopicWatcher(threading.Thread):
    """Reads a topic from the beginning; records when each key was first seen and how often."""

    def __init__(self, bootstrap: str, topic: str, *, isolation: str = "read_committed") -> None:
        super().__init__(name=f"watch-{topic}", daemon=True)
        self.counts: collections.Counter[str] = collections.Counter()
        self.first_seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._consumer = ck.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"watch-{uuid.uuid4()}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "isolation.level": isolation, "fetch.wait.max.ms": 100, **CLIENT_RECOVERY,
        })
        # Assigned, not subscribed: a watcher in a group is dropped from it in a long broker
        # freeze and must rejoin, and librdkafka's rejoin can sit for tens of seconds (what
        # worker/loop/group/rejoin.py works around); its delay would count as the worker's recovery.
        meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
        self._consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                               for p in sorted(meta.partitions)])

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for msg in self._consumer.consume(500, timeout=0.2):
                    if msg.error() is not None or msg.key() is None:
                        continue
                    key = msg.key().decode()
                    with self._lock:
                        self.counts[key] += 1
                        self.first_seen.setdefault(key, time.monotonic())
        finally:
            self._consumer.close()

    def seen(self) -> set[str]:
        with self._lock:
            return set(self.counts)

    def wait_for(self, keys: set[str], timeout: float,
                 alive: Callable[[], bool] | None = None) -> bool:
        """Until every key is seen, the timeout passes, or ``alive()`` turns False."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (alive is None or alive()):
            if keys <= self.seen():
                return True
            time.sleep(0.2)
        return keys <= self.seen()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(30)

    halt = stop

    def __enter__(self) -> TopicWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OutputWatch:
    """Watches a scenario's results and DLQ topics: it has drained only when every good job
    has a result *and* every bad one its DLQ record (the last job fed may well be a bad one)."""

    def __init__(self, bootstrap: str, topics: Any) -> None:
        self.results = TopicWatcher(bootstrap, topics.results)
        self.dlq = TopicWatcher(bootstrap, topics.dlq)

    def start(self) -> None:
        self.results.start()
        self.dlq.start()

    def stop(self) -> None:
        self.results.stop()
        self.dlq.stop()

    halt = stop

    def wait_for(self, good: set[str], bad: set[str], timeout: float,
                 alive: Callable[[], bool] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        return (self.results.wait_for(good, timeout, alive)
                and self.dlq.wait_for(bad, max(0.0, deadline - time.monotonic()), alive))


def read_all(bootstrap: str, topic: str, *, isolation: str = "read_committed",
             idle_s: float = 3.0, timeout: float = 120.0) -> list[ck.Message]:
    """Every record of a topic, read from the beginning until ``idle_s`` pass with nothing new."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4()}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "isolation.level": isolation, **CLIENT_RECOVERY})
    c.subscribe([topic])
    out: list[ck.Message] = []
    deadline = time.monotonic() + timeout
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - last_new < idle_s:
            msgs = [m for m in c.consume(1000, timeout=0.3) if m.error() is None]
            if msgs:
                out.extend(msgs)
                last_new = time.monotonic()
    finally:
        c.close()
    return out


def scan(bootstrap: str, topic: str, visit: Callable[[ck.Message], None], *,
         isolation: str = "read_committed", idle_s: float = 3.0, timeout: float = 600.0) -> int:
    """:func:`read_all` without keeping the records: ``visit`` sees each one; returns how many.
    A long drill's topics hold a million records (gigabytes as kept messages)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4()}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "isolation.level": isolation, **CLIENT_RECOVERY})
    c.subscribe([topic])
    n = 0
    deadline = time.monotonic() + timeout
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - last_new < idle_s:
            msgs = [m for m in c.consume(1000, timeout=0.3) if m.error() is None]
            for m in msgs:
                visit(m)
            if msgs:
                n += len(msgs)
                last_new = time.monotonic()
    finally:
        c.close()
    return n


def key_counts(msgs: list[ck.Message]) -> collections.Counter[str]:
    return collections.Counter(m.key().decode() for m in msgs if m.key() is not None)


@dataclass
class Audit:
    """Per-key result counts of one run against the keys that were sent."""

    expected: set[str]
    counts: collections.Counter[str]
    missing: set[str] = field(init=False)
    duplicates: int = field(init=False)
    unexpected: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.missing = self.expected - set(self.counts)
        self.duplicates = sum(n - 1 for k, n in self.counts.items() if n > 1)
        self.unexpected = set(self.counts) - self.expected

    def summary(self) -> dict[str, int]:
        return {"expected": len(self.expected), "answered": len(set(self.counts)),
                "missing": len(self.missing), "duplicates": self.duplicates,
                "unexpected": len(self.unexpected)}


class HealthWatch(threading.Thread):
    """Samples a worker's /healthz and /readyz every ``every_s`` (status 0: no answer), so a
    fault run can tell whether liveness held and when readiness went off and came back."""

    def __init__(self, port: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="health-watch")
        self.base, self.every_s = f"http://127.0.0.1:{port}", every_s
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, healthz, readyz)
        self._halt = threading.Event()

    def _status(self, path: str) -> int:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.base + path, timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            self.samples.append((time.monotonic(), self._status("/healthz"),
                                 self._status("/readyz")))

    def halt(self) -> None:
        self._halt.set()

    def figures(self, t_pause: float, t_resume: float) -> dict[str, Any]:
        """Liveness and readiness around a fault from ``t_pause`` to ``t_resume``."""
        during = [s for s in self.samples if t_pause <= s[0] <= t_resume]
        after = [s for s in self.samples if s[0] > t_resume]
        answered = [s for s in self.samples if s[0] >= t_pause and s[1] != 0]
        back = next((s[0] - t_resume for s in after if s[2] == 200), None)
        return {"samples": len(self.samples),
                "live_throughout": bool(answered) and all(s[1] == 200 for s in answered),
                "not_live_samples": sum(1 for s in answered if s[1] != 200),
                "ready_off_during_stall": any(s[2] == 503 for s in during),
                "ready_again_after_s": None if back is None else round(back, 1)}
