"""The generation task as the registry builds it (``generation_task``): its batcher weighs
each job by its images, so one-image jobs share a batch up to ``generation.max_images_per_batch``
while jobs of many images never exceed it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from worker.config import load_config
from worker.tasks.generation.factory import generation_task
from worker.tasks.generation.task import GenerationTask
from worker.wire.records import SourceRef

pytest.importorskip("torch", reason="the generation task's engines need the gen extra (torch)")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GenerationTask]:
    # One task for the module: each test drains the batcher it fills.
    tmp_path = tmp_path_factory.mktemp("gen-factory")
    cfg = load_config(None, generation={"random_weights": "tiny", "device": "cpu",
                                        "blob": {"local_dir": str(tmp_path / "blobs")}},
                      engines={"cache_dir": str(tmp_path / "engines")})
    t = generation_task(cfg)
    yield t
    t.close()


def _queue(task: GenerationTask, images: list[int]) -> None:
    for i, n in enumerate(images):
        doc: dict[str, Any] = {"v": 1, "id": f"j{i}", "prompt": "a red car", "width": 512,
                               "height": 512, "steps": 2, "seed": i, "num_images": n}
        task.batcher.add(task.pending(msgpack.packb(doc), SourceRef("generation.jobs", 0, i)))


def _batches(task: GenerationTask) -> list[list[int]]:
    out = task.batcher.schedule(now=1e12, now_ms=0, limit=8, force=True)
    return [[p.job.num_images for p in b.items] for b in out.batches]


def test_one_image_jobs_share_a_batch_up_to_the_image_budget(task: GenerationTask) -> None:
    # The defaults: 16 images a batch, up to 8 a job. Sized for the worst case, a batch
    # would hold two jobs whatever they asked for.
    _queue(task, [1] * 20)
    assert _batches(task) == [[1] * 16, [1] * 4]


def test_jobs_of_many_images_never_exceed_the_budget(task: GenerationTask) -> None:
    _queue(task, [8, 4, 8, 2, 1, 1])
    assert _batches(task) == [[8, 4], [8, 2, 1, 1]]
