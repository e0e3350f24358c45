"""Fault-injection harness shared by the fault tests and the long scripts in bench/faults/.

Everything here drives real processes against a real broker: a steady job feeder, a reader that
watches an output topic, a fleet of `trt-worker run` processes (kill -9, SIGTERM, restart with
the same instance id), a full read of a topic at a given isolation level, and the malformed-job
corpus. No Kafka mocks.
"""

from __future__ import annotations

import collections
import functools
import io
import random
import re
import struct
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import msgpack
from PIL import Image

from worker.bundled import samples_dir
from worker.config import WorkerConfig
from worker.devkit.workers import WorkerProcess, worker_env
from worker.tools.produce import encode_job

# --- jobs ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def small_images() -> tuple[bytes, ...]:
    """The bundled samples re-encoded at 128x128 (JPEG, one PNG): cheap to decode, so the
    2-core test machine spends its time on the model and the faults, not on Pillow."""
    out: list[bytes] = []
    for i, path in enumerate(sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")):
        img = Image.open(path).convert("RGB").resize((128, 128))
        buf = io.BytesIO()
        img.save(buf, format="PNG" if i == 0 else "JPEG", quality=85)
        out.append(buf.getvalue())
    return tuple(out)


def good_job(job_id: str) -> bytes:
    images = small_images()
    return encode_job(job_id, images[hash(job_id) % len(images)])


# --- malformed corpus ---------------------------------------------------------------------------


def _png(width: int, height: int, idat: bytes, color_type: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


@functools.lru_cache(maxsize=1)
def png_bomb() -> bytes:
    """A real decompression bomb: a 5000x5000 grayscale PNG whose zlib stream (~25 KB) inflates
    to 25 MB of pixels. Refused by the pixel budget (limits.max_image_pixels) from the header."""
    side = 5000
    raw = (b"\x00" + b"\x00" * side) * side  # filter byte + one row, per row
    return _png(side, side, zlib.compress(raw, 9), color_type=0)


def header_50k() -> bytes:
    """A tiny PNG whose header declares 50,000 x 50,000 pixels (refused by max_image_side)."""
    return _png(50_000, 50_000, zlib.compress(b"\x00" * 1024))


# Limits the flood's worker runs with (the corpus is sized against them).
FLOOD_LIMITS = {"max_message_bytes": 64 * 1024, "max_image_bytes": 48 * 1024,
                "max_image_pixels": 4_000_000, "max_text_chars": 20_000}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


Builder = Callable[[str, random.Random], bytes | None]


def _class_builders(jpeg: bytes) -> dict[str, tuple[str, Builder]]:
    """class -> (expected DLQ reason, builder(job_id, rng) -> record value)."""

    def truncated_msgpack(i: str, r: random.Random) -> bytes:
        whole = encode_job(i, jpeg)
        return whole[: r.randrange(1, len(whole) - 1)]

    def invalid_utf8(i: str, r: random.Random) -> bytes:
        # map{v: 1, id: <str with invalid UTF-8>, image: bin}
        bad = bytes([0xFF, 0xFE, 0xC3, 0x28])[: r.randrange(1, 5)]
        return (b"\x83\xa1v\x01\xa2id" + bytes([0xA0 | len(bad)]) + bad
                + b"\xa5image\xc4\x01x")

    return {
        "not_msgpack": ("not_msgpack", lambda i, r: b"\xc1" + r.randbytes(r.randrange(0, 64))),
        "truncated_msgpack": ("not_msgpack", truncated_msgpack),
        "not_a_map": ("not_msgpack", lambda i, r: _pack([1, i, b"img"])),
        "invalid_utf8": ("not_msgpack", invalid_utf8),
        "wrong_types": ("schema", lambda i, r: _pack(
            r.choice([{"v": 1, "id": 123, "image": jpeg}, {"v": 1, "id": i, "image": "text"},
                      {"v": 1, "id": i, "image": jpeg, "deadline_ms": "soon"}]))),
        "missing_fields": ("schema", lambda i, r: _pack(
            r.choice([{"v": 1, "id": i}, {"v": 1, "image": jpeg}, {"id": i, "image": jpeg}]))),
        "unknown_v": ("unsupported_version", lambda i, r: _pack(
            {"v": r.choice([0, 3, 4, 99]), "id": i, "image": jpeg})),
        "unknown_field": ("schema", lambda i, r: _pack(
            {"v": 1, "id": i, "image": jpeg, "colour": "red"})),
        "zero_byte_image": ("schema", lambda i, r: _pack({"v": 1, "id": i, "image": b""})),
        "huge_text": ("schema", lambda i, r: encode_job(i, jpeg, text="x" * 30_000)),
        "unknown_policy": ("unknown_policy", lambda i, r: encode_job(i, jpeg, policy="nope")),
        "tombstone": ("schema", lambda i, r: None),
        "oversized_message": ("oversized", lambda i, r: b"\x00" * (70 * 1024)),
        "oversized_image_field": ("schema", lambda i, r: encode_job(i, b"\xff" * (50 * 1024))),
        "truncated_jpeg": ("bad_image", lambda i, r: encode_job(
            i, jpeg[: r.randrange(len(jpeg) // 4, len(jpeg) * 3 // 4)])),
        "garbage_image": ("bad_image", lambda i, r: encode_job(i, r.randbytes(200))),
        "png_bomb": ("bad_image", lambda i, r: encode_job(i, png_bomb())),
        "header_50k_x_50k": ("bad_image", lambda i, r: encode_job(i, header_50k())),
    }


CLASS_WEIGHTS = {"oversized_message": 0.2, "oversized_image_field": 0.2, "huge_text": 0.2,
                 "png_bomb": 0.5}  # the large ones (25-70 KB each), fewer of them


@dataclass(frozen=True)
class BadJob:
    key: str
    value: bytes | None
    klass: str
    reason: str


def malformed_corpus(n: int, seed: int = 6) -> list[BadJob]:
    """``n`` malformed jobs over every class (keys ``bad-<class>-<i>``), shuffled."""
    rng = random.Random(seed)
    jpeg = small_images()[1]
    builders = _class_builders(jpeg)
    weights = {k: CLASS_WEIGHTS.get(k, 1.0) for k in builders}
    total = sum(weights.values())
    counts = {k: max(1, int(n * w / total)) for k, w in weights.items()}
    counts["not_msgpack"] += n - sum(counts.values())
    jobs = []
    for klass, count in counts.items():
        reason, build = builders[klass]
        for j in range(count):
            key = f"bad-{klass}-{j:05d}"
            jobs.append(BadJob(key, build(key, rng), klass, reason))
    rng.shuffle(jobs)
    return jobs


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
        self._producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                      "linger.ms": 5, **CLIENT_RECOVERY})

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
            self._producer.produce(self.topic, key=key.encode(), value=value,
                                   on_delivery=self._acked)
            (self.bad if bad else self.good).append(key)
            self.sent_at[key] = time.monotonic()
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
        self._consumer.subscribe([topic])

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


# --- worker fleet -------------------------------------------------------------------------------


class Fleet:
    """`trt-worker run` processes by instance id; restarts reuse the id (as a StatefulSet does).

    Use as a context manager: every process still running at exit is killed, so a failing test
    never leaks a worker.
    """

    def __init__(self, cfg: WorkerConfig, log_dir: Path, **env: str) -> None:
        self.cfg, self.log_dir, self.env = cfg, log_dir, env
        self.procs: dict[str, WorkerProcess] = {}  # the latest process of each instance
        self.every: list[WorkerProcess] = []
        self.stopped: set[str] = set()  # instances stopped on purpose (SIGTERM)
        self._helpers: list[Any] = []  # feeders and watchers to halt on the way out
        self.starts: collections.Counter[str] = collections.Counter()
        self.exit_codes: list[tuple[str, int]] = []

    def start(self, instance: str, **env: str) -> WorkerProcess:
        self.starts[instance] += 1
        self.stopped.discard(instance)
        full = worker_env(self.cfg, KTW_KAFKA__INSTANCE_ID=instance, **{**self.env, **env})
        proc = WorkerProcess(full, self.log_dir / f"{instance}-{self.starts[instance]}.log")
        self.procs[instance] = proc
        self.every.append(proc)
        return proc

    def kill9(self, instance: str) -> None:
        self.procs[instance].kill9()

    def terminate(self, instance: str, timeout: float = 90.0) -> int:
        proc = self.procs[instance]
        self.stopped.add(instance)
        proc.terminate()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.dump_stacks()
            tail = proc.log_tail()
            proc.kill9()
            raise AssertionError(f"{instance} did not exit within {timeout:.0f} s of SIGTERM; "
                                 f"its log ends (stacks at SIGUSR1):\n{tail}") from None
        self.exit_codes.append((instance, code))
        return code

    def assigned(self, instance: str) -> bool:
        return "partitions_assigned" in self.procs[instance].log_text()

    def wait_assigned(self, instance: str, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        proc = self.procs[instance]
        while time.monotonic() < deadline:
            if self.assigned(instance):
                return True
            if proc.proc.poll() is not None:
                raise AssertionError(f"{instance} exited {proc.proc.returncode}:\n"
                                     + proc.log_text()[-3000:])
            time.sleep(0.1)
        return False

    def alive(self) -> Iterator[str]:
        return (i for i, p in self.procs.items() if p.proc.poll() is None)

    def all_alive(self) -> bool:
        """Every instance not stopped on purpose is running (waits stop early if one died)."""
        return all(p.proc.poll() is None for i, p in self.procs.items() if i not in self.stopped)

    def own(self, *helpers: Any) -> None:
        """Threads (Feeder, TopicWatcher) halted on exit, so a failing run leaks nothing."""
        self._helpers.extend(helpers)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        for helper in self._helpers:
            helper.halt()
        for proc in self.every:
            if proc.proc.poll() is None:
                proc.kill9()


# --- scenarios (the suite runs them short, bench/faults/ long) ----------------------------------


def _audit_outputs(bootstrap: str, topics: Any, good: set[str], bad: set[str]
                   ) -> dict[str, Any]:
    results = read_all(bootstrap, topics.results, isolation="read_committed")
    dlq = read_all(bootstrap, topics.dlq, isolation="read_committed")
    raw = read_all(bootstrap, topics.results, isolation="read_uncommitted", idle_s=2.0)
    res_audit = Audit(good, key_counts(results))
    dlq_audit = Audit(bad, key_counts(dlq))
    return {
        "results": res_audit.summary(),
        "dlq": dlq_audit.summary(),
        # Records a read_uncommitted reader sees beyond the committed ones: outputs of aborted
        # transactions (exactly-once) -- evidence that kills interrupted open transactions.
        "aborted_result_records": len(raw) - len(results),
        "missing_sample": sorted(res_audit.missing | dlq_audit.missing)[:10],
        "duplicate_sample": sorted(k for k, n in (res_audit.counts + dlq_audit.counts).items()
                                   if n > 1)[:10],
    }


def run_kill9(bootstrap: str, log_dir: Path, *, mode: str, kills: int, seed: int = 1,
              instances: int = 3, partitions: int = 6, rate_per_s: float = 10.0,
              max_delay_s: float = 2.5, drain_timeout_s: float = 180.0, bad_every: int = 7,
              batch_delay_ms: int = 100, backlog: int = 500) -> dict[str, Any]:
    """Under a steady feed, kill -9 a worker ``kills`` times at a random point after it got its
    partitions, restarting it at once with the same instance id (static membership).

    Every ``bad_every``-th job is malformed and dead-lettered at once, while the good jobs
    before it wait up to ``batch_delay_ms`` in the batcher: outputs finish out of offset order
    all the time, which is what exactly-once must survive a kill in the middle of. A
    ``backlog`` produced up front keeps the workers busy (consumption runs ahead of inference,
    so dead-lettered records overtake the jobs before them)."""
    from worker.devkit.workers import committed, end_offsets, fresh_topics, worker_config

    rng = random.Random(seed)
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="k-",
                    bad_every=bad_every, burst=backlog)
    outputs = OutputWatch(bootstrap, topics)
    names = [f"w{i}" for i in range(instances)]
    delays: list[float] = []
    started = time.monotonic()
    with Fleet(cfg, log_dir, KTW_KAFKA__STATIC_MEMBERSHIP="true",
               KTW_BATCH__MAX_BATCH_SIZE="8", KTW_BATCH__MAX_DELAY_MS=str(batch_delay_ms)
               ) as fleet:
        fleet.own(feeder, outputs)
        for name in names:
            fleet.start(name)
        for name in names:
            assert fleet.wait_assigned(name, 90), f"{name} never got partitions"
        feeder.start()
        outputs.start()
        for k in range(kills):
            target = names[k % instances]
            assert fleet.wait_assigned(target, 90), f"{target} never got partitions back"
            delay = rng.uniform(0.1, max_delay_s)
            time.sleep(delay)
            delays.append(delay)
            fleet.kill9(target)
            fleet.start(target)
        kill_phase_s = time.monotonic() - started
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        drained = outputs.wait_for(good, bad, drain_timeout_s, fleet.all_alive)
        drain_s = time.monotonic() - started - kill_phase_s
        outputs.stop()
        codes = [fleet.terminate(name) for name in names]
    figures: dict[str, Any] = {
        "mode": mode, "kills": kills, "instances": instances, "partitions": partitions,
        "rate_per_s": rate_per_s, "seed": seed, "bad_every": bad_every,
        "batch_delay_ms": batch_delay_ms, "backlog": backlog, "jobs_good": len(good),
        "jobs_bad": len(bad),
        "kill_delay_s": {"min": round(min(delays), 2), "max": round(max(delays), 2)},
        "kill_phase_s": round(kill_phase_s, 1), "drain_s": round(drain_s, 1),
        "drained": drained, "final_exit_codes": codes,
    }
    figures.update(_audit_outputs(bootstrap, topics, good, bad))
    time.sleep(0.5)
    figures["offsets_committed_to_end"] = (
        committed(bootstrap, topics.group, topics.jobs, partitions)
        == end_offsets(bootstrap, topics.jobs, partitions))
    return figures


def log_events(text: str) -> collections.Counter[str]:
    """How often each structured event occurs in a worker's JSON log."""
    import json

    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out[json.loads(line).get("event", "?")] += 1
            except ValueError:
                continue
    return out


def stall_after(broker: Any, watcher: TopicWatcher, *, results: int, stall_s: float,
                timeout: float = 60.0, failed: Callable[[], object] = lambda: None
                ) -> tuple[float, float]:
    """Once ``results`` results are seen (steady processing), freeze the broker for ``stall_s``
    and resume it; returns when the pause began and ended (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while len(watcher.seen()) < results:
        assert time.monotonic() < deadline and not failed(), (
            failed() or "no steady processing before the stall")
        time.sleep(0.1)
    t_pause = time.monotonic()
    broker.pause()
    try:
        time.sleep(stall_s)
    finally:
        broker.resume()
    return t_pause, time.monotonic()


def run_broker_stall(broker: Any, log_dir: Path, *, mode: str, stall_s: float = 30.0,
                     rate_per_s: float = 10.0, partitions: int = 3, after_s: float = 10.0,
                     **env: str) -> dict[str, Any]:
    """Freeze the broker (SIGSTOP) for ``stall_s`` under a steady feed, then resume it.

    Recovery time: from resume() until a result is visible (read_committed) for a job produced
    after the stall began; such a job can only be answered once the worker consumed, processed,
    produced and (exactly-once) committed again after the resume.
    """
    from worker.devkit.workers import committed, end_offsets, fresh_topics, worker_config

    bootstrap = broker.bootstrap_servers
    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="st-", bad_every=20)
    outputs = OutputWatch(bootstrap, topics)
    watcher = outputs.results
    with Fleet(cfg, log_dir, **{"KTW_BATCH__MAX_BATCH_SIZE": "8", **env}) as fleet:
        fleet.own(feeder, outputs)
        proc = fleet.start("s0")
        assert fleet.wait_assigned("s0", 90), "worker never got partitions"
        feeder.start()
        outputs.start()
        t_feed = time.monotonic()
        t_pause, t_resume = stall_after(broker, watcher, results=30, stall_s=stall_s)
        recovery_s: float | None = None
        while time.monotonic() < t_resume + 60:
            fresh = [watcher.first_seen[k] for k in list(watcher.first_seen)
                     if feeder.sent_at.get(k, 0.0) >= t_pause]
            if fresh:
                recovery_s = min(fresh) - t_resume
                break
            time.sleep(0.05)
        time.sleep(max(0.0, t_resume + after_s - time.monotonic()))
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        backlog = {k for k in good if feeder.sent_at[k] < t_resume}
        t_drain = time.monotonic()
        drained = outputs.wait_for(good, bad, 150, fleet.all_alive)
        last_backlog = max(watcher.first_seen.get(k, float("inf")) for k in backlog)
        backlog_s = None if last_backlog == float("inf") else last_backlog - t_resume
        outputs.stop()
        survived = proc.proc.poll() is None
        tail = None
        if not drained:  # keep what the worker was doing for the failure message
            proc.dump_stacks()
            tail = proc.log_tail()
        t_stop = time.monotonic()
        code = fleet.terminate("s0")
        events = log_events(proc.log_text())
        phases = {"steady": t_pause - t_feed, "stall": t_resume - t_pause,
                  "feed_after": t_drain - t_resume, "drain_wait": t_stop - t_drain,
                  "terminate": time.monotonic() - t_stop}
    figures: dict[str, Any] = {
        "mode": mode, "stall_s": stall_s, "rate_per_s": rate_per_s, "partitions": partitions,
        "jobs_good": len(good), "jobs_bad": len(bad),
        "jobs_sent_during_stall": sum(1 for k in good if t_pause <= feeder.sent_at[k] < t_resume),
        "recovery_s": None if recovery_s is None else round(recovery_s, 2),
        "backlog_drained_s": None if backlog_s is None else round(backlog_s, 2),
        "drained": drained, "worker_survived": survived, "exit_code": code,
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "worker_events": {k: events[k] for k in ("partitions_lost", "partitions_revoked",
                                                 "transaction_abort", "rewound", "txn_retry",
                                                 "producer_reset", "commit_failed",
                                                 "consumer_error", "worker_failed")},
    }
    if tail is not None or code != 0:
        figures["worker_log_tail"] = tail or proc.log_tail()
        figures["exit_reason"] = exit_reason(proc.log_text())
    figures.update(_audit_outputs(bootstrap, topics, good, bad))
    time.sleep(0.5)
    figures["offsets_committed_to_end"] = (
        committed(bootstrap, topics.group, topics.jobs, partitions)
        == end_offsets(bootstrap, topics.jobs, partitions))
    return figures


# What a worker's log says when it stopped badly: its own failure events, a Python traceback's
# last line, or faulthandler's "Timeout" header (a drain that outlived shutdown_timeout_s).
_EXIT_CLUES = re.compile(r'"event": "(worker_failed|shutdown_failed|consumer_close_failed)"'
                         r'|^Timeout \(|^\w+(Error|Exception)\b')


def exit_reason(text: str) -> str:
    """One line saying why a worker exited non-zero, for the first line of a test's failure
    message (CI shows little more than that line)."""
    clues = [line for line in text.splitlines() if _EXIT_CLUES.search(line)]
    return clues[-1][:400] if clues else "no failure event in its log"


def stopped_totals(text: str) -> dict[str, Any]:
    """The counters of a worker's final ``worker_stopped`` line ({} if it never got there)."""
    import json

    for line in reversed(text.splitlines()):
        if line.startswith("{") and '"worker_stopped"' in line:
            return dict(json.loads(line))
    return {}


def run_scaling(bootstrap: str, log_dir: Path, *, mode: str, rate_per_s: float = 10.0,
                partitions: int = 6, phase_s: float = 15.0, backlog: int = 300
                ) -> dict[str, Any]:
    """1 -> 3 -> 1 workers (dynamic membership, cooperative-sticky) under a steady feed on top
    of a ``backlog`` (the lag an autoscaler reacts to); the two extra workers leave with
    SIGTERM (revoke, commit, leave group). Revocations land while jobs are queued and in
    flight."""
    from worker.devkit.workers import committed, end_offsets, fresh_topics, worker_config

    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode})
    feeder = Feeder(bootstrap, topics.jobs, rate_per_s=rate_per_s, prefix="sc-", bad_every=7,
                    burst=backlog)
    outputs = OutputWatch(bootstrap, topics)
    watcher = outputs.results
    marks: dict[str, float] = {}
    with Fleet(cfg, log_dir, KTW_BATCH__MAX_BATCH_SIZE="8") as fleet:
        fleet.own(feeder, outputs)
        t0 = time.monotonic()
        fleet.start("a0")
        assert fleet.wait_assigned("a0", 90)
        feeder.start()
        outputs.start()
        deadline = time.monotonic() + 60
        while len(watcher.seen()) < 30:
            assert time.monotonic() < deadline, "no processing with one worker"
            time.sleep(0.2)
        marks["scale_out"] = time.monotonic() - t0
        fleet.start("a1")
        fleet.start("a2")
        assert fleet.wait_assigned("a1", 90) and fleet.wait_assigned("a2", 90)
        time.sleep(phase_s)
        marks["scale_in"] = time.monotonic() - t0
        codes = {"a1": fleet.terminate("a1"), "a2": fleet.terminate("a2")}
        time.sleep(phase_s / 2)
        feeder.stop()
        good, bad = set(feeder.good), set(feeder.bad)
        drained = outputs.wait_for(good, bad, 120, fleet.all_alive)
        marks["drained"] = time.monotonic() - t0
        outputs.stop()
        codes["a0"] = fleet.terminate("a0")
        per_worker = {name: stopped_totals(p.log_text()) for name, p in fleet.procs.items()}
        revokes = {name: log_events(p.log_text())["partitions_revoked"]
                   for name, p in fleet.procs.items()}
    figures: dict[str, Any] = {
        "mode": mode, "rate_per_s": rate_per_s, "partitions": partitions, "phase_s": phase_s,
        "backlog": backlog, "jobs_good": len(good), "jobs_bad": len(bad), "drained": drained,
        "exit_codes": codes,
        "marks_s": {k: round(v, 1) for k, v in marks.items()},
        "results_per_worker": {n: t.get("results", 0) for n, t in per_worker.items()},
        "aborts_per_worker": {n: t.get("txn_aborts", 0) for n, t in per_worker.items()},
        "revokes_per_worker": revokes,
    }
    figures.update(_audit_outputs(bootstrap, topics, good, bad))
    time.sleep(0.5)
    figures["offsets_committed_to_end"] = (
        committed(bootstrap, topics.group, topics.jobs, partitions)
        == end_offsets(bootstrap, topics.jobs, partitions))
    return figures


def run_flood(bootstrap: str, log_dir: Path, *, mode: str, n_bad: int = 10_000,
              n_good: int = 300, partitions: int = 3, seed: int = 6) -> dict[str, Any]:
    """``n_bad`` malformed jobs (every corpus class) mixed with ``n_good`` good ones, produced
    up front, then one worker process drains them all."""
    from worker.devkit.workers import (
        committed,
        end_offsets,
        fresh_topics,
        produce_records,
        worker_config,
    )

    topics = fresh_topics(bootstrap, partitions)
    cfg = worker_config(bootstrap, topics, processing={"guarantee": mode}, limits=FLOOD_LIMITS)
    corpus = malformed_corpus(n_bad, seed)
    by_key = {b.key: b for b in corpus}
    good = [f"good-{i:05d}" for i in range(n_good)]
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = []
    every = max(1, len(corpus) // max(1, n_good))
    gi = 0
    for i, b in enumerate(corpus):
        if i % every == 0 and gi < n_good:
            records.append((good[gi].encode(), good_job(good[gi]), None))
            gi += 1
        records.append((b.key.encode(), b.value, [("origin", b"flood")]))
    records.extend((k.encode(), good_job(k), None) for k in good[gi:])
    produce_records(bootstrap, topics.jobs, records)
    env = {f"KTW_LIMITS__{k.upper()}": str(v) for k, v in FLOOD_LIMITS.items()}
    with Fleet(cfg, log_dir, KTW_BATCH__MAX_BATCH_SIZE="16", **env) as fleet:
        t0 = time.monotonic()
        proc = fleet.start("f0")
        outputs = OutputWatch(bootstrap, topics)
        fleet.own(outputs)
        outputs.start()
        drained = outputs.wait_for(set(good), set(by_key), 600, fleet.all_alive)
        elapsed = time.monotonic() - t0
        outputs.stop()
        survived = proc.proc.poll() is None
        code = fleet.terminate("f0")
        events = log_events(proc.log_text())
        error_lines = proc.log_text().count('"level": "error"')
    dlq = read_all(bootstrap, topics.dlq)
    results = read_all(bootstrap, topics.results)
    wrong_reason: collections.Counter[str] = collections.Counter()
    altered = 0
    for m in dlq:
        b = by_key.get(m.key().decode())
        if b is None:
            continue
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in (m.headers() or [])}
        if h.get("ktw.dlq.error.reason") != b.reason or not h.get("ktw.dlq.error.message"):
            wrong_reason[f"{b.klass}:{h.get('ktw.dlq.error.reason')}"] += 1
        if m.value() != b.value or h.get("origin") != "flood":
            altered += 1
    from worker.wire.moderation_codec import decode_result

    not_ok = sum(1 for m in results if decode_result(m.value())["status"] != "ok")
    figures: dict[str, Any] = {
        "mode": mode, "bad_jobs": len(corpus), "good_jobs": len(good),
        "classes": dict(collections.Counter(b.klass for b in corpus)),
        "drained": drained, "elapsed_s": round(elapsed, 1),
        "worker_survived": survived, "exit_code": code,
        "worker_error_lines": error_lines,
        "dead_lettered_logged": events["job_dead_lettered"],
        "dlq": Audit(set(by_key), key_counts(dlq)).summary(),
        "results": Audit(set(good), key_counts(results)).summary(),
        "dlq_wrong_reason": dict(wrong_reason), "dlq_altered": altered,
        "results_not_ok": not_ok,
    }
    time.sleep(0.5)
    figures["offsets_committed_to_end"] = (
        committed(bootstrap, topics.group, topics.jobs, partitions)
        == end_offsets(bootstrap, topics.jobs, partitions))
    return figures
