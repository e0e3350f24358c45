"""Helpers for integration tests against the real broker (no mocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck

from worker.config import WorkerConfig, load_config
from worker.devkit.local_kafka.admin import create_topics

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Topics:
    jobs: str
    results: str
    dlq: str
    group: str


def fresh_topics(bootstrap: str, partitions: int = 3) -> Topics:
    tag = uuid.uuid4().hex[:8]
    t = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    create_topics(bootstrap, [t.jobs], partitions=partitions)
    create_topics(bootstrap, [t.results, t.dlq], partitions=1)
    return t


def worker_config(bootstrap: str, topics: Topics, **overrides: Any) -> WorkerConfig:
    base: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": topics.group,
                  "session_timeout_ms": 6000},
        "topics": {"jobs": topics.jobs, "results": topics.results, "dlq": topics.dlq},
        # Below the harness's waits for a SIGTERM'd worker (60-90 s): a hang in shutdown
        # shows up as exit code 1 with the worker's stacks in its log.
        "commit": {"interval_ms": 200, "shutdown_timeout_s": 50},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return load_config(None, **base)


def worker_env(cfg: WorkerConfig, **extra: str) -> dict[str, str]:
    """Environment for a `trt-worker run` subprocess mirroring ``cfg``'s Kafka and topics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTW_")}
    env.update(
        {
            "KAFKA_BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
            "KTW_KAFKA__GROUP_ID": cfg.kafka.group_id,
            "KTW_KAFKA__SESSION_TIMEOUT_MS": str(cfg.kafka.session_timeout_ms),
            "KTW_TOPICS__JOBS": cfg.topics.jobs,
            "KTW_TOPICS__RESULTS": cfg.topics.results,
            "KTW_TOPICS__DLQ": cfg.topics.dlq,
            "KTW_COMMIT__INTERVAL_MS": str(cfg.commit.interval_ms),
            "KTW_COMMIT__SHUTDOWN_TIMEOUT_S": str(cfg.commit.shutdown_timeout_s),
            "KTW_PROCESSING__GUARANTEE": cfg.processing.guarantee,
            "KTW_KAFKA__TRANSACTION_TIMEOUT_MS": str(cfg.kafka.transaction_timeout_ms),
            # Several workers share the test machine: no metrics port unless a test asks.
            "KTW_METRICS__PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


class WorkerProcess:
    """`trt-worker run` as a child process, stderr (JSON logs) captured to a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "run"], env=env, cwd=REPO,
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self._log.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def dump_stacks(self) -> None:
        """Have a live worker print every thread's stack into its log (SIGUSR1)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)

    def log_tail(self, lines: int = 80, width: int = 400) -> str:
        """The end of the log for a failure message (per-job lines left out)."""
        kept = [line[:width] for line in self.log_text().splitlines()
                if '"job_dead_lettered"' not in line]
        return "\n".join(kept[-lines:])


def produce_records(bootstrap: str, topic: str,
            records: Iterable[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]],
            ) -> int:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "linger.ms": 5})
    failures: list[str] = []
    n = 0

    def cb(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=cb)
        producer.poll(0)
        n += 1
    assert producer.flush(60) == 0
    assert not failures, failures
    return n


def read_topic(bootstrap: str, topic: str, *, until: Callable[[list[ck.Message]], bool],
               timeout: float = 120.0) -> list[ck.Message]:
    """Read a topic from the beginning until ``until(messages)`` or the timeout."""
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.subscribe([topic])
    out: list[ck.Message] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(out):
            for msg in reader.consume(500, timeout=0.5):
                if msg.error() is None:
                    out.append(msg)
    finally:
        reader.close()
    return out


def keys_of(msgs: list[ck.Message]) -> list[str]:
    return [m.key().decode() for m in msgs if m.key() is not None]


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False})
    try:
        tps = c.committed([ck.TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4()}"})
    try:
        return {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
    finally:
        c.close()


class ThreadedWorker:
    """An in-process Worker on a thread; ``stop()`` drains it and re-raises its failure."""

    def __init__(self, cfg: WorkerConfig) -> None:
        import threading

        from worker.loop.build import build_worker

        self.worker = build_worker(cfg)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="worker", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised by stop() in the test thread
            self.error = exc

    def __enter__(self) -> ThreadedWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 60.0) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop within the drain timeout"
        if self.error is not None:
            raise self.error
