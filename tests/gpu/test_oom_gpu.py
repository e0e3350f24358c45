"""GPU preprocessing that runs out of memory prepares that batch on the CPU instead: every job
is answered, with the CPU path's scores (before: the batch raised and the worker stopped)."""

from __future__ import annotations

import numpy as np
import pytest


def test_out_of_memory_in_gpu_preprocessing_falls_back_to_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from tests.harness.conformance_inputs import synthetic_images
    from tests.unit.tasks.moderation.parts_support import image_batch, run_batch
    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw import gpu_preprocess as gpu
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner
    from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel

    cfg = load_config(model={"backend": "torch", "preprocess": "gpu", "jpeg_roundtrip": False},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    task = OpenNsfwGpuModel(cfg, runner, plan.spec, plan.profiles)
    task.warm_up(plan.profiles)
    assert task.wait_for_gpu_decoder(120)  # the path under test decodes on the GPU
    images = synthetic_images(7, 8, fmt="JPEG")
    batch = image_batch(plan.profiles[0], list(images), 8)
    healthy = run_batch(task, batch)

    def out_of_memory(*_args: object, **_kw: object) -> object:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(gpu, "prepare_batch", out_of_memory)
    fallen_back = run_batch(task, batch)
    task.close()
    runner.deactivate()
    assert all(o.scores is not None for o in fallen_back) and len(fallen_back) == len(images)
    a = np.array([o.scores["nsfw"] for o in healthy if o.scores])
    b = np.array([o.scores["nsfw"] for o in fallen_back if o.scores])
    print(f"gpu vs cpu-fallback preprocessing: max |diff| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() < 3e-2  # nvJPEG's IDCT vs libjpeg's, fp16 engine
