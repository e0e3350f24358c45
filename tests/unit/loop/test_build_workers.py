"""build_workers: one worker per task, and the GPU share handed to each task."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from worker.config import WorkerConfig, load_config
from worker.loop import build
from worker.tasks.batched import BatchedTask


@pytest.mark.parametrize(("settings", "wait_s", "free"),
                         [({}, 0.0, 16),
                          ({"gpu_yield_ms": 5, "gpu_free_sms": 0}, 0.005, 0)])
def test_both_tasks_get_one_share_with_the_processing_settings(
        monkeypatch: pytest.MonkeyPatch, settings: dict[str, float], wait_s: float,
        free: int) -> None:
    built: dict[str, mock.Mock] = {}

    def fake_worker(cfg: WorkerConfig) -> SimpleNamespace:
        task = mock.create_autospec(BatchedTask, instance=True)
        built[cfg.processing.task] = task
        return SimpleNamespace(task=task)

    monkeypatch.setattr(build, "build_worker", fake_worker)
    cfg = load_config(kafka={"bootstrap_servers": "localhost:9092"},
                      processing={"task": "moderation,generation", **settings})
    assert sorted(build.build_workers(cfg)) == ["generation", "moderation"]
    (share_m,), kw_m = built["moderation"].share_gpu.call_args
    (share_g,), kw_g = built["generation"].share_gpu.call_args
    assert share_m is share_g, "one share for the process"
    assert (share_g.max_wait_s, share_g.free_sms) == (wait_s, free)
    assert kw_m == {"yields": False} and kw_g == {"yields": True}


def test_one_task_gets_no_share(monkeypatch: pytest.MonkeyPatch) -> None:
    task = mock.create_autospec(BatchedTask, instance=True)
    monkeypatch.setattr(build, "build_worker", lambda cfg: SimpleNamespace(task=task))
    build.build_workers(load_config(kafka={"bootstrap_servers": "localhost:9092"},
                                    processing={"task": "generation"}))
    task.share_gpu.assert_not_called()
