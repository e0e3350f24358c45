"""nvJPEG warms up in a thread after the task's warm-up: until it is ready the pipeline's rows are
decoded on the CPU, with the same verdicts; a decoder that cannot start leaves the CPU decoding
instead of stopping the worker. (Before: the first nvJPEG batch ran inside warm_up, 0.66-0.69 s
of a cached start on the H200.)"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tests.unit.tasks.moderation.parts_support import run_batch


def _task(monkeypatch: pytest.MonkeyPatch, gate: threading.Event | None = None,
          fail: bool = False) -> tuple[Any, Any, Any]:
    from worker.config import load_config
    from worker.tasks.moderation.images import jpeg_ops
    from worker.tasks.moderation.models.open_nsfw import gpu_preprocess as gpu
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner
    from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel

    real_prepare, real_decode = gpu.prepare_batch, jpeg_ops.decode_jpegs
    calls = {"gpu": 0, "warm": 0}
    warming = "gpu-decoder-warm-up"

    def decode(*args: Any, **kw: Any) -> Any:
        # Where nvJPEG's own errors come from (prepare_batch would hide them behind its CPU
        # fallback, so the failure is injected here).
        if threading.current_thread().name == warming:
            calls["warm"] += 1
            if gate is not None:
                assert gate.wait(120)
            if fail:
                raise RuntimeError("Failed to initialize nvjpeg with default backend")
        return real_decode(*args, **kw)

    def prepare(*args: Any, **kw: Any) -> Any:
        if threading.current_thread().name != warming:
            calls["gpu"] += 1
        return real_prepare(*args, **kw)

    monkeypatch.setattr(jpeg_ops, "decode_jpegs", decode)
    monkeypatch.setattr(gpu, "prepare_batch", prepare)
    cfg = load_config(model={"backend": "torch", "preprocess": "gpu", "jpeg_roundtrip": False},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    task = OpenNsfwGpuModel(cfg, runner, plan.spec, plan.profiles)
    task.warm_up(plan.profiles)
    return task, plan, calls


def _batch(plan: Any, n: int = 8) -> Any:
    from tests.harness.conformance_inputs import synthetic_images
    from tests.unit.tasks.moderation.parts_support import image_batch

    images: list[bytes | None] = [*synthetic_images(n - 1, 5, fmt="JPEG"), b"no image"]
    return image_batch(plan.profiles[0], images, n)


def _nsfw(outcomes: list[Any]) -> np.ndarray:
    return np.array([o.scores["nsfw"] for o in outcomes[:-1]])


def test_batches_before_the_decoder_is_warm_are_decoded_on_the_cpu_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    task, plan, calls = _task(monkeypatch, gate)
    try:
        # Warm enough to serve (warm_up returned) but not at full speed yet: ready() says so.
        assert not task.wait_for_gpu_decoder(0.5) and not task.ready()
        batch = _batch(plan)
        early = run_batch(task, batch)
        assert calls == {"gpu": 0, "warm": 1}
        gate.set()
        assert task.wait_for_gpu_decoder(120) and task.ready()
        late = run_batch(task, batch)
        assert calls["gpu"] == 1
    finally:
        gate.set()
        task.close()
        task.runner.deactivate()
    assert early[-1].rejection is not None and late[-1].rejection is not None
    diff = np.abs(_nsfw(early) - _nsfw(late)).max()
    print(f"cpu-decoded (decoder warming) vs nvJPEG: max |diff| {diff:.2e}")
    assert diff < 3e-2  # nvJPEG's IDCT vs libjpeg's, fp16 engine


def test_a_decoder_that_cannot_start_leaves_the_cpu_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task, plan, calls = _task(monkeypatch, fail=True)
    try:
        assert not task.wait_for_gpu_decoder(120)
        assert task.ready()  # as fast as it will get: the CPU decodes from now on
        outcomes = run_batch(task, _batch(plan))
    finally:
        task.close()
        task.runner.deactivate()
    assert calls == {"gpu": 0, "warm": 1}
    assert all(o.scores is not None for o in outcomes[:-1])
    assert outcomes[-1].rejection is not None
