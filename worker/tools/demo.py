"""`trt-worker demo`: everything on one machine, end to end, then a table of verdicts.

Starts a local Kafka unless brokers are configured, creates the topics, produces the bundled
sample images (and one corrupt job, to show the dead-letter path), runs the worker in a thread
until every job is answered, prints verdicts and timings, and stops everything.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from rich.console import Console
from rich.table import Table

from worker.bundled import samples_dir
from worker.config import WorkerConfig
from worker.kafka import Consumer
from worker.kafka.admin import Admin
from worker.kafka.clients import reader_settings
from worker.kafka.headers import read_headers
from worker.loop.build import build_worker
from worker.tools.produce import encode_job, produce_folder
from worker.tools.replay.headers import as_dict
from worker.wire.moderation_codec import decode_result


@contextlib.contextmanager
def local_brokers(cfg: WorkerConfig, console: Console,
                  topics: dict[str, int] | None = None) -> Iterator[WorkerConfig]:
    """``cfg`` as it is when it names brokers; else a local Kafka started for the demo (stopped
    after it) with ``topics`` (name -> partitions; the moderation topics by default) created,
    and ``cfg`` pointed at it."""
    if cfg.kafka.bootstrap_servers:
        yield cfg
        return
    from worker.devkit.local_kafka import LocalKafka

    console.print("[bold]starting a local Kafka[/] (KRaft, single node; first run fetches jars)")
    broker = LocalKafka()
    started = time.monotonic()
    bootstrap = broker.start()
    console.print(f"Kafka up at {bootstrap} in {time.monotonic() - started:.1f} s")
    try:
        if topics is None:
            t = cfg.topics
            topics = {t.jobs: 3, t.results: 1, t.dlq: 1}
        for name, partitions in topics.items():
            broker.create_topics([name], partitions=partitions)
        yield cfg.model_copy(
            update={"kafka": cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap})}
        )
    finally:
        broker.stop()


def _collect(cfg: WorkerConfig, topic: str, want: set[str], deadline: float,
             into: dict[str, Any]) -> None:
    # Every partition from its beginning, outside any group: nothing is committed.
    start = [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
             for p in Admin(cfg).partitions(topic)]
    reader = Consumer(reader_settings(cfg, f"demo-reader-{uuid.uuid4().hex[:8]}"))
    reader.open()
    try:
        reader.assign(start)
        while not want <= into.keys() and time.monotonic() < deadline:
            for msg in reader.consume(100, timeout=0.5):
                key = msg.key()
                if msg.error() is None and key is not None:
                    into[key.decode()] = msg
    finally:
        reader.close()


def run_demo(cfg: WorkerConfig, *, images: Path | None, timeout_s: float) -> bool:
    console = Console()
    with local_brokers(cfg, console) as cfg:
        sent = produce_folder(cfg, images or samples_dir(), prefix="demo-")
        bad_id = "demo-corrupt-jpeg"
        _produce_raw(cfg, bad_id, encode_job(bad_id, b"\xff\xd8\xff\xe0 truncated jpeg"))
        console.print(f"produced {len(sent)} image jobs and 1 corrupt job to {cfg.topics.jobs}")

        worker = build_worker(cfg)
        thread = threading.Thread(target=worker.run, name="worker", daemon=True)
        started = time.monotonic()
        thread.start()
        deadline = started + timeout_s
        results: dict[str, Any] = {}
        dead: dict[str, Any] = {}
        _collect(cfg, cfg.topics.results, {s.id for s in sent}, deadline, results)
        _collect(cfg, cfg.topics.dlq, {bad_id}, deadline, dead)
        elapsed = time.monotonic() - started
        worker.stop()
        thread.join(timeout=60)

        table = Table(title=f"open_nsfw verdicts, timings in ms ({worker.task.engine_hash})")
        for col in ("image", "status", "verdict", "nsfw", "queue", "decode", "infer", "total"):
            table.add_column(col, justify="left" if col in ("image", "status", "verdict")
                             else "right")
        for s in sent:
            msg = results.get(s.id)
            if msg is None:
                table.add_row(s.path.name, "[red]missing[/]", "", "", "", "", "", "")
                continue
            r = decode_result(msg.value())
            t = r.get("timings_ms", {})
            table.add_row(s.path.name, r["status"], r.get("verdict", ""),
                          f"{r['scores'].get('nsfw', float('nan')):.4f}",
                          *(f"{t.get(k, 0.0):.1f}" for k in ("queue", "decode", "infer", "total")))
        console.print(table)
        for key, msg in dead.items():
            hdrs = {k: v.decode("utf-8", "replace")
                    for k, v in as_dict(read_headers(msg)[0]).items()}
            console.print(f"DLQ: {key}: {hdrs.get('ktw.dlq.error.reason')}: "
                          f"{hdrs.get('ktw.dlq.error.message')}")
        answered = sum(1 for s in sent if s.id in results)
        console.print(f"{answered}/{len(sent)} answered, {len(dead)}/1 dead-lettered, "
                      f"in {elapsed:.1f} s")
        return answered == len(sent) and bad_id in dead


def _produce_raw(cfg: WorkerConfig, key: str, value: bytes) -> None:
    from worker.kafka import Producer, producer_settings

    producer = Producer(producer_settings(cfg))
    producer.open()
    producer.produce(cfg.topics.jobs, key=key.encode(), value=value)
    producer.close(30.0)
