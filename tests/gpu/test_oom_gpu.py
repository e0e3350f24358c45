"""GPU preprocessing that runs out of memory prepares that batch on the CPU instead: every job
is answered, with the CPU path's scores (before: the batch raised and the worker stopped)."""

from __future__ import annotations

import numpy as np
import pytest


def test_out_of_memory_in_gpu_preprocessing_falls_back_to_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from worker.config import load_config
    from worker.devkit.conformance_inputs import synthetic_images
    from worker.tasks.batcher import Batch
    from worker.tasks.moderation.engine_setup.open_nsfw import make_runner
    from worker.tasks.moderation.images import gpu
    from worker.tasks.moderation.open_nsfw import Pending
    from worker.tasks.moderation.open_nsfw_gpu import OpenNsfwGpuTask
    from worker.wire.moderation_jobs import ModerationJob, Status
    from worker.wire.records import SourceRecord, SourceRef

    cfg = load_config(model={"backend": "torch", "preprocess": "gpu", "jpeg_roundtrip": False},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    task = OpenNsfwGpuTask(cfg, runner, plan.spec, plan.profiles)  # type: ignore[arg-type]
    task.warm_up(plan.profiles)
    assert task.wait_for_gpu_decoder(120)  # the path under test decodes on the GPU
    images = synthetic_images(7, 8, fmt="JPEG")
    items = [Pending(SourceRef("t", 0, i), ModerationJob(f"j{i}", img), 0.0,
                     SourceRecord("t", 0, i, None, None, None, None))
             for i, img in enumerate(images)]
    batch = Batch(plan.profiles[0], items, 8)
    healthy = task._run(batch)

    def out_of_memory(*_args: object, **_kw: object) -> object:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(gpu, "prepare_batch", out_of_memory)
    fallen_back = task._run(batch)
    task.close()
    runner.deactivate()
    assert [o.result.status for o in fallen_back if o.result] == [Status.OK] * len(items)
    a = np.array([o.result.scores["nsfw"] for o in healthy if o.result])
    b = np.array([o.result.scores["nsfw"] for o in fallen_back if o.result])
    print(f"gpu vs cpu-fallback preprocessing: max |diff| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() < 3e-2  # nvJPEG's IDCT vs libjpeg's, fp16 engine
