"""CLIP on generated images (``ClipModel.score_pixels``) on the tiny random checkpoint: the
scores a moderation job with the same pixels (as a PNG) and the prompt as its text gets, and
the device preprocessing against Pillow's."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from engines.models.clip import STD
from tests.unit.tasks.moderation.clip.conftest import IMAGE_SIZE
from worker.config import WorkerConfig, load_config
from worker.config.policies import PolicySettings
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import ModelContext
from worker.tasks.moderation.models.clip.model import CAPTION, IMAGE, ClipModel
from worker.tasks.moderation.models.clip.preprocess import preprocess_clip, preprocess_pixels
from worker.tasks.moderation.parts import JobState, Part, Pending
from worker.tasks.moderation.served_policies import effective_policies
from worker.wire.moderation_jobs import ModerationJob
from worker.wire.records import SourceRecord, SourceRef

POLICIES = {"ads": {"models": ["clip"], "min_consistency": 0.5, "labels": {
    "weapons": {"descriptions": ["gun"], "review": 1.0, "block": 1.0}}}}
# The first two pair with a flat red and a flat white image, which the tiny random CLIP finds
# consistent with them (a positive cosine: consistency above 0); random pairs mostly are not.
PROMPTS = ["a red car", "a photo", "a photo of a dog on the beach at sunset", "a big blue house"]


@pytest.fixture(scope="module")
def cfg(tiny_clip: Path, tmp_path_factory: pytest.TempPathFactory) -> WorkerConfig:
    return load_config(engines={"cache_dir": str(tmp_path_factory.mktemp("clip-gen"))},
                       model={"intra_op_threads": 1, "decode_threads": 1},
                       moderation={"clip": {"weights_dir": str(tiny_clip)},
                                   "policies": POLICIES})


@pytest.fixture(scope="module")
def clip(cfg: WorkerConfig) -> Iterator[ClipModel]:
    model = ClipModel.create(ModelContext(cfg, {"ads": effective_policies(cfg)["ads"]}))
    yield model
    model.close()


def images(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """uint8 RGB images [n, h, w, 3]: flat red, flat white, then smooth (what a VAE makes)
    and noisy ones (the worst case for a resize), alternately."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        if i < 2:
            out[i] = (255, 0, 0) if i == 0 else (255, 255, 255)
        elif i % 2:
            out[i] = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        else:
            out[i] = np.kron(rng.integers(0, 256, (-(-h // 8), -(-w // 8), 3)),
                             np.ones((8, 8, 1)))[:h, :w]
    return out


def png(px: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "PNG")
    return buf.getvalue()


def moderation_scores(model: ClipModel, policy: PolicySettings, pixels: np.ndarray,
                      captions: list[str]) -> list[dict[str, float]]:
    """Each image as a moderation job (a PNG of it, the caption as its text) through the
    model's parts, ``run`` and ``scores``: the moderation path."""
    states = []
    for i, (px, caption) in enumerate(zip(pixels, captions, strict=True)):
        record = SourceRecord("t", 0, i, b"k", b"<msgpack>", None, None)
        job = ModerationJob(id=f"j{i}", image=png(px), text=caption)
        states.append(JobState(Pending(SourceRef("t", 0, i), job, 0.0, record), policy))
    parts = [p for s in states for p in model.parts(s)]
    values: dict[int, dict[Any, Any]] = {id(s): {} for s in states}
    profiles = model.profiles()
    groups: dict[tuple[str, tuple[int, ...]], list[Part]] = {}
    for p in parts:
        groups.setdefault((p.kind, p.shape), []).append(p)
    for (kind, _), group in groups.items():
        batch = Batch(profiles[kind][-1], group, len(group))
        for part, value in model.run(kind, batch):
            assert isinstance(value, np.ndarray), value
            values[id(part.state)][part.key] = value
    assert all(set(v) == {IMAGE, CAPTION} for v in values.values())
    return [model.scores("ads", values[id(s)]) for s in states]


@pytest.mark.parametrize("shape", [(IMAGE_SIZE, IMAGE_SIZE), (96, 80)],
                         ids=["engine-size", "resized-and-cropped"])
def test_generated_pixels_score_as_a_moderation_job_of_their_png(
        clip: ClipModel, cfg: WorkerConfig, shape: tuple[int, int]) -> None:
    """Host pixels take the moderation path's preprocessing (Pillow) and towers: the same
    label scores and consistency as a moderation job with the image and the prompt."""
    torch = pytest.importorskip("torch", reason="the torch pixels path needs torch")

    pixels = images(len(PROMPTS), *shape, seed=3)
    ours = clip.score_pixels("ads", torch.from_numpy(pixels), PROMPTS)
    theirs = moderation_scores(clip, effective_policies(cfg)["ads"], pixels, PROMPTS)
    assert len(ours) == len(theirs) == len(PROMPTS)
    for mine, ref in zip(ours, theirs, strict=True):
        assert set(mine) == {"weapons", "neutral", "consistency"} == set(ref)
        for label, value in ref.items():
            assert mine[label] == pytest.approx(value, abs=1e-5), label
    # each image is paired with its own prompt: the consistent pairs score above 0, apart
    assert ours[0]["consistency"] > 0 and ours[1]["consistency"] > 0
    assert ours[0]["consistency"] != pytest.approx(ours[1]["consistency"], abs=1e-3)


def test_host_pixels_need_no_torch(clip: ClipModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host pixels are scored without importing torch (the onnxruntime CPU worker may not
    have it): a numpy batch scores, with torch unimportable, what its CPU tensor scores."""
    torch = pytest.importorskip("torch", reason="the torch pixels path needs torch")

    pixels = images(2, IMAGE_SIZE, IMAGE_SIZE, seed=4)
    tensor = clip.score_pixels("ads", torch.from_numpy(pixels), PROMPTS[:2])
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch", None)  # any `import torch` now raises ImportError
        plain = clip.score_pixels("ads", pixels, PROMPTS[:2])
    assert plain == tensor
    assert clip.score_pixels("ads", pixels[:0], []) == []


def test_more_images_than_the_largest_engine_batch(clip: ClipModel) -> None:
    step = max(p.max_batch for p in clip.engines.image_profiles)
    pixels = images(step + 2, IMAGE_SIZE, IMAGE_SIZE, seed=6)
    captions = [PROMPTS[i % len(PROMPTS)] for i in range(len(pixels))]
    many = clip.score_pixels("ads", pixels, captions)
    assert len(many) == len(pixels)
    assert many[-1] == clip.score_pixels("ads", pixels[-1:], captions[-1:])[0]


@pytest.mark.parametrize("shape", [(IMAGE_SIZE, IMAGE_SIZE), (96, 80), (50, 130)],
                         ids=["engine-size", "landscape-down", "portrait-up"])
def test_device_preprocessing_is_pillow_s(shape: tuple[int, int]) -> None:
    """The torch preprocessing (CUDA pixels; run here on CPU tensors) against Pillow's on the
    same pixels: identical where no resize is needed, within one level of 255 where the
    resampling rounds differently."""
    torch = pytest.importorskip("torch", reason="the torch pixels path needs torch")

    from worker.tasks.moderation.models.clip.gpu_preprocess import preprocess_generated

    pixels = images(4, *shape, seed=7)
    ours = preprocess_generated(torch.from_numpy(pixels), IMAGE_SIZE).numpy()
    pillow = np.stack([preprocess_clip(Image.fromarray(px), IMAGE_SIZE) for px in pixels])
    assert ours.shape == pillow.shape == (4, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert ours.dtype == np.float32
    assert np.array_equal(pillow, preprocess_pixels(pixels, IMAGE_SIZE))
    # in pixel levels: normalised values times std times 255
    std = np.array(STD, dtype=np.float32)[:, None, None]
    levels = np.abs(ours - pillow) * std * 255
    if shape == (IMAGE_SIZE, IMAGE_SIZE):
        assert levels.max() < 1e-3
    else:
        assert levels.max() < 1.001 and levels.mean() < 0.01


def test_device_preprocessing_scores_within_tolerance(clip: ClipModel) -> None:
    """Scores from the device preprocessing's rows (the CUDA path, on CPU tensors here)
    against the host path's, with the same consistency verdict."""
    torch = pytest.importorskip("torch", reason="the torch pixels path needs torch")

    from worker.tasks.moderation.models.clip.gpu_preprocess import preprocess_generated
    from worker.tasks.moderation.models.clip.scoring import consistency_rule

    pixels = images(4, 96, 80, seed=8)
    rows = preprocess_generated(torch.from_numpy(pixels), IMAGE_SIZE).numpy()
    emb = clip._embed_images(rows)
    text = clip.engines.text.embed(PROMPTS)
    device = [clip.banks["ads"].scores(i, c) for i, c in zip(emb, text, strict=True)]
    host = clip.score_pixels("ads", pixels, PROMPTS)
    policy = PolicySettings.model_validate(POLICIES["ads"])
    for d, h in zip(device, host, strict=True):
        for label, value in h.items():
            assert d[label] == pytest.approx(value, abs=3e-2), label
        assert (consistency_rule(policy, d) is None) == (consistency_rule(policy, h) is None)
