"""Helpers for the replay tests against the real broker (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from tests.harness.workers import REPO
from worker.bundled import samples_dir
from worker.config import WorkerConfig, load_config
from worker.devkit.local_kafka.admin import create_topics
from worker.tools.produce import encode_job

BASE_TS = 1_700_000_000_000  # 2023-11-14T22:13:20Z: explicit, far from "now"
KEEP_FOREVER = {"retention.ms": "-1"}


@dataclass(frozen=True)
class ReplayTopics:
    jobs: str
    replay: str
    old: str
    dlq: str


def replay_topics(bootstrap: str, partitions: int = 2) -> ReplayTopics:
    tag = uuid.uuid4().hex[:8]
    t = ReplayTopics(f"rjobs-{tag}", f"replay-{tag}", f"old-{tag}", f"rdlq-{tag}")
    # The jobs carry timestamps from 2023 (BASE_TS): under the broker's 7-day default
    # retention its next check would delete them, so this topic keeps records forever.
    create_topics(bootstrap, [t.jobs], partitions=partitions, config=KEEP_FOREVER)
    create_topics(bootstrap, [t.replay, t.old, t.dlq], partitions=2)
    return t


def replay_config(bootstrap: str, **overrides: Any) -> WorkerConfig:
    base: dict[str, Any] = {"kafka": {"bootstrap_servers": bootstrap},
                            "batch": {"max_batch_size": 8}}
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return load_config(None, **base)


def samples() -> list[tuple[str, bytes]]:
    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    return [(p.stem, p.read_bytes()) for p in files]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1e3, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Produced:
    """One job record as the broker stored it."""

    id: str
    partition: int
    offset: int
    timestamp: int
    image: str  # sample stem


def produce_jobs(bootstrap: str, topic: str, per_partition: int, partitions: int = 2, *,
                 prefix: str = "job", step_ms: int = 1000) -> list[Produced]:
    """``per_partition`` jobs into each partition, record i of every partition stamped
    ``BASE_TS + i * step_ms``; returns what the broker acknowledged (partition, offset)."""
    images = samples()
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "linger.ms": 5})
    out: list[Produced] = []
    failures: list[str] = []

    def on_delivery(job: tuple[str, int, str], err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            out.append(Produced(job[0], msg.partition(), msg.offset(), job[1], job[2]))

    for i in range(per_partition):
        for p in range(partitions):
            stem, data = images[(i * partitions + p) % len(images)]
            job_id = f"{prefix}-p{p}-{i:04d}-{stem}"
            ts = BASE_TS + i * step_ms
            producer.produce(topic, key=job_id.encode(), value=encode_job(job_id, data),
                             partition=p, timestamp=ts,
                             on_delivery=lambda e, m, j=(job_id, ts, stem): on_delivery(j, e, m))
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures
    return sorted(out, key=lambda r: (r.partition, r.offset))


def read_all(bootstrap: str, topic: str) -> list[ck.Message]:
    """Every record of ``topic`` up to its current end (exact: stops at the end offsets)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}",
                     "enable.auto.commit": False})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)
                for p in meta.partitions}
        todo = {p: hi for p, (lo, hi) in ends.items() if hi > lo}
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in todo])
        out: list[ck.Message] = []
        for _ in range(600):
            if not todo:
                break
            for m in c.consume(500, timeout=0.1):
                if m.error() is None:
                    out.append(m)
                    if m.offset() + 1 >= todo.get(m.partition(), 0):
                        todo.pop(m.partition(), None)
        assert not todo, f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def sources(msgs: list[ck.Message]) -> list[tuple[int, int]]:
    """(source partition, source offset) named by each replay result's headers."""
    out = []
    for m in msgs:
        h = dict(m.headers() or [])
        out.append((int(h["ktw.source.partition"]), int(h["ktw.source.offset"])))
    return out


def replay_cli(args: list[str], bootstrap: str, log: Path) -> subprocess.Popen[bytes]:
    """`trt-worker replay ARGS` as a child process; output to ``log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTW_")}
    env.update({"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PYTHONUNBUFFERED": "1",
                "KTW_LOG__LEVEL": "WARNING", "KTW_BATCH__MAX_BATCH_SIZE": "4"})
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "worker", "replay", *args], env=env,
                                cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def shared_runner() -> Iterator[Any]:
    """One activated open_nsfw runner for the in-process replays (loading it costs ~1 s)."""
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner

    runner, _plan = make_runner(load_config(None))
    runner.activate()
    try:
        yield runner
    finally:
        runner.deactivate()
