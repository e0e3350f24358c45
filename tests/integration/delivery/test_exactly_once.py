"""Exactly-once mode on the real broker: aborts mid-stream, fencing, downstream visibility.

- Aborted transactions (forced at random moments through ``Committer.request_abort``, the fault
  drill) rewind to the last committed positions: a read_committed reader still sees exactly one
  result per job and one DLQ record per bad job, while a read_uncommitted reader sees the
  aborted copies too (so the aborts did throw produced outputs away).
- A second process started with the same instance id fences the first: the first's next
  transactional call fails fatally and it exits non-zero (for the orchestrator to restart),
  without breaking exactly-once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from tests.harness.faults import (
    Audit,
    Fleet,
    TopicWatcher,
    good_job,
    key_counts,
    read_all,
)
from tests.harness.workers import (
    ThreadedWorker,
    committed,
    end_offsets,
    fresh_topics,
    produce_records,
    worker_config,
)

pytestmark = pytest.mark.integration


def _jobs(n: int, bad_every: int, prefix: str) -> tuple[list[str], list[str], list[
        tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]]]:
    good, bad, records = [], [], []
    for i in range(n):
        if i % bad_every == bad_every - 1:
            key = f"{prefix}bad-{i:05d}"
            bad.append(key)
            records.append((key.encode(), b"\xc1 not msgpack", None))
        else:
            key = f"{prefix}job-{i:05d}"
            good.append(key)
            records.append((key.encode(), good_job(key), None))
    return good, bad, records


@pytest.mark.timeout(300)
def test_aborts_mid_stream_rewind_and_every_job_is_answered_exactly_once(
    kafka_bootstrap: str,
) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": "exactly-once"},
                        kafka={"instance_id": "drill"}, batch={"max_batch_size": 8})
    good, bad, records = _jobs(600, bad_every=15, prefix="x-")
    produce_records(kafka_bootstrap, topics.jobs, records)
    rng = random.Random(6)
    stop = threading.Event()
    with TopicWatcher(kafka_bootstrap, topics.results) as watcher, ThreadedWorker(cfg) as tw:
        def drill() -> None:
            while not stop.wait(rng.uniform(0.3, 1.2)):
                tw.worker.committer.request_abort("fault drill")

        driller = threading.Thread(target=drill, daemon=True)
        driller.start()
        try:
            # Keep aborting until half the jobs are committed, then let it finish.
            assert watcher.wait_for(set(good[: len(good) // 2]), 180)
        finally:
            stop.set()
            driller.join(5)
        assert watcher.wait_for(set(good), 180)
        totals = tw.worker.guarantee_totals()
    results = Audit(set(good), key_counts(read_all(kafka_bootstrap, topics.results)))
    dlq = Audit(set(bad), key_counts(read_all(kafka_bootstrap, topics.dlq)))
    raw = read_all(kafka_bootstrap, topics.results, isolation="read_uncommitted", idle_s=2)
    print("\ndrills", json.dumps({"totals": totals, "results": results.summary(),
                                "dlq": dlq.summary(), "uncommitted_records": len(raw)}))
    assert totals["txn_aborts"] >= 3 and totals["rewinds"] == totals["txn_aborts"], totals
    assert results.summary() == {"expected": len(good), "answered": len(good), "missing": 0,
                                 "duplicates": 0, "unexpected": 0}
    assert dlq.summary() == {"expected": len(bad), "answered": len(bad), "missing": 0,
                             "duplicates": 0, "unexpected": 0}
    assert len(raw) > len(good), "aborted transactions had produced records"
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 3) == end_offsets(
        kafka_bootstrap, topics.jobs, 3)


@pytest.mark.timeout(300)
def test_a_second_instance_with_the_same_id_fences_the_first_which_exits_non_zero(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": "exactly-once"})
    good, bad, records = _jobs(900, bad_every=30, prefix="f-")
    watcher = TopicWatcher(kafka_bootstrap, topics.results)
    with Fleet(cfg, tmp_path, KTW_BATCH__MAX_BATCH_SIZE="8") as fleet:
        fleet.own(watcher)
        first = fleet.start("same")
        assert fleet.wait_assigned("same", 90)
        produce_records(kafka_bootstrap, topics.jobs, records)
        watcher.start()
        deadline = time.monotonic() + 90
        while len(watcher.seen()) < 50:
            assert time.monotonic() < deadline, first.log_text()[-2000:]
            time.sleep(0.1)
        second = fleet.start("same")  # same instance id -> same transactional.id
        code = first.proc.wait(90)
        # Non-zero for the orchestrator, and 2: the CLI's code for a worker error (a crash
        # with a traceback would be 1).
        assert code == 2, first.log_text()[-3000:]
        assert watcher.wait_for(set(good), 240), second.log_text()[-3000:]
        watcher.stop()
        second.terminate()
        assert second.wait(60) == 0
    failed = [json.loads(line) for line in first.log_text().splitlines()
              if line.startswith("{") and '"worker_failed"' in line]
    assert failed and failed[0]["fenced"] is True, first.log_text()[-3000:]
    results = Audit(set(good), key_counts(read_all(kafka_bootstrap, topics.results)))
    dlq = Audit(set(bad), key_counts(read_all(kafka_bootstrap, topics.dlq)))
    print("\nfencing", json.dumps({"first_exit": code, "results": results.summary(),
                                 "dlq": dlq.summary()}))
    assert results.missing == set() and results.duplicates == 0
    assert dlq.missing == set() and dlq.duplicates == 0
