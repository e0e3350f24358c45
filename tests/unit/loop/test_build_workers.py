"""build_workers: one worker per task, and the GPU share handed to each task."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
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


def test_the_yielding_task_shares_first_so_the_others_know_what_it_left_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Moderation keeps to the SMs generation left free (processing.gpu_disjoint_sms) only
    once generation did leave them: its share_gpu must come first, whatever the task order."""
    order: list[str] = []
    seen: dict[str, tuple[int, bool]] = {}

    def fake_worker(cfg: WorkerConfig) -> SimpleNamespace:
        name = cfg.processing.task
        task = mock.create_autospec(BatchedTask, instance=True)

        def share_gpu(share: Any, *, yields: bool) -> None:
            order.append(name)
            seen[name] = (share.left_free, share.disjoint)
            if yields:
                share.left_free = share.free_sms

        task.share_gpu.side_effect = share_gpu
        return SimpleNamespace(task=task)

    monkeypatch.setattr(build, "build_worker", fake_worker)
    cfg = load_config(kafka={"bootstrap_servers": "localhost:9092"},
                      processing={"task": "moderation,generation", "gpu_disjoint_sms": True})
    build.build_workers(cfg)
    assert order == ["generation", "moderation"]
    assert seen["moderation"] == (16, True)


def test_one_task_gets_no_share(monkeypatch: pytest.MonkeyPatch) -> None:
    task = mock.create_autospec(BatchedTask, instance=True)
    monkeypatch.setattr(build, "build_worker", lambda cfg: SimpleNamespace(task=task))
    build.build_workers(load_config(kafka={"bootstrap_servers": "localhost:9092"},
                                    processing={"task": "generation"}))
    task.share_gpu.assert_not_called()
