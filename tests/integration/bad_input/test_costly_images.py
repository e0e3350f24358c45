"""Images that cost CPU and memory, not bytes (issue 36, finding 9), through a real broker.

The finding's three jobs beside five good ones: a progressive JPEG of 3,000 empty AC scans, a
PNG carrying 80 frames (fcTL/fdAT) without an acTL, an 8-frame 5000x4000 RGBA APNG. Before
the budgets the worker scored all three: 5.8 s, 8-13 s and 4.4 s of decoding, the last with
1.5 GB of memory. Each must now be answered within 2 s of reaching the broker (refused
``bad_image`` from its headers' counts and the decode budget) while the process's resident
memory grows by under 500 MB, and the good jobs are scored.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import confluent_kafka as ck
import pytest

from tests.harness.workers import (
    ThreadedWorker,
    Topics,
    keys_of,
    read_topic,
    worker_config,
)
from tests.unit.tasks.moderation.images.hostile_images import apng, many_scan_jpeg
from worker.bundled import samples_dir
from worker.devkit.local_kafka.admin import create_topics
from worker.tools.produce import encode_job
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration

BIG = 8 * 1024 * 1024  # the PNG job is ~3.7 MB: over the broker's default record size


class _PeakRss:
    """The process's resident memory, sampled every 5 ms on a thread (ru_maxrss would keep
    the high-water mark of whatever ran earlier in this process)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> int:
        """Bytes the peak grew by over the baseline."""
        self._stop.set()
        self._thread.join(5)
        return self.peak - self.base


def _produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> dict[str, int]:
    """Produce ``records`` (key, value); each key's broker timestamp (CreateTime, ms)."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "message.max.bytes": BIG, "linger.ms": 5})
    stamps: dict[str, int] = {}
    failures: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            stamps[msg.key().decode()] = msg.timestamp()[1]

    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures
    return stamps


def _answers(bootstrap: str, topics: Topics, keys: set[str], timeout: float
             ) -> dict[str, tuple[str, Any]]:
    """key -> ("dlq" | "result", message): the first answer to each of ``keys``, read from
    both topics until all are answered or ``timeout``."""
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.subscribe([topics.dlq, topics.results])
    found: dict[str, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not keys <= set(found):
            for m in reader.consume(100, timeout=0.5):
                key = m.key()
                if m.error() is None and key is not None and key.decode() in keys:
                    where = "dlq" if m.topic() == topics.dlq else "result"
                    found.setdefault(key.decode(), (where, m))
    finally:
        reader.close()
    return found


@pytest.mark.timeout(600)
def test_costly_images_are_refused_within_two_seconds_without_the_memory(
        kafka_bootstrap: str) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    sized = {"max.message.bytes": str(BIG)}
    create_topics(kafka_bootstrap, [topics.jobs], partitions=2, config=sized)
    create_topics(kafka_bootstrap, [topics.results, topics.dlq], partitions=1, config=sized)
    cfg = worker_config(kafka_bootstrap, topics)

    hostile = {
        "scans-3000": (many_scan_jpeg(6000, 6000, 3000), "scans"),
        "fctl-80-no-actl": (apng(4000, 3000, 80, actl=False), "80 frame controls"),
        "apng-8x5000x4000": (apng(5000, 4000, 8), "decode budget"),
    }
    assert sum(len(v) for v, _ in hostile.values()) < 5 * 1024 * 1024
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()
    good = [f"good-{i}" for i in range(5)]
    records = [(good[0], encode_job(good[0], jpeg))]
    for g, (key, (data, _)) in zip(good[1:], hostile.items(), strict=False):
        records += [(key, encode_job(key, data)), (g, encode_job(g, jpeg))]
    records += [(g, encode_job(g, jpeg)) for g in good[len(hostile) + 1:]]

    with ThreadedWorker(cfg) as tw:
        # Warm and assigned first: the 2 s are the jobs', not the worker's start.
        _produce(kafka_bootstrap, topics.jobs, [("warm", encode_job("warm", jpeg))])
        warm = read_topic(kafka_bootstrap, topics.results, timeout=180,
                          until=lambda m: "warm" in keys_of(m))
        assert "warm" in keys_of(warm), "the worker never answered its warm-up job"
        rss = _PeakRss()
        stamps = _produce(kafka_bootstrap, topics.jobs, records)
        answers = _answers(kafka_bootstrap, topics, set(hostile) | set(good), timeout=120)
        grown = rss.stop()
        assert tw.thread.is_alive(), "the worker must keep running"

    late, waited = {}, {}
    for key, (data, why) in hostile.items():
        assert key in answers, f"{key} ({len(data)} bytes) was never answered"
        where, msg = answers[key]
        waited[key] = msg.timestamp()[1] - stamps[key]
        if waited[key] >= 2000:
            late[key] = waited[key]
        assert where == "dlq", f"{key} was scored, not refused"
        h = {k: (v or b"").decode() for k, v in msg.headers() or []}
        assert h["ktw.dlq.error.reason"] == "bad_image", (key, h)
        message = h["ktw.dlq.error.message"]
        assert why in message and "\n" not in message, (key, message)
    print(f"\ncostly images: answered after (ms) {waited}, peak RSS grew {grown >> 20} MB")
    assert not late, f"answered 2 s or more after arrival (ms): {late}"
    assert grown < 500 * 1024 * 1024, f"peak RSS grew by {grown >> 20} MB"
    for key in good:
        where, msg = answers[key]
        assert where == "result" and decode_result(msg.value())["status"] == "ok", key
