"""CLIP zero-shot scores, consistency and preprocessing; the engines built from the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engines.cache import EngineCache
from engines.models.clip import MEAN, STD
from tests.unit.tasks.moderation.clip.conftest import IMAGE_SIZE
from worker.config import load_config
from worker.config.policies import PolicySettings
from worker.tasks.moderation.models.clip.preprocess import preprocess_clip
from worker.tasks.moderation.models.clip.scoring import PromptBank, consistency, prompt_bank

POLICY = PolicySettings(models=["clip"], labels={
    "violence": {"descriptions": ["knife blood fight"]},
    "weapons": {"descriptions": ["gun"], "clip_prompts": ["a photo of a gun", "gun"]}})


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def test_zero_shot_softmax_over_all_prompts_summed_per_label() -> None:
    vecs = _unit(np.eye(4)[[0, 1, 2, 3, 3]] + 0.01)  # 5 prompts: labels a(1) b(2) neutral(2)
    bank = PromptBank(("a", "b", "neutral"), vecs, np.array([0, 1, 3]), logit_scale=100.0)
    images = _unit(np.random.default_rng(0).standard_normal((6, 4)))
    p = bank.probabilities(images)
    assert p.shape == (6, 3) and np.allclose(p.sum(axis=1), 1.0)
    logits = 100.0 * images @ vecs.T
    soft = np.exp(logits - logits.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    assert np.allclose(p[:, 1], soft[:, 1] + soft[:, 2])
    # an image equal to label a's prompt puts (almost) all mass on a
    assert bank.probabilities(vecs[:1])[0, 0] > 0.99


def test_scores_name_every_label_neutral_and_consistency() -> None:
    vecs = _unit(np.eye(3))
    bank = PromptBank(("a", "neutral"), vecs, np.array([0, 1]), logit_scale=10.0)
    s = bank.scores(vecs[0], caption=_unit(np.array([1.0, 1.0, 0.0])))
    assert set(s) == {"a", "neutral", "consistency"}
    assert s["a"] + s["neutral"] == pytest.approx(1.0)
    assert s["consistency"] == pytest.approx(np.sqrt(0.5))
    assert set(bank.scores(vecs[0], caption=None)) == {"a", "neutral"}


def test_consistency_is_clipped_to_a_score() -> None:
    v = np.array([1.0, 0.0])
    assert consistency(v, -v) == 0.0 and consistency(v, v) == pytest.approx(1.0)


def test_prompt_bank_groups_prompts_by_label_then_neutral() -> None:
    seen: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return _unit(np.ones((len(texts), 4)))

    bank = prompt_bank(POLICY, ["a photo"], 50.0, embed)
    assert seen == ["a photo of knife blood fight", "a photo of a gun", "gun", "a photo"]
    assert bank.labels == ("violence", "weapons", "neutral")
    assert bank.starts.tolist() == [0, 1, 3]


def test_preprocess_matches_clip_statistics() -> None:
    img = Image.new("RGB", (300, 150), (255, 128, 0))
    x = preprocess_clip(img, IMAGE_SIZE)
    assert x.shape == (3, IMAGE_SIZE, IMAGE_SIZE) and x.dtype == np.float32
    want = (np.array([255, 128, 0]) / 255.0 - np.array(MEAN)) / np.array(STD)
    assert np.allclose(x[:, 10, 10], want, atol=1e-5)


def test_preprocess_centre_crops_the_long_side() -> None:
    img = Image.new("RGB", (200, 100), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 50, 100))  # a white band on the left quarter
    x = preprocess_clip(img, 64)
    assert x[0, 32, 0] < 0  # the band is cropped away: the left edge is black


def test_engines_from_config_score_an_image(tiny_clip: Path, tmp_path: Path) -> None:
    from worker.tasks.moderation.models.clip.engine import make_clip_engines

    cfg = load_config(engines={"cache_dir": str(tmp_path)}, moderation={
        "clip": {"weights_dir": str(tiny_clip)}, "policies": {"p": POLICY.model_dump()}})
    clip = make_clip_engines(cfg)
    assert clip.image_size == IMAGE_SIZE
    assert [p.name for p in clip.text.profiles] == ["tok16", "tok32", "tok77"]
    with clip.image, clip.text.runner:
        bank = prompt_bank(POLICY, cfg.moderation.clip.neutral_prompts,
                           clip.config.logit_scale, clip.text.embed)
        pixels = preprocess_clip(Image.new("RGB", (80, 80), (200, 10, 10)), clip.image_size)
        image = clip.image.infer({"pixel_values": pixels[None]}).result()["embedding"][0]
        caption = clip.text.embed(["a red car"])[0]
    s = bank.scores(image, caption)
    assert set(s) == {"violence", "weapons", "neutral", "consistency"}
    assert s["violence"] + s["weapons"] + s["neutral"] == pytest.approx(1.0)
    assert 0.0 <= s["consistency"] <= 1.0
    built = sorted((e.sidecar["model_id"], e.sidecar["backend"])
                   for e in EngineCache(tmp_path).entries())
    assert built == [("clip_image", "onnxruntime"), ("clip_image.onnx", "onnx-export"),
                     ("clip_text", "onnxruntime"), ("clip_text.onnx", "onnx-export")]
