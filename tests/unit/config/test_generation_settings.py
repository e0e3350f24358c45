"""Generation batch sizing: jobs per batch are capped by ``batch.max_batch_size`` and by the
image budget's count of one-image jobs; the batcher weighs each job by its images
(tests/unit/tasks/generation/test_gen_factory.py)."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.exceptions import ConfigError
from worker.tasks.generation.setup import jobs_per_batch


@pytest.mark.parametrize(("per_job", "per_batch", "max_batch", "expected"), [
    (8, 16, 16, 16),   # the defaults: up to 16 jobs, as many as their images allow
    (1, 16, 16, 16),
    (1, 16, 4, 4),     # batch.max_batch_size caps it
    (8, 8, 16, 8),     # the image budget's count of one-image jobs caps it
])
def test_jobs_per_batch_is_capped_by_the_batch_size_and_the_image_budget(
        per_job: int, per_batch: int, max_batch: int, expected: int) -> None:
    cfg = load_config(None, batch={"max_batch_size": max_batch},
                      generation={"random_weights": "tiny", "max_images_per_job": per_job,
                                  "max_images_per_batch": per_batch})
    assert jobs_per_batch(cfg) == expected


def test_a_job_larger_than_a_batch_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="max_images_per_job must not exceed"):
        load_config(None, generation={"max_images_per_job": 16, "max_images_per_batch": 8})


class _Runner:
    def __init__(self) -> None:
        self.warmed = 0

    def warm_up(self) -> None:
        self.warmed += 1


class _Engines:
    def __init__(self) -> None:
        self.active = False
        self.runners = {"text_encoder": _Runner(), "unet": _Runner(), "vae": _Runner()}
        self.model_id = "fake"

    def activate(self) -> None:
        self.active = True


@pytest.mark.parametrize(("mode", "device", "captures"), [
    ("all_shapes", "cpu", 1), ("first_use", "cuda:0", 0),
    ("auto", "cuda:0", 1), ("auto", "cpu", 0),  # auto: every shape on a GPU only
])
def test_warm_up_mode_decides_whether_every_shape_runs_at_start(mode: str, device: str,
                                                                captures: int) -> None:
    from pathlib import Path

    from worker.config.generation import GenerationSettings
    from worker.tasks.generation.blobs import LocalBlobStore
    from worker.tasks.generation.task import GenerationTask

    engines = _Engines()
    task = GenerationTask(GenerationSettings(random_weights="tiny", warm_up=mode,  # type: ignore[arg-type]
                                             device=device),
                          engines, LocalBlobStore(Path("/nonexistent")), own_engines=False)  # type: ignore[arg-type]
    try:
        task.warm_up()
    finally:
        task.close()
    assert engines.active
    assert [r.warmed for r in engines.runners.values()] == [captures] * 3
