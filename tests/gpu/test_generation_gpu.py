"""Generation on CUDA: the tiny SD config on the torch runner (fp16, CUDA graphs), the same
code path production uses at full size (bench/generation/generation_bench.py times that one).

Skipped without CUDA (tests/gpu/conftest.py) and without the gen extra (reason given).
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

# The gen extra's own modules (the SD nets are in-house: no diffusers or transformers).
MISSING = [m for m in ("tokenizers", "safetensors") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the gen extra ({MISSING} missing)")

SIZES = ((64, 64), (128, 64))


def _engines(cache: Any, device: str = "cuda:0", precision: str = "fp16",
             graphs: bool = True) -> Any:
    from engines.models.sd.arch import TINY
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    opts = SdEngineOptions(backend="torch", precision=precision, device=device,
                           cuda_graphs=graphs, unet_sizes=(2, 4, 8), text_sizes=(2, 4, 8),
                           vae_sizes=(1, 2, 4))
    return make_sd_engines(RandomSdWeights(TINY), tuple(Resolution(w, h) for w, h in SIZES),
                           opts, cache)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engines.cache import EngineCache

    return EngineCache(tmp_path_factory.mktemp("sd-gpu"))


@pytest.fixture(scope="module")
def gpu(cache: Any) -> Iterator[Any]:
    engines = _engines(cache)
    engines.activate()
    yield engines
    engines.deactivate()


def _task(engines: Any, tmp_path: Path, in_flight: int = 2) -> Any:
    from worker.config.generation import GenerationSettings
    from worker.tasks.generation.blobs import LocalBlobStore
    from worker.tasks.generation.task import GenerationTask

    # device as the worker resolves it (worker/tasks/generation/device.py): "auto" left
    # unresolved would warm up by first use and capture nothing.
    g = GenerationSettings(random_weights="tiny", device="cuda:0",
                           sizes=[{"width": w, "height": h} for w, h in SIZES],
                           unet_batch_sizes=[2, 4, 8], text_batch_sizes=[2, 4, 8],
                           vae_batch_sizes=[1, 2, 4])
    return GenerationTask(g, engines, LocalBlobStore(tmp_path), own_engines=False,
                          max_in_flight_batches=in_flight)


def _job(**kw: Any) -> bytes:
    return msgpack.packb({"v": 1, "id": "g", "prompt": "a red car", "width": 64, "height": 64,
                          "steps": 5, "seed": 3} | kw)


def _run(task: Any, *payloads: bytes) -> Any:
    from worker.tasks.batcher import Batch
    from worker.wire.records import SourceRef

    items = [task.pending(p, SourceRef("t", 0, i)) for i, p in enumerate(payloads)]
    return task.submit(Batch(task.batcher_profiles()[0], items, len(items)))


def test_warm_up_captures_one_graph_per_static_shape_and_slot(gpu: Any, tmp_path: Path) -> None:
    task = _task(gpu, tmp_path)
    task.warm_up()
    # text: 3 sizes; UNet and VAE: 3 sizes x 2 resolutions; 2 slots each.
    assert [gpu.runners[c].graph_count() for c in ("text_encoder", "unet", "vae")] == [6, 12, 12]
    task.close()


def test_same_seed_same_png_bytes_with_graphs(gpu: Any, tmp_path: Path) -> None:
    from PIL import Image

    task = _task(gpu, tmp_path)
    a, b = (_run(task, _job(num_images=3, scheduler="euler_a")).result()[0].result
            for _ in range(2))
    task.close()
    assert a.status.value == "ok" and [im.png for im in a.images] == [im.png for im in b.images]
    with Image.open(io.BytesIO(a.images[0].png)) as im:
        assert im.size == (64, 64)


def test_concurrent_batches_match_sequential_ones(gpu: Any, tmp_path: Path) -> None:
    """Two batches in flight on two threads share the runners' graphs and streams."""
    task = _task(gpu, tmp_path, in_flight=2)
    jobs = [_job(id=f"j{i}", seed=i, width=w, height=64) for i, w in enumerate((64, 128) * 3)]
    sequential = [_run(task, j).result()[0].result.images[0].png for j in jobs]
    futures = [_run(task, j) for j in jobs]
    concurrent = [f.result()[0].result.images[0].png for f in futures]
    task.close()
    assert concurrent == sequential


def test_chunks_stepped_together_match_each_chunk_stepped_alone(gpu: Any, tmp_path: Path
                                                               ) -> None:
    """Three chunks of one shape, more than its two graph slots: three 4-image jobs in one
    batch (the UNet's 8 rows hold one job's CFG pairs), so a step's third launch reuses the
    first's slot while the second is in flight (worker.tasks.generation.sampler.denoise), and
    each chunk must still read only its own outputs."""
    task = _task(gpu, tmp_path)
    jobs = [_job(id=f"j{i}", seed=100 + 4 * i, num_images=4, steps=4, scheduler="euler_a")
            for i in range(3)]
    together = [o.result.images for o in _run(task, *jobs).result()]
    alone = [_run(task, j).result()[0].result.images for j in jobs]
    task.close()
    for a, b in zip(together, alone, strict=True):
        assert [im.png for im in a] == [im.png for im in b]
    assert len({tuple(im.png for im in images) for images in together}) == 3  # different seeds


def test_graphs_match_eager_and_fp16_tracks_the_cpu_fp32_reference(gpu: Any, cache: Any) -> None:
    rng = np.random.default_rng(0)
    feeds = {"sample": rng.standard_normal((4, 4, 8, 16)).astype(np.float32),
             "timestep": np.array([999, 500, 500, 1], np.float32),
             "encoder_hidden_states": rng.standard_normal((4, 77, 32)).astype(np.float32)}
    from engines.backends.torch.runner import TorchRunner
    from engines.models.sd.arch import TINY
    from engines.models.sd.build import sd_cache_loader
    from engines.models.sd.specs import sd_spec
    from engines.models.sd.weights import RandomSdWeights

    graphed = gpu.runners["unet"].infer(feeds).result()["noise_pred"]
    eager = _engines(cache, graphs=False).runners["unet"]
    # The reference runs the same cached fp16 weights in fp32 on the CPU (random weights
    # initialised on the GPU differ from a CPU initialisation with the same seed).
    w = RandomSdWeights(TINY)
    artifact = sd_cache_loader(cache, w, "unet", "torch", "cuda:0", "fp16")
    cpu = TorchRunner(sd_spec(w, "unet"), engine=artifact, profiles=(), precision="fp32",
                      device="cpu")
    with eager, cpu:
        eager_out = eager.infer(feeds).result()["noise_pred"]
        ref = cpu.infer(feeds).result()["noise_pred"]
    np.testing.assert_allclose(graphed, eager_out, atol=1e-3, rtol=0)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(graphed, ref, atol=2e-2 * scale, rtol=0)


def test_cached_artifacts_load_without_a_rebuild(gpu: Any, cache: Any) -> None:
    from engines.models.sd.arch import TINY
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    builds: list[Any] = []
    again = make_sd_engines(RandomSdWeights(TINY), (Resolution(64, 64),),
                            SdEngineOptions(unet_sizes=(2,), text_sizes=(2,), vae_sizes=(1,)),
                            cache, on_build=builds.append)
    again.activate()
    try:
        assert builds == [] and again.engine_hashes() == gpu.engine_hashes()
    finally:
        again.deactivate()
