"""A real `trt-worker run` process on a real broker, watched through its HTTP port.

- /metrics: the counters match what was sent, lag falls to zero (under exactly-once too), hop
  and batch histograms fill;
- a W3C traceparent on a job reaches its result and its DLQ record; results carry CloudEvents
  headers, DLQ records Kafka Connect's dead-letter headers;
- /readyz turns off while the broker is frozen past the session timeout and back on after;
  /healthz stays on throughout (the loop keeps stepping).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.faults import good_job
from tests.harness.workers import (
    WorkerProcess,
    fresh_topics,
    produce_records,
    read_topic,
    worker_config,
    worker_env,
)
from tests.integration.observe.http_support import get, until
from worker.devkit.local_kafka import LocalKafka
from worker.devkit.local_kafka.config import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., tuple[WorkerProcess, str]]]:
    procs: list[WorkerProcess] = []

    def start(bootstrap: str, **cfg_overrides: object) -> tuple[WorkerProcess, str]:
        topics = fresh_topics(bootstrap, partitions=2)
        cfg = worker_config(bootstrap, topics, **cfg_overrides)  # type: ignore[arg-type]
        port = free_port()
        env = worker_env(cfg, KTW_METRICS__PORT=str(port), KTW_METRICS__HOST="127.0.0.1",
                         KTW_METRICS__STATISTICS_INTERVAL_MS="500",
                         KTW_BATCH__MAX_BATCH_SIZE="4")
        proc = WorkerProcess(env, tmp_path / f"w{len(procs)}.log")
        procs.append(proc)
        start.topics = topics  # type: ignore[attr-defined]
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.terminate()
            assert p.wait(60) == 0, p.log_tail()


def test_metrics_count_what_was_sent_and_lag_falls_to_zero(
        kafka_bootstrap: str, spawn: Callable[..., tuple[WorkerProcess, str]]) -> None:
    proc, base = spawn(kafka_bootstrap)
    topics = spawn.topics  # type: ignore[attr-defined]
    until(lambda: get(base + "/readyz")[0] == 200, 90, "worker ready")
    good = [(f"job-{i}".encode(), good_job(f"job-{i}"), [("traceparent", TRACEPARENT)])
            for i in range(12)]
    bad = [(f"bad-{i}".encode(), b"\xc1 not msgpack", [("traceparent", TRACEPARENT)])
           for i in range(3)]
    produce_records(kafka_bootstrap, topics.jobs, good + bad)
    results = read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 12)
    dlq = read_topic(kafka_bootstrap, topics.dlq, until=lambda m: len(m) >= 3)
    assert len(results) == 12 and len(dlq) == 3, proc.log_tail()
    for msg in results + dlq:
        assert ("traceparent", TRACEPARENT) in (msg.headers() or []), msg.headers()
    # CloudEvents binary mode on results (ce_id names the job's record: a repeat after a crash
    # carries the same id); Kafka Connect's dead-letter names on DLQ records.
    for msg in results:
        h = dict(msg.headers() or [])
        assert h["ce_specversion"] == b"1.0" and h["content-type"] == b"application/msgpack"
        assert h["ce_subject"] == msg.key() and h["ce_type"].endswith(b".moderation.result")
        assert h["ce_id"].startswith(f"{topics.jobs}-".encode())
    assert len({dict(m.headers())["ce_id"] for m in results}) == len(results)
    for msg in dlq:
        h = dict(msg.headers() or [])
        assert h["__connect.errors.topic"] == topics.jobs.encode()
        assert h["__connect.errors.exception.class.name"] == b"MalformedPayload"
        assert h["__connect.errors.offset"] == h["ktw.dlq.source.offset"]

    def settled() -> bool:
        m = _samples(get(base + "/metrics")[1])
        lags = [v for k, v in m.items() if k.startswith("trt_worker_consumer_lag_records{")]
        return (m.get(f'trt_worker_records_consumed_total{{topic="{topics.jobs}"}}') == 15
                and len(lags) == 2 and not any(lags))

    until(settled, 30, "consumed 15 and lag 0 on both partitions")
    m = _samples(get(base + "/metrics")[1])
    assert m["trt_worker_results_total"] == 12
    assert m['trt_worker_dead_lettered_total{reason="not_msgpack"}'] == 3
    assert m['trt_worker_hop_seconds_count{hop="delivery"}'] == 15
    assert m['trt_worker_hop_seconds_count{hop="engine"}'] == 12
    batches = sum(v for k, v in m.items() if k.startswith("trt_worker_batch_size_count"))
    jobs = sum(v for k, v in m.items() if k.startswith("trt_worker_batch_size_sum"))
    assert batches >= 3 and jobs == 12  # batches of at most 4
    assert m['trt_worker_rebalances_total{event="assigned"}'] >= 1
    assert m["trt_worker_ready"] == 1 and m["trt_worker_pending_records"] == 0


def test_lag_falls_to_zero_and_delivery_hop_counts_under_exactly_once(
        kafka_bootstrap: str, spawn: Callable[..., tuple[WorkerProcess, str]]) -> None:
    # Exactly-once commits offsets inside transactions, which the consumer's statistics never
    # see: the lag came from the committed offset fetched at assignment, so it was absent for
    # a group that had never committed and grew with every record answered after that.
    proc, base = spawn(kafka_bootstrap, processing={"guarantee": "exactly-once"})
    topics = spawn.topics  # type: ignore[attr-defined]
    until(lambda: get(base + "/readyz")[0] == 200, 90, "worker ready")
    lags: dict[str, float] = {}

    def settled() -> bool:
        m = _samples(get(base + "/metrics")[1])
        lags.clear()
        lags.update({k: v for k, v in m.items()
                     if k.startswith("trt_worker_consumer_lag_records{")})
        return len(lags) == 2 and not any(lags.values())

    for wave in range(2):  # the second wave starts from a position committed by the first
        jobs = [(f"job-{wave}-{i}".encode(), good_job(f"job-{wave}-{i}"), [])
                for i in range(8)]
        produce_records(kafka_bootstrap, topics.jobs, jobs)
        # (librdkafka reads read_committed by default: only committed results count)
        want = 8 * (wave + 1)
        read_topic(kafka_bootstrap, topics.results, until=lambda m, n=want: len(m) >= n)
        try:
            until(settled, 30, f"lag 0 on both partitions after wave {wave}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {lags}\n{proc.log_tail()}") from None
    # The delivery hop under exactly-once ends at the transaction's commit: one sample per
    # answered record (before, it had none at all and the dashboard's panel stayed empty).
    m = _samples(get(base + "/metrics")[1])
    assert m['trt_worker_hop_seconds_count{hop="delivery"}'] == 16
    assert m['trt_worker_hop_seconds_sum{hop="delivery"}'] > 0


def test_readiness_goes_off_during_a_broker_stall_and_back_on(
        local_kafka: LocalKafka, spawn: Callable[..., tuple[WorkerProcess, str]]) -> None:
    proc, base = spawn(local_kafka.bootstrap_servers)
    until(lambda: get(base + "/readyz")[0] == 200, 90, "worker ready")
    until(lambda: "partitions_assigned" in proc.log_text(), 30, "partitions assigned")
    local_kafka.pause()
    try:
        # The session times out after 6 s (worker_config): the assignment is lost.
        off = until(lambda: get(base + "/readyz")[0] == 503, 30, "readiness off in the stall")
        _, reasons = get(base + "/readyz")
        assert "partitions lost" in reasons, reasons
        assert get(base + "/healthz")[0] == 200  # the loop keeps stepping
    finally:
        local_kafka.resume()
    back = until(lambda: get(base + "/readyz")[0] == 200, 60, "readiness back after resume")
    assert get(base + "/healthz")[0] == 200
    print(f"\nreadiness off {off:.1f} s into the stall, back {back:.1f} s after the resume")
    assert proc.proc.poll() is None
