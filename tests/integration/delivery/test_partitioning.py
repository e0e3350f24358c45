"""Results go to the partition Java's default partitioner picks for their key (murmur2).

A Kafka Streams join of jobs and results, or any lookup of a job's result by key, needs the
worker's producer to partition as Java's does: ``toPositive(murmur2(key)) % partitions``.
librdkafka's default (CRC32) put 15 of 22 keys elsewhere.
"""

from __future__ import annotations

import pytest

from tests.harness.workers import (
    ThreadedWorker,
    fresh_topics,
    keys_of,
    produce_records,
    read_topic,
    worker_config,
)
from worker.bundled import samples_dir
from worker.devkit.local_kafka.admin import create_topics
from worker.tools.produce import encode_job

pytestmark = pytest.mark.integration

# Computed with org.apache.kafka.common.utils.Utils from kafka-clients 4.1.1:
# key -> (murmur2 as a Java int, Utils.toPositive(murmur2) % 6).
JAVA = {"21": (-973932308, 0), "job-1": (-1017057876, 2), "job-22": (-1076144282, 0),
        "abc": (479470107, 3), "k-0000042": (970334553, 3), "a": (-1563381124, 4)}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Utils.murmur2), as an unsigned 32-bit value."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    for i in range(0, len(data) - len(data) % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[len(data) - len(data) % 4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def java_partition(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def test_the_reference_murmur2_matches_java() -> None:
    for key, (signed, p6) in JAVA.items():
        assert murmur2(key.encode()) == signed & 0xFFFFFFFF, key
        assert java_partition(key, 6) == p6, key


def test_results_land_on_the_partition_javas_partitioner_picks(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    create_topics(kafka_bootstrap, [topics.results + "-6"], partitions=6)
    cfg = worker_config(kafka_bootstrap, topics)
    cfg = cfg.model_copy(update={"topics": cfg.topics.model_copy(
        update={"results": topics.results + "-6"})})
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()
    keys = [*JAVA, *(f"job-{i:04d}" for i in range(22))]
    produce_records(kafka_bootstrap, topics.jobs,
                    [(k.encode(), encode_job(k, jpeg), None) for k in keys])
    with ThreadedWorker(cfg):
        results = read_topic(kafka_bootstrap, topics.results + "-6",
                             until=lambda m: set(keys) <= set(keys_of(m)))
    placed = {m.key().decode(): m.partition() for m in results}
    assert placed == {k: java_partition(k, 6) for k in keys}
    assert len(set(placed.values())) > 1, "keys spread over several partitions"
