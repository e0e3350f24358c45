"""A static member fenced by another process with the same ``group.instance.id`` stops (exit 2,
naming the member that holds the id once the session timeout has passed) instead of rejoining
and fencing it back; the newcomer answers everything. The other case, a fencing with no other
process (a group-coordinator failover), rejoins: unit-tested in
tests/unit/loop/group/test_membership.py and drilled on a 3-node cluster by
``python -m bench.faults.cluster --faults group_coordinator --modes exactly-once``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.faults import Fleet, TopicWatcher, good_job
from tests.harness.workers import fresh_topics, produce_records, worker_config

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_a_member_fenced_by_another_process_stops_and_the_newcomer_answers_everything(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(kafka_bootstrap, topics)
    keys = [f"sf-{i:04d}" for i in range(200)]
    watcher = TopicWatcher(kafka_bootstrap, topics.results)
    with Fleet(cfg, tmp_path, KTW_KAFKA__STATIC_MEMBERSHIP="true") as fleet:
        fleet.own(watcher)
        first = fleet.start("same")
        assert fleet.wait_assigned("same", 90), first.log_text()[-2000:]
        produce_records(kafka_bootstrap, topics.jobs, [(k.encode(), good_job(k), None)
                                                       for k in keys[:100]])
        watcher.start()
        assert watcher.wait_for(set(keys[:100]), 120), first.log_text()[-2000:]
        second = fleet.start("same")  # another process, the same group.instance.id
        code = first.proc.wait(120)
        produce_records(kafka_bootstrap, topics.jobs, [(k.encode(), good_job(k), None)
                                                       for k in keys[100:]])
        assert watcher.wait_for(set(keys), 120), second.log_text()[-3000:]
        alive = second.proc.poll() is None
        watcher.stop()
        second.terminate()
        assert second.wait(60) == 0
    failed = [json.loads(line) for line in first.log_text().splitlines()
              if line.startswith("{") and '"worker_failed"' in line]
    print("\nstatic fencing", json.dumps({"first_exit": code, "failed": failed[:1]}))
    assert code == 2, first.log_text()[-3000:]
    assert failed and "its group.instance.id is held by member" in failed[0]["error"], failed
    assert '"consumer_reopened"' not in first.log_text()  # it never fenced the newcomer back
    assert alive, "the newcomer was fenced back"
