"""Records too large to dead-letter whole never stop the worker: they go to the DLQ by reference.

Three kinds of poison interleaved with good jobs, against a DLQ topic that takes at most
64 KiB per record (smaller than the jobs topic, as an operator may well configure it):

- a 150 KB corrupt image: dead-lettered whole, the broker refuses it as too large, and the
  worker sends it again by reference (before: the delivery failure stopped the worker, and
  every restart died on the same offset);
- a 1.2 MB record over ``limits.max_message_bytes``: over ``limits.dlq_inline_max_bytes``, so
  it is dead-lettered by reference at once (before: the producer refused the copy and the
  worker stopped);
- a small bad job carrying 1.5 MB of headers: the same (the headers are the large part).

Under exactly-once a refused DLQ record aborts its transaction (before: forever, with every
rewind); the rewind now redoes it by reference.
"""

from __future__ import annotations

import hashlib
import json
import random

import confluent_kafka as ck
import pytest

from tests.harness.workers import (
    ThreadedWorker,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    read_topic,
    worker_config,
)
from worker.bundled import samples_dir
from worker.devkit.local_kafka.admin import create_topics
from worker.tools.produce import encode_job

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_records_too_large_to_dead_letter_whole_go_by_reference(kafka_bootstrap: str,
                                                                 mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    # The topics are fresh: recreate them with the sizes of this scenario.
    admin = ck.admin.AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.delete_topics([topics.jobs, topics.dlq], operation_timeout=30).values():
        f.result()
    create_topics(kafka_bootstrap, [topics.jobs], partitions=2,
                  config={"max.message.bytes": str(4 << 20)})
    create_topics(kafka_bootstrap, [topics.dlq], partitions=1,
                  config={"max.message.bytes": str(64 << 10)})
    cfg = worker_config(kafka_bootstrap, topics, limits={"max_message_bytes": 300_000},
                        processing={"guarantee": mode})
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()

    poison = {
        # Random bytes: the DLQ's lz4 batch stays over 64 KiB (compression cannot hide it).
        "bad-corrupt-150k": (encode_job("bad-corrupt-150k",
                                        b"\x00" + random.Random(1).randbytes(150_000)), None,
                             "bad_image"),
        "bad-oversized-1m2": (b"\x00" * 1_200_000, None, "oversized"),
        "bad-fat-headers": (encode_job("bad-fat-headers", jpeg, policy="nope"),
                            [("fat", b"h" * 1_500_000)], "unknown_policy"),
    }
    good = [f"good-{i}" for i in range(8)]
    producer = ck.Producer({"bootstrap.servers": kafka_bootstrap,
                            "message.max.bytes": 4 << 20})
    sent: dict[str, bytes] = {}
    order = [*good[:3], *poison, *good[3:]]
    for i, key in enumerate(order):
        if key in poison:
            value, headers, _ = poison[key]
        else:
            value, headers = encode_job(key, jpeg), None
        sent[key] = value
        producer.produce(topics.jobs, key=key.encode(), value=value, headers=headers,
                         partition=i % 2)
    assert producer.flush(60) == 0

    with ThreadedWorker(cfg) as tw:
        # (Exactly-once: a refused DLQ record aborts its transaction once; the rewind redoes it
        # by reference. Readers here are read_uncommitted: they may see aborted results too.)
        dead = read_topic(kafka_bootstrap, topics.dlq,
                          until=lambda m: set(poison) <= set(keys_of(m)))
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: set(good) <= set(keys_of(m)))
        assert tw.thread.is_alive(), "a record too large for the DLQ must not stop the worker"

    assert sorted(set(keys_of(results))) == sorted(good)
    by_key = {m.key().decode(): m for m in dead}  # (each key once in the DLQ: see below)
    assert set(by_key) == set(poison)
    if mode == "exactly-once":
        assert sorted(keys_of(dead)) == sorted(poison), "no DLQ record twice"
    for key, (_, _, reason) in poison.items():
        msg = by_key[key]
        h = {k: (v or b"").decode() for k, v in msg.headers() or []}
        assert h["ktw.dlq.error.reason"] == reason
        assert h["ktw.dlq.value"] == "reference", key
        assert "fat" not in h, "the original headers are left out of a reference"
        ref = json.loads(msg.value())
        assert ref["topic"] == topics.jobs and ref["offset"] == int(h["ktw.dlq.source.offset"])
        assert ref["bytes"] == len(sent[key])
        assert ref["sha256"] == hashlib.sha256(sent[key]).hexdigest()
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)
