"""One HTTP port for a process serving several tasks: ready only while every loop is ready,
each reason naming its task; each loop's metrics labelled ``task``, the process's once."""

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
from worker.observe.collector import TasksCollector, WorkerCollector
from worker.observe.health import Health, TasksHealth
from worker.observe.server import ObserveServer
from worker.observe.vitals import Vitals
from worker.tasks.gpu_share import GpuShare


class _Committer:
    def __init__(self, pending: int) -> None:
        self._pending = pending

    def pending(self) -> int:
        return self._pending

    def held_bytes(self) -> int:
        return 0

    def uncommitted(self) -> dict[tuple[str, int], int]:
        return {}

    def totals(self) -> dict[str, int]:
        return {}

    def blocked(self) -> str | None:
        return None


def _worker(task: str, jobs: str, consumed: int) -> tuple[SimpleNamespace, Health]:
    vitals = Vitals()
    vitals.lag = {(jobs, 0): consumed // 2}
    vitals.batch_done(0.004, 2, "b2", 2)
    cfg = load_config(None, processing={"task": task})
    w = SimpleNamespace(cfg=cfg, stats=Stats(consumed=consumed), hops=HopTimes(),
                        heap=HeapPolicy(cfg.gc), vitals=vitals, committer=_Committer(consumed),
                        backpressure=SimpleNamespace(paused=False),
                        hold=SimpleNamespace(held={}),
                        task=SimpleNamespace(model_id=task, engine_hash="h",
                                             topics=SimpleNamespace(jobs=jobs)))
    return w, Health(vitals, heartbeat_timeout_s=60, delivery_stall_s=15, fatal=lambda: None,
                     oldest_unacked_s=lambda: None)


@pytest.fixture
def served() -> Iterator[tuple[str, dict[str, Vitals]]]:
    workers = {"moderation": _worker("moderation", "mod-jobs", 10),
               "generation": _worker("generation", "gen-jobs", 4)}
    health = TasksHealth({task: h for task, (_, h) in workers.items()})
    share = GpuShare(max_wait_s=0.001)
    share.claim()
    share.yield_turn()
    collector = TasksCollector({task: WorkerCollector(w, h) for task, (w, h) in workers.items()},
                               share)
    server = ObserveServer("127.0.0.1", 0, collector, health).start()
    try:
        yield (f"http://127.0.0.1:{server.port}",
               {task: w.vitals for task, (w, _) in workers.items()})
    finally:
        server.close()


def test_ready_only_when_every_loop_is_ready(served: tuple[str, dict[str, Vitals]]) -> None:
    base, vitals = served
    vitals["moderation"].warm = vitals["moderation"].subscribed = True
    status, text = get(base + "/readyz")
    assert status == 503
    assert text.splitlines() == ["generation: engines not warm yet",
                                 "generation: not subscribed yet"]
    vitals["generation"].warm = vitals["generation"].subscribed = True
    assert get(base + "/readyz") == (200, "ok\n")
    vitals["moderation"].stopping = True
    assert get(base + "/readyz") == (503, "moderation: stopping\n")
    assert get(base + "/healthz") == (200, "ok\n")


def test_each_loops_metrics_are_labelled_with_its_task(
        served: tuple[str, dict[str, Vitals]]) -> None:
    base, _ = served
    events.COUNTS["commit_failed"] += 0
    status, text = get(base + "/metrics")
    assert status == 200
    lines = set(text.splitlines())
    for line in (
            'trt_worker_records_consumed_total{task="moderation",topic="mod-jobs"} 10.0',
            'trt_worker_records_consumed_total{task="generation",topic="gen-jobs"} 4.0',
            'trt_worker_pending_records{task="moderation"} 10.0',
            'trt_worker_pending_records{task="generation"} 4.0',
            'trt_worker_consumer_lag_records{partition="0",task="moderation",topic="mod-jobs"} '
            '5.0',
            'trt_worker_consumer_lag_records{partition="0",task="generation",topic="gen-jobs"} '
            '2.0',
            'trt_worker_batch_size_count{profile="b2",task="generation"} 1.0',
            'trt_worker_ready{task="moderation"} 0.0'):
        assert line in lines, line
    info = [x for x in lines if x.startswith("trt_worker_info{")]
    assert len(info) == 2
    assert {task for task in ("moderation", "generation") for x in info
            if f'model_id="{task}",task="{task}"' in x} == {"moderation", "generation"}
    # Each family once (a repeated # HELP would be refused by Prometheus), the process's
    # families without a task label.
    helps = [x for x in text.splitlines() if x.startswith("# HELP ")]
    assert len(helps) == len(set(helps))
    assert 'trt_worker_errors_total{kind="commit_failed"} 0.0' in lines
    assert not any(x.startswith("trt_worker_gc_pause_seconds") and "task=" in x for x in lines)
    assert "trt_worker_gpu_yields_total 1.0" in lines
