"""`trt-worker run` as a real process: SIGTERM drains and commits (SIGUSR1 dumps stacks on the
way); kill -9 loses no job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.harness.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    read_topic,
    worker_config,
    worker_env,
)
from worker.bundled import samples_dir
from worker.tools.produce import produce_folder

pytestmark = pytest.mark.integration


def _results_by_partition_offset(msgs: list) -> set[tuple[int, int]]:
    from worker.wire.moderation_codec import decode_result

    out = set()
    for m in msgs:
        src = decode_result(m.value())["source"]
        out.add((src["partition"], src["offset"]))
    return out


def test_sigterm_drains_commits_and_logs_json(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics)
    sent = produce_folder(cfg, samples_dir(), count=200, prefix="term-")
    env = worker_env(cfg, KTW_LOG__LEVEL="DEBUG", KTW_BATCH__MAX_BATCH_SIZE="4")
    proc = WorkerProcess(env, tmp_path / "worker.log")
    read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 20, timeout=90)
    # SIGUSR1 prints every thread's stack (the main loop's included) and the worker runs on.
    proc.dump_stacks()
    assert proc.proc.poll() is None, proc.log_text()[-3000:]
    assert "Current thread" in proc.log_text() and "worker/loop/worker.py" in proc.log_text()
    proc.terminate()
    assert proc.wait(60) == 0, proc.log_text()[-3000:]

    results = read_topic(kafka_bootstrap, topics.results, until=lambda m: False, timeout=3)
    answered = _results_by_partition_offset(results)
    commits = committed(kafka_bootstrap, topics.group, topics.jobs, 3)
    # Nothing committed past an unanswered job; something was committed on the way out.
    assert sum(max(o, 0) for o in commits.values()) >= 20
    for partition, offset in commits.items():
        assert all((partition, o) in answered for o in range(max(offset, 0)))

    lines = [json.loads(line) for line in proc.log_text().splitlines() if line.startswith("{")]
    events = {e["event"] for e in lines}
    assert {"worker_started", "worker_draining", "worker_stopped"} <= events
    job_lines = [e for e in lines if e["event"] == "job_result"]
    assert job_lines, "DEBUG level logs one line per result"
    for e in job_lines:
        assert e["job_id"].startswith("term-")
        assert e["topic"] == topics.jobs and e["partition"] in (0, 1, 2) and e["offset"] >= 0
    assert len(sent) == 200


def test_kill9_mid_stream_then_restart_answers_every_job(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics)
    sent = produce_folder(cfg, samples_dir(), count=400, prefix="crash-")
    want = {s.id for s in sent}
    env = worker_env(cfg, KTW_BATCH__MAX_BATCH_SIZE="8")

    first = WorkerProcess(env, tmp_path / "first.log")
    read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 40, timeout=90)
    first.kill9()
    answered_before = set(keys_of(read_topic(kafka_bootstrap, topics.results,
                                             until=lambda m: False, timeout=2)))
    assert 0 < len(answered_before) < len(want), "the kill must land mid-stream"

    second = WorkerProcess(env, tmp_path / "second.log")
    try:
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: want <= set(keys_of(m)), timeout=240)
    finally:
        second.terminate()
        assert second.wait(60) == 0, second.log_text()[-3000:]
    keys = keys_of(results)
    assert set(keys) == want, f"missing: {sorted(want - set(keys))[:10]}"
    duplicates = len(keys) - len(set(keys))
    print(f"kill -9: {len(answered_before)} answered before, {duplicates} duplicates after restart")
    time.sleep(0.5)
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 3) == end_offsets(
        kafka_bootstrap, topics.jobs, 3
    )


def test_a_drain_past_shutdown_timeout_dumps_stacks_and_exits_1(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A shutdown that outlasts ``commit.shutdown_timeout_s`` ends with every thread's stack on
    stderr and exit code 1, and commits nothing past an unanswered job (here the drain of a
    large backlog on the CPU is what takes too long; in production, a hang)."""
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics)
    produce_folder(cfg, samples_dir(), count=600, prefix="slow-")
    env = worker_env(cfg, KTW_BATCH__MAX_BATCH_SIZE="4", KTW_BATCH__HIGH_WATERMARK="1000",
                     KTW_BATCH__LOW_WATERMARK="500", KTW_COMMIT__DRAIN_TIMEOUT_S="0.5",
                     KTW_COMMIT__SHUTDOWN_TIMEOUT_S="1.0")
    proc = WorkerProcess(env, tmp_path / "worker.log")
    read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 8, timeout=90)
    started = time.monotonic()
    proc.terminate()
    code = proc.wait(60)
    took = time.monotonic() - started
    log = proc.log_text()
    assert code == 1, (code, log[-3000:])
    assert "Timeout (0:00:01)!" in log and "most recent call first" in log, log[-3000:]
    assert '"worker_stopped"' not in log, "the drain should not have finished in 1 s"
    assert took < 30, took

    results = read_topic(kafka_bootstrap, topics.results, until=lambda m: False, timeout=3)
    answered = _results_by_partition_offset(results)
    for partition, offset in committed(kafka_bootstrap, topics.group, topics.jobs, 3).items():
        assert all((partition, o) in answered for o in range(max(offset, 0)))


def test_a_consumer_fenced_by_its_instance_id_stops_the_worker(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Another member joins with this worker's ``group.instance.id`` (static membership): the
    worker's consumer is fenced, a fatal error librdkafka reports with the generic ``_FATAL``
    code. The worker must exit non-zero (to be restarted) rather than idle on a dead consumer;
    this happened after a 30 s broker stall, when the worker's own rejoin fenced it."""
    import confluent_kafka as ck

    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics)
    env = worker_env(cfg, KTW_KAFKA__STATIC_MEMBERSHIP="true", KTW_KAFKA__INSTANCE_ID="twin")
    proc = WorkerProcess(env, tmp_path / "worker.log")
    deadline = time.monotonic() + 90
    while '"partitions_assigned"' not in proc.log_text():
        assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log_text()[-3000:]
        time.sleep(0.2)
    twin = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topics.group,
                        "group.instance.id": "twin", "session.timeout.ms": 6000,
                        "partition.assignment.strategy": "cooperative-sticky"})
    try:
        twin.subscribe([topics.jobs])
        deadline = time.monotonic() + 60
        while proc.proc.poll() is None and time.monotonic() < deadline:
            twin.poll(0.2)
    finally:
        twin.close()
    if proc.proc.poll() is None:
        proc.dump_stacks()
        tail = proc.log_tail()
        proc.kill9()
        raise AssertionError(f"the fenced worker kept running:\n{tail}")
    code = proc.wait(5)
    log = proc.log_text()
    assert code not in (0, None), log[-3000:]
    failed = [json.loads(line) for line in log.splitlines()
              if line.startswith("{") and '"worker_failed"' in line]
    assert failed and "fatal consumer error" in failed[0]["error"], log[-3000:]
    assert "fenced" in failed[0]["error"].lower(), failed[0]
