"""The three-stream pipeline: equals the serial path, reuses its buffers, does not grow."""

from __future__ import annotations

import os
import resource
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from engines.models.open_nsfw import open_nsfw_spec
from engines.profiles import StaticProfile

ITEM = (224, 224, 3)


def _pipeline(overlap: bool, sizes: tuple[int, ...] = (8, 32), slots: int = 3):  # type: ignore[no-untyped-def]
    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner

    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("gpu", ITEM, sizes),))
    pipe = TorchPipeline(runner, sizes, slots=slots, pixels=True, overlap=overlap)
    pipe.activate()
    return runner, pipe


def _run(pipe, batches: list[np.ndarray], depth: int) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Keep ``depth`` batches in flight; poison every output buffer before it is used."""
    out: list[np.ndarray | None] = [None] * len(batches)
    inflight: deque = deque()
    for i, x in enumerate(batches):
        slot = pipe.acquire(len(x))
        slot.host_out.array[...] = np.nan  # poison: a skipped copy cannot pass for a result
        slot.host_in.array[: len(x)] = x
        inflight.append((i, pipe.launch(slot, len(x))))
        while len(inflight) >= depth:
            j, h = inflight.popleft()
            out[j] = h.result()
    while inflight:
        j, h = inflight.popleft()
        out[j] = h.result()
    return [o for o in out if o is not None]


def test_overlapped_equals_serial_on_random_inputs() -> None:
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 256, size=(n, *ITEM), dtype=np.uint8)
               for n in [32, 8, 32, 5, 32, 8, 17, 32] * 5]
    runner, serial = _pipeline(overlap=False)
    expected = _run(serial, batches, depth=1)
    serial.deactivate()
    _, overlapped = _pipeline(overlap=True)
    got = _run(overlapped, batches, depth=3)
    overlapped.deactivate()
    runner.deactivate()
    assert len(got) == len(expected) == len(batches)
    for g, e, x in zip(got, expected, batches, strict=True):
        assert g.shape == (len(x), 2) and np.isfinite(g).all()
        # Same captured kernels on the same inputs: identical, element by element.
        np.testing.assert_array_equal(g, e)
    # Different inputs gave different outputs (the check is not vacuous).
    assert len({float(e[0, 1]) for e in expected}) > len(batches) // 2


def test_no_host_or_device_memory_growth_over_10000_batches() -> None:
    import torch

    from engines.cudart import check, runtime

    rng = np.random.default_rng(5)
    pool = [rng.integers(0, 256, size=(8, *ITEM), dtype=np.uint8) for _ in range(16)]
    runner, pipe = _pipeline(overlap=True, sizes=(8,), slots=3)
    _run(pipe, pool * 20, depth=3)  # warm
    torch.cuda.synchronize()
    free_before = check(runtime().cudaMemGetInfo())[0]
    alloc_before = torch.cuda.memory_allocated()
    rss_before = _rss_kb()
    last = None
    for i in range(10_000):
        slot = pipe.acquire(8)
        slot.host_in.array[:] = pool[i % len(pool)]
        h = pipe.launch(slot, 8)
        if last is not None:
            assert np.isfinite(last.result()).all()
        last = h
    last.result()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == alloc_before
    assert check(runtime().cudaMemGetInfo())[0] == free_before
    grown = _rss_kb() - rss_before
    print(f"10,000 batches: RSS {grown} kB growth, device free memory unchanged")
    assert grown < 8 * 1024
    pipe.deactivate()
    runner.deactivate()


def _rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize(("backend", "preprocess"),
                         [("torch", "cpu"), ("torch", "gpu"), ("aoti", "gpu")])
def test_gpu_task_scores_match_the_cpu_reference(backend: str, preprocess: str,
                                                 tmp_path: Path) -> None:
    """The GPU model on the eager network and on AOTInductor packages (compiled here without
    max-autotune, for the default batch sizes: the pipeline captures them under its graphs)."""
    from engines.backends.onnxruntime import OrtRunner
    from tests.harness.conformance_inputs import synthetic_images
    from tests.unit.tasks.moderation.parts_support import image_batch, run_batch
    from worker.config import load_config
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.engine import engine_plan, make_runner
    from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    cfg = load_config(model={"backend": backend, "preprocess": preprocess,
                             "jpeg_roundtrip": False},
                      engines={"use_cache": backend == "aoti", "cache_dir": tmp_path,
                               "autotune": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    task = OpenNsfwGpuModel(cfg, runner, plan.spec, plan.profiles)
    task.warm_up(plan.profiles)
    # Until nvJPEG has warmed up the CPU decodes: wait, so the GPU path is what is tested.
    assert task.wait_for_gpu_decoder(120) == (preprocess == "gpu")
    images: list[bytes] = [*synthetic_images(21, 24, fmt="JPEG"), b"not an image"]
    outcomes = run_batch(task, image_batch(plan.profiles[0], list(images), 32))
    task.close()
    runner.deactivate()
    ref_x = np.stack([preprocess_open_nsfw(decode_image(b), jpeg_roundtrip=False)
                      for b in images[:-1]])
    with OrtRunner(engine_plan(load_config()).spec) as ort_runner:
        ref = ort_runner.infer({"input:0": ref_x}).result()["outputs"]
    assert outcomes[-1].rejection is not None
    got = np.array([[o.scores["sfw"], o.scores["nsfw"]]  # type: ignore[index]
                    for o in outcomes[:-1]])
    diff = np.abs(got - ref)
    print(f"{preprocess} preprocessing: max |diff| {diff.max():.2e}, mean {diff.mean():.2e}")
    # fp16 engine (<=1e-2, see the conformance test) plus, on the gpu path, nvJPEG's IDCT.
    assert diff.max() < 3e-2 and diff.mean() < 5e-3


def test_activation_does_not_break_a_capture_in_another_thread() -> None:
    """Two tasks in one process: one engine's graphs are captured (generation's, lazily) while
    another activates (moderation's pipeline, which captures too). Entering torch.cuda.graph
    synchronises the whole device, which CUDA refuses during the other thread's capture and
    which invalidates it (what a two-task run hit on an H100): captures take turns."""
    import threading

    import torch

    from engines.backends.torch.graphs import capture

    net = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(64)]).cuda().eval()
    x = torch.randn(64, 512, device="cuda")
    errors: list[BaseException] = []
    captures = 0
    done = threading.Event()

    def capture_loop() -> None:
        nonlocal captures
        try:
            while not done.is_set():
                graph, _ = capture(net, [x], warmup=0 if captures else 1)
                graph.replay()
                torch.cuda.current_stream().synchronize()
                captures += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=capture_loop)
    t.start()
    try:
        for _ in range(5):
            _, pipe = _pipeline(overlap=True, sizes=(8, 32), slots=3)
            pipe.deactivate()
    finally:
        done.set()
        t.join(60)
    assert not errors, errors
    assert captures > 0


def test_an_urgent_pipeline_runs_on_the_devices_highest_priority_streams() -> None:
    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner
    from engines.cudart import check, greatest_stream_priority, runtime

    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("gpu", ITEM, (8,)),))
    urgent = TorchPipeline(runner, (8,), slots=1, pixels=True, urgent=True)
    urgent.activate()
    plain = TorchPipeline(runner, (8,), slots=1, pixels=True)
    plain.activate()
    try:
        greatest = greatest_stream_priority()
        assert greatest < 0  # the device has priorities at all (every GPU since Kepler)
        for stream in (urgent.h2d, urgent.compute, urgent.d2h):
            assert check(runtime().cudaStreamGetPriority(stream.handle)) == greatest
        assert check(runtime().cudaStreamGetPriority(plain.compute.handle)) == 0
        x = np.random.default_rng(1).integers(0, 256, size=(8, *ITEM), dtype=np.uint8)
        np.testing.assert_array_equal(_run(urgent, [x], depth=1)[0],
                                      _run(plain, [x], depth=1)[0])
    finally:
        urgent.deactivate()
        plain.deactivate()
        runner.deactivate()


def test_a_pipeline_on_the_free_sms_runs_there_and_equals_one_on_every_sm() -> None:
    """on_free_sms: its streams are in the green context of the SMs a partition leaving them
    makes (disjoint from it), and its graphs, captured there, give the same outputs."""
    from cuda.bindings import driver as cu

    from engines import gpu_partition
    from engines.backends.torch.pipeline import TorchPipeline
    from engines.backends.torch.runner import TorchRunner

    rng = np.random.default_rng(11)
    batches = [rng.integers(0, 256, size=(n, *ITEM), dtype=np.uint8) for n in [8, 5, 8, 3] * 3]
    runner, whole = _pipeline(overlap=True, sizes=(8,))
    expected = _run(whole, batches, depth=3)
    whole.deactivate()
    runner.deactivate()
    total, _ = gpu_partition.device_sms(0)
    runner = TorchRunner(open_nsfw_spec(), profiles=(StaticProfile("gpu", ITEM, (8,)),))
    assert runner.use_free_sms(16)
    pipe = TorchPipeline(runner, (8,), slots=3, pixels=True, urgent=True)
    pipe.on_free_sms = 16
    pipe.activate()
    try:
        left = gpu_partition.shared_partition(16, device=0)
        assert pipe.partition is not None and pipe.partition_error is None
        assert pipe.partition.sms + left.sms == total and pipe.partition.sms >= 16
        greens = set()
        for stream in (pipe.h2d, pipe.compute, pipe.d2h):
            assert stream is not None
            err, green = cu.cuStreamGetGreenCtx(stream.ptr)
            assert int(err) == 0 and int(green) != 0, "a pipeline stream is in a green context"
            greens.add(int(green))
        assert greens == {int(pipe.partition.ctx)}
        got = _run(pipe, batches, depth=3)
    finally:
        pipe.deactivate()
        runner.deactivate()
    for g, e in zip(got, expected, strict=True):
        # Other SMs may pick other kernels: close, not identical.
        np.testing.assert_allclose(g, e, atol=1e-2, rtol=0)
