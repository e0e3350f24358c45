"""A record that kills the process, under a restarting supervisor, against the real broker.

The test hook ``KTW_TEST_KILL_ON_KEY`` (read by worker/loop/worker.py, set only here) makes
the worker SIGKILL itself, as a cgroup OOM kill would, whenever it takes the job with that key.
A supervisor restarts ``trt-worker run`` after every non-zero exit, as an orchestrator does.
Before the crash-loop breaker nothing was committed, every restart took the same record and
died again, for ever (the supervisor gives up after MAX_RESTARTS). With it, the record is
dead-lettered by reference with reason ``poison`` after ``processing.poison_max_attempts``
deaths, counted in the offset commits' metadata, and every other job is answered.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.harness.faults.corpus import good_job
from tests.harness.faults.watch import OutputWatch, read_all
from tests.harness.workers import (
    WorkerProcess,
    fresh_topics,
    produce_records,
    worker_config,
    worker_env,
)
from worker.kafka.headers import read_headers

pytestmark = [pytest.mark.integration, pytest.mark.slow]
K = 3
MAX_RESTARTS = K + 3  # the supervisor's own bound: never reached with the breaker on
POISON = "poison-job"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_record_that_kills_the_process_is_dead_lettered_after_k_deaths(
        kafka_bootstrap: str, tmp_path: Path, mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    # Good jobs before and after the poison one: whichever partition the poison job lands
    # in (the key decides), the restarted worker redoes records in flight with it.
    jobs = [f"job-{i}" for i in range(8)] + [POISON] + [f"job-{i}" for i in range(8, 20)]
    good = {k for k in jobs if k != POISON}
    produce_records(kafka_bootstrap, topics.jobs, (
        (key.encode(), good_job(key), None) for key in jobs))
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    env = worker_env(cfg, KTW_TEST_KILL_ON_KEY=POISON,
                     KTW_PROCESSING__POISON_MAX_ATTEMPTS=str(K),
                     KTW_BATCH__MAX_BATCH_SIZE="4", KTW_BATCH__MAX_DELAY_MS="20")
    outputs = OutputWatch(kafka_bootstrap, topics)
    outputs.start()
    exits: list[int] = []
    proc = WorkerProcess(env, tmp_path / "w-0.log")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            code = proc.proc.poll()
            if code is not None:  # the supervisor: restart after a non-zero exit
                proc.wait(5)
                exits.append(code)
                assert code != 0, proc.log_tail()
                if len(exits) > MAX_RESTARTS:
                    break
                proc = WorkerProcess(env, tmp_path / f"w-{len(exits)}.log")
                continue
            if good <= outputs.results.seen() and POISON in outputs.dlq.seen():
                break
            time.sleep(0.2)
        answered = outputs.results.seen()
        dead = outputs.dlq.seen()
        assert len(exits) <= MAX_RESTARTS, f"crash loop: {exits}\n{proc.log_tail()}"
        assert POISON in dead and good <= answered, (
            f"exits {exits}, missing {sorted(good - answered)}\n{proc.log_tail()}")
        proc.terminate()
        assert proc.wait(90) == 0, proc.log_tail()
    finally:
        outputs.stop()
        if proc.proc.poll() is None:
            proc.kill9()
    print("\npoison", mode, json.dumps({"exits": exits}))
    # Killed by SIGKILL exactly K times: the K-th death's count made the next process
    # dead-letter the record instead of taking it.
    assert exits == [-9] * K, exits
    dlq = [m for m in read_all(kafka_bootstrap, topics.dlq) if m.key() == POISON.encode()]
    assert len(dlq) == 1, [m.key() for m in dlq]
    headers = dict(read_headers(dlq[0])[0] or [])
    assert headers["ktw.dlq.error.reason"] == b"poison", headers
    assert headers["ktw.dlq.value"] == b"reference", headers
    assert headers["ktw.dlq.error.class"] == b"PoisonRecord", headers
    assert f"{K} times".encode() in (headers["ktw.dlq.error.message"] or b""), headers
    ref = json.loads(dlq[0].value() or b"")
    assert ref["ref"] == "kafka" and ref["topic"] == topics.jobs, ref
    assert headers["ktw.dlq.source.offset"] == str(ref["offset"]).encode(), headers
    results = read_all(kafka_bootstrap, topics.results)
    keys = {key.decode() for m in results if isinstance(key := m.key(), bytes)}
    assert keys == good, sorted(keys ^ good)
