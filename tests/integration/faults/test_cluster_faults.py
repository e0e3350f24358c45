"""A 3-node KRaft cluster (LocalKafkaCluster) and one cluster-level fault under load.

The helpers first: the cluster's replication defaults, and the node that coordinates a group or
a transactional id, checked against where the broker really writes their state (the partition
of ``__consumer_offsets`` / ``__transaction_state`` that grows). Then the drill: the node that
leads the results partition is killed with SIGKILL under a steady feed and restarted 5 s later,
while one exactly-once worker runs; every job must have exactly one result, in offset order per
jobs partition, each carrying its own job's source offset. The other faults (group coordinator,
transaction coordinator, a node cut off with SIGSTOP) and longer runs are
``python -m bench.faults.cluster``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest

from tests.harness.cluster_faults import run_cluster_fault, verdict
from worker.devkit.local_kafka import LocalKafkaCluster
from worker.devkit.local_kafka.cluster import (
    TRANSACTION_STATE_TOPIC,
    coordinator_partition,
    java_string_hash,
)

OFFSETS_TOPIC = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafkaCluster]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        pytest.skip("the cluster is a LocalKafkaCluster; KAFKA_BOOTSTRAP_SERVERS points at an "
                    "external broker (the suite then runs without a local JVM)")
    with LocalKafkaCluster(brokers=3) as c:
        yield c


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4()}"})
    try:
        return [c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)]
    finally:
        c.close()


def _partitions(cluster: LocalKafkaCluster, topic: str) -> int:
    admin = ck.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)


def test_java_string_hash_matches_java() -> None:
    # Values of java.lang.String.hashCode(); the last one is Integer.MIN_VALUE, whose
    # Utils.abs is 0 (Math.abs would leave it negative).
    assert java_string_hash("") == 0
    assert java_string_hash("abc") == 96354
    assert java_string_hash("é") == 233
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("abc", 50) == 96354 % 50


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cluster_replication_and_coordinators(cluster: LocalKafkaCluster) -> None:
    assert cluster.live_brokers() == {1, 2, 3}
    topic = f"rf-{uuid.uuid4().hex[:8]}"
    cluster.create_topics([topic], partitions=3)
    admin = ck.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    assert all(len(p.replicas) == 3 for p in meta.partitions.values()), meta.partitions
    res = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, topic)
    conf = admin.describe_configs([res])[res].result(timeout=30)
    assert conf["min.insync.replicas"].value == "2"

    # The transaction coordinator: init_transactions writes the id's state to its partition
    # of __transaction_state, and to no other.
    txid = f"txn-{uuid.uuid4().hex[:8]}"
    warm = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                        "transactional.id": f"warm-{txid}"})
    warm.init_transactions(60)  # creates __transaction_state (RF 3, min ISR 2)
    n = _partitions(cluster, TRANSACTION_STATE_TOPIC)
    before = _end_offsets(cluster.bootstrap_servers, TRANSACTION_STATE_TOPIC, n)
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                            "transactional.id": txid})
    producer.init_transactions(60)
    after = _end_offsets(cluster.bootstrap_servers, TRANSACTION_STATE_TOPIC, n)
    grew = [p for p in range(n) if after[p] > before[p]]
    assert grew == [coordinator_partition(txid, n)], (before, after)
    assert cluster.transaction_coordinator(txid) == cluster.leader(TRANSACTION_STATE_TOPIC,
                                                                   grew[0])

    # The group coordinator (DescribeGroups) leads the group's partition of __consumer_offsets.
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = ck.Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                            "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[ck.TopicPartition(topic, 0, 0)], asynchronous=False)
        coordinator = cluster.group_coordinator(group)
    finally:
        consumer.close()
    offsets_partitions = _partitions(cluster, OFFSETS_TOPIC)
    assert coordinator == cluster.leader(OFFSETS_TOPIC,
                                         coordinator_partition(group, offsets_partitions))
    assert cluster.under_replicated() == {}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_leader_killed_and_restarted_exactly_once(cluster: LocalKafkaCluster,
                                                          tmp_path: Path) -> None:
    f = run_cluster_fault(cluster, tmp_path, fault="leader", mode="exactly-once", down_s=5.0,
                          after_s=5.0, steady_results=20)
    print("\ncluster leader kill", json.dumps(f, sort_keys=True))
    assert verdict(f) == [], f
    assert "results leader" in f["target_roles"], f
    # Placed away from the coordinators: this drill is about the partition leader alone.
    assert not any("coordinator" in role for role in f["target_roles"]), f
    assert f["results"]["answered"] == f["jobs_good"] > 0, f
    # The kill did land while outputs were in flight: some jobs were fed while it was down.
    assert f["jobs_sent_while_down"] > 0, f
    assert all(v is not None for v in f["recovery_by_partition_s"].values()), f
