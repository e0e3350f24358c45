"""CLIP towers from a Hugging Face folder: equal to transformers' CLIPModel, on every CPU path."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.cache import EngineCache
from engines.exceptions import ModelNotFound
from engines.models.clip import build_towers, check_folder, clip_specs, read_config
from engines.profiles import StaticProfile
from engines.tokens import TextTokenizer
from tests.unit.tasks.moderation.clip.conftest import BOS, EOS, IMAGE_SIZE

CAPTIONS = ["a photo of a cat", "knife blood fight", "a dog on the beach at sunset with people"]


def _reference(model: Any, pixels: np.ndarray, feeds: dict[str, np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray]:
    import torch

    with torch.no_grad():
        img = model.get_image_features(pixel_values=torch.from_numpy(pixels))
        txt = model.get_text_features(input_ids=torch.from_numpy(feeds["input_ids"]),
                                      attention_mask=torch.from_numpy(feeds["attention_mask"]))
    img, txt = (getattr(t, "pooler_output", t) for t in (img, txt))  # a tensor or an output
    norm = torch.nn.functional.normalize
    return norm(img, dim=1).numpy(), norm(txt, dim=1).numpy()


@pytest.fixture(scope="module")
def tokenizer(tiny_clip: Path) -> TextTokenizer:
    return TextTokenizer(tiny_clip / "tokenizer.json", buckets=(16, 32, 77))


@pytest.fixture(scope="module")
def inputs(tokenizer: TextTokenizer) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    pixels = rng.standard_normal((3, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    return pixels, tokenizer.pad([tokenizer.first_chunk(c) for c in CAPTIONS], 16)


def test_tokenizer_wraps_captions_in_clip_specials(tokenizer: TextTokenizer) -> None:
    assert tokenizer.prefix == (BOS,) and tokenizer.suffix == (EOS,)
    assert tokenizer.max_tokens == 77


def test_towers_equal_transformers(tiny_clip: Path, reference: Any,
                                   inputs: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    import torch

    image, text, _ = build_towers(tiny_clip)
    pixels, feeds = inputs
    with torch.no_grad():
        ours_img = image(torch.from_numpy(pixels)).numpy()
        ours_txt = text(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask")))
    ref_img, ref_txt = _reference(reference, pixels, feeds)
    assert np.abs(ours_img - ref_img).max() < 1e-5
    assert np.abs(ours_txt.numpy() - ref_txt).max() < 1e-5


def test_config_and_trained_logit_scale(tiny_clip: Path) -> None:
    cfg = read_config(tiny_clip)
    assert cfg.vision.image_size == IMAGE_SIZE and cfg.projection_dim == 16
    assert cfg.text.hidden_act == "quick_gelu"
    assert cfg.logit_scale == pytest.approx(math.exp(4.0))  # from the weights, not the config


@pytest.mark.parametrize("tower", ["image", "text"])
def test_onnxruntime_equals_torch(tiny_clip: Path, tmp_path: Path, reference: Any, tower: str,
                                  inputs: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    from engines.backends.onnxruntime import OrtRunner

    specs = dict(zip(("image", "text"), clip_specs(EngineCache(tmp_path), tiny_clip),
                     strict=True))
    pixels, feeds = inputs
    ref = dict(zip(("image", "text"), _reference(reference, pixels, feeds), strict=True))
    with OrtRunner(specs[tower], intra_op_threads=1) as runner:
        got = runner.infer({"pixel_values": pixels} if tower == "image" else feeds).result()
    assert np.abs(got["embedding"] - ref[tower]).max() < 1e-5


def test_torch_module_runner_cpu(tiny_clip: Path, tmp_path: Path, reference: Any,
                                 inputs: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    from engines.backends.torch.runner import TorchRunner

    image_spec, _ = clip_specs(EngineCache(tmp_path), tiny_clip)  # the tower: spec.native
    pixels, feeds = inputs
    runner = TorchRunner(image_spec,
                         profiles=(StaticProfile("px", (3, IMAGE_SIZE, IMAGE_SIZE), (4,)),),
                         precision="fp32", device="cpu")
    with runner:
        got = runner.infer({"pixel_values": pixels}).result()["embedding"]
    assert np.abs(got - _reference(reference, pixels, feeds)[0]).max() < 1e-5


def test_incomplete_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound, match=r"lacks model\.safetensors, tokenizer\.json"):
        check_folder(tmp_path)
