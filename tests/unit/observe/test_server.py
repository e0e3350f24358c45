"""The HTTP endpoints over a stand-in worker: routes, status codes, metric names and values."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.integration.observe.http_support import get
from worker.config import load_config
from worker.loop.heap import HeapPolicy
from worker.loop.hops import HopTimes
from worker.loop.stats import Stats
from worker.observe import events
from worker.observe.collector import WorkerCollector
from worker.observe.health import Health
from worker.observe.server import ObserveServer
from worker.observe.vitals import Vitals


class _Committer:
    def pending(self) -> int:
        return 7

    def held_bytes(self) -> int:
        return 4096

    def uncommitted(self) -> dict[tuple[str, int], int]:
        return {("jobs", 0): 30, ("jobs", 1): 12}

    def totals(self) -> dict[str, int]:
        return {"txn_commits": 3, "txn_aborts": 1}

    def blocked(self) -> str | None:
        return "output topic results refuses records, retrying: Broker: Topic authorization"


@pytest.fixture
def served() -> Iterator[tuple[str, SimpleNamespace, Vitals]]:
    vitals = Vitals()
    stats = Stats(consumed=10, results=8, dead_lettered=2, expired=1)
    stats.dead_by_reason.update({"not_msgpack": 2})
    hops = HopTimes()
    hops.add("engine", 0.004)
    vitals.batch_done(0.004, 6, "b8", 8)
    vitals.lag = {("jobs", 0): 5}
    heap = HeapPolicy(load_config(None).gc)
    heap._on_gc("start", {"generation": 2})
    heap._on_gc("stop", {"generation": 2})
    topics = SimpleNamespace(jobs="jobs")
    w = SimpleNamespace(cfg=load_config(None), stats=stats, hops=hops, heap=heap, vitals=vitals,
                        committer=_Committer(), backpressure=SimpleNamespace(paused=True),
                        hold=SimpleNamespace(held={("jobs", 1): "uncommitted records"}),
                        task=SimpleNamespace(model_id="open_nsfw", engine_hash="abc123",
                                             topics=topics))
    health = Health(vitals, heartbeat_timeout_s=60, delivery_stall_s=15, fatal=lambda: None,
                    oldest_unacked_s=lambda: None)
    server = ObserveServer("127.0.0.1", 0, WorkerCollector(w, health), health).start()
    try:
        yield f"http://127.0.0.1:{server.port}", w, vitals
    finally:
        server.close()


def test_metrics_report_the_loops_counters(served: tuple[str, SimpleNamespace, Vitals]
                                           ) -> None:
    base, _, _ = served
    events.COUNTS["commit_failed"] += 0  # (the series exists once an event was counted)
    status, text = get(base + "/metrics")
    assert status == 200
    lines = set(text.splitlines())
    for line in ('trt_worker_records_consumed_total{topic="jobs"} 10.0',
                 "trt_worker_results_total 8.0",
                 'trt_worker_dead_lettered_total{reason="not_msgpack"} 2.0',
                 "trt_worker_expired_total 1.0",
                 "trt_worker_pending_records 7.0",
                 "trt_worker_held_bytes 4096.0",
                 "trt_worker_uncommitted_records 42.0",
                 "trt_worker_paused 1.0",
                 "trt_worker_held_partitions 1.0",
                 "trt_worker_outputs_blocked 1.0",
                 'trt_worker_transactions_total{outcome="committed"} 3.0',
                 'trt_worker_transactions_total{outcome="aborted"} 1.0',
                 'trt_worker_consumer_lag_records{partition="0",topic="jobs"} 5.0',
                 'trt_worker_hop_seconds_bucket{hop="engine",le="0.005"} 1.0',
                 'trt_worker_hop_seconds_count{hop="engine"} 1.0',
                 'trt_worker_batch_size_bucket{le="8.0",profile="b8"} 1.0',
                 'trt_worker_gc_pause_seconds_count{generation="2"} 1.0',
                 'trt_worker_batch_fill_ratio_bucket{le="0.7",profile="b8"} 0.0',
                 'trt_worker_batch_fill_ratio_bucket{le="0.8",profile="b8"} 1.0',
                 "trt_worker_ready 0.0"):
        assert line in lines, line
    info = [x for x in lines if x.startswith("trt_worker_info{")]
    assert len(info) == 1 and 'engine_hash="abc123"' in info[0] and 'backend="onnxruntime"' \
        in info[0] and 'guarantee="at-least-once"' in info[0]
    assert any(x.startswith("process_resident_memory_bytes") for x in lines)


def test_health_routes_answer_200_or_503_with_reasons(
        served: tuple[str, SimpleNamespace, Vitals]) -> None:
    base, _, vitals = served
    assert get(base + "/healthz") == (200, "ok\n")
    status, text = get(base + "/readyz")
    assert status == 503 and "engines not warm yet" in text
    vitals.warm = vitals.subscribed = True
    assert get(base + "/readyz") == (200, "ok\n")
    assert "trt_worker_ready 1.0" in get(base + "/metrics")[1]
    assert get(base + "/nope")[0] == 404


def test_a_port_in_use_is_a_config_error() -> None:
    from worker.exceptions import ConfigError

    vitals = Vitals()
    health = Health(vitals, heartbeat_timeout_s=1, delivery_stall_s=1, fatal=lambda: None,
                    oldest_unacked_s=lambda: None)
    first = ObserveServer("127.0.0.1", 0, _NoMetrics(), health)
    try:
        with pytest.raises(ConfigError, match=r"metrics\.port"):
            ObserveServer("127.0.0.1", first.port, _NoMetrics(), health)
    finally:
        first.close()


class _NoMetrics:
    def collect(self) -> Iterator[object]:
        return iter(())
