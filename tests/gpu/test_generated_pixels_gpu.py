"""Generated images scored where the VAE left them (generation's image check): open_nsfw's
pipeline and CLIP's image tower take pixels on a CUDA device without a host round trip, and
score what the same pixels score from the host and on the CPU reference path.

Skipped without CUDA (tests/gpu/conftest.py); the CLIP case also without transformers and
tokenizers (its tiny random checkpoint is written with them), the reference case without
ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.tasks.moderation.clip.conftest import tiny_clip  # noqa: F401 - a fixture, used by name

CAPTIONS = ["a red car", "a photo", "a dog on a beach", "a big blue house"]
# The GPU path against the float32 CPU reference (tests/gpu/test_views_gpu.py's bound).
REFERENCE_TOL = 3e-2


def vae_like(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """uint8 RGB [n, h, w, 3]: smooth blocks with noise, as decoded latents look."""
    rng = np.random.default_rng(seed)
    blocks = np.kron(rng.integers(0, 256, (n, -(-h // 16), -(-w // 16), 3)),
                     np.ones((1, 16, 16, 1)))[:, :h, :w]
    noisy = blocks + rng.normal(0, 6, blocks.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def open_nsfw_gpu() -> Iterator[Any]:
    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner
    from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel

    cfg = load_config(model={"backend": "torch", "preprocess": "gpu", "jpeg_roundtrip": False},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    model = OpenNsfwGpuModel(cfg, runner, plan.spec, plan.profiles)
    model.warm_up(plan.profiles)
    yield model
    model.close()
    runner.deactivate()


@pytest.mark.parametrize("size", [(512, 512), (768, 512)], ids=["512", "768x512"])
def test_open_nsfw_scores_cuda_pixels_as_it_scores_host_pixels(open_nsfw_gpu: Any,
                                                               size: tuple[int, int]) -> None:
    import torch

    assert open_nsfw_gpu.pipeline.compute is not None, "the pixel pipeline is not active"
    pixels = torch.from_numpy(vae_like(5, size[1], size[0], seed=3))
    on_device = pixels.cuda()
    host = open_nsfw_gpu.score_pixels("default", pixels, [*CAPTIONS, "x"])
    device = open_nsfw_gpu.score_pixels("default", on_device, [*CAPTIONS, "x"])
    assert len(host) == len(device) == 5
    for h, d in zip(host, device, strict=True):
        assert h.keys() == d.keys()
        for label, value in h.items():
            assert d[label] == pytest.approx(value, abs=1e-3), label


def test_open_nsfw_on_cuda_scores_generated_pixels_like_the_cpu_reference(open_nsfw_gpu: Any
                                                                          ) -> None:
    pytest.importorskip("onnxruntime", reason="the CPU reference runs on ONNX Runtime")
    import torch

    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner
    from worker.tasks.moderation.models.open_nsfw.model import OpenNsfwModel

    cfg = load_config(model={"backend": "onnxruntime", "precision": "fp32"},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    reference = OpenNsfwModel(cfg, runner, plan.spec, plan.profiles)
    try:
        pixels = torch.from_numpy(vae_like(4, 512, 512, seed=11))
        want = reference.score_pixels("default", pixels, CAPTIONS)
        got = open_nsfw_gpu.score_pixels("default", pixels.cuda(), CAPTIONS)
    finally:
        reference.close()
        runner.deactivate()
    for w, g in zip(want, got, strict=True):
        for label, value in w.items():
            assert abs(g[label] - value) < REFERENCE_TOL, (label, g[label], value)


def test_clip_scores_cuda_pixels_as_it_scores_host_pixels(tiny_clip: Path,  # noqa: F811
                                                          tmp_path: Path) -> None:
    import torch

    from worker.config import load_config
    from worker.config.policies import PolicySettings
    from worker.tasks.moderation.models.base import ModelContext
    from worker.tasks.moderation.models.clip.model import ClipModel
    from worker.tasks.moderation.models.clip.scoring import consistency_rule
    from worker.tasks.moderation.served_policies import effective_policies

    policies = {"ads": {"models": ["clip"], "min_consistency": 0.5, "labels": {
        "weapons": {"descriptions": ["gun"], "review": 1.0, "block": 1.0}}}}
    cfg = load_config(engines={"cache_dir": str(tmp_path)}, model={"backend": "torch"},
                      moderation={"clip": {"weights_dir": str(tiny_clip), "backend": "torch"},
                                  "policies": policies})
    model = ClipModel.create(ModelContext(cfg, {"ads": effective_policies(cfg)["ads"]}))
    try:
        pixels = vae_like(4, 96, 80, seed=8)
        host = model.score_pixels("ads", pixels, CAPTIONS)
        device = model.score_pixels("ads", torch.from_numpy(pixels).cuda(), CAPTIONS)
    finally:
        model.close()
    policy = PolicySettings.model_validate(policies["ads"])
    for h, d in zip(host, device, strict=True):
        assert h.keys() == d.keys()
        for label, value in h.items():
            assert d[label] == pytest.approx(value, abs=3e-2), label
        assert (consistency_rule(policy, d) is None) == (consistency_rule(policy, h) is None)
