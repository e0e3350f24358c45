"""Weights and tokenizers: a local diffusers-format folder (written here from tiny random
models, offline) loads with its own tokenizer; the hash tokenizer for random weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engines.cache import EngineCache
from engines.exceptions import ModelNotFound
from engines.models.sd.arch import TINY
from engines.models.sd.engines import SdEngineOptions, make_sd_engines
from engines.models.sd.specs import Resolution
from engines.models.sd.tokenizer import ClipTokenizer, HashTokenizer
from engines.models.sd.weights import LocalSdWeights, RandomSdWeights
from tests.unit.tasks.generation.gen_support import MISSING, needs_sd

WORDS = ["a", "red", "car", "cat", "on", "mat"]


def write_clip_tokenizer(folder: Path) -> None:
    """A tiny CLIP BPE vocabulary: letters, whole words with the end-of-word marker, specials."""
    folder.mkdir(parents=True, exist_ok=True)
    letters = sorted({c for w in WORDS for c in w})
    tokens = letters + [c + "</w>" for c in letters] + [w + "</w>" for w in WORDS]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    merges = ["#version: 0.2"]
    for w in WORDS:  # merge left to right: "c a", "ca r</w>"
        if len(w) > 1:
            for i in range(1, len(w) - 1):
                merges.append(f"{w[:i]} {w[i]}")
                tokens.append(w[: i + 1])
            merges.append(f"{w[:-1]} {w[-1]}</w>")
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("\n".join(dict.fromkeys(merges)) + "\n")


def test_hash_tokenizer_frames_words_like_clip() -> None:
    tok = HashTokenizer(1000)
    ids = tok(["A red car!", "", "word " * 100])
    assert ids.shape == (3, 77) and ids.dtype == np.int64
    assert list(ids[0, :1]) == [998] and list(ids[0, 5:]) == [999] * 72  # bos, 4 tokens, eos+pad
    assert list(ids[1, :3]) == [998, 999, 999]
    assert ids[2, 76] == 999 and (ids[2, 1:76] < 998).all()  # truncated, still ends with eos
    np.testing.assert_array_equal(tok(["a RED car!"]), ids[:1])  # case-insensitive, stable


@needs_sd
def test_clip_tokenizer_from_a_local_folder(tmp_path: Path) -> None:
    write_clip_tokenizer(tmp_path)
    tok = ClipTokenizer(tmp_path)
    ids = tok(["a red car", "cat on mat"])
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    assert ids.shape == (2, 77)
    assert list(ids[0, :5]) == [bos, vocab["a</w>"], vocab["red</w>"], vocab["car</w>"], eos]
    assert list(ids[1, 1:4]) == [vocab["cat</w>"], vocab["on</w>"], vocab["mat</w>"]]


def test_clip_tokenizer_without_files_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"vocab\.json"):
        ClipTokenizer(tmp_path)


@pytest.fixture(scope="module")
def sd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A diffusers-format SD folder with tiny random weights, written offline."""
    if MISSING:
        pytest.skip(f"needs the gen extra ({', '.join(MISSING)} missing)")
    import torch
    from diffusers import AutoencoderKL

    from tests.unit.engines.models.sd.modules.sd_references import reference_with

    root = tmp_path_factory.mktemp("sd-folder")
    weights = RandomSdWeights(TINY, 3)
    nets = {"text_encoder": weights.load("text_encoder").clip, "unet": weights.load("unet").unet}
    for c, net in nets.items():  # saved by transformers / diffusers, holding the random weights
        reference_with(c, weights.config(c), net).save_pretrained(root / c)
    torch.manual_seed(3)
    AutoencoderKL.from_config(dict(TINY.vae)).save_pretrained(root / "vae")
    write_clip_tokenizer(root / "tokenizer")
    return root


@needs_sd
def test_local_folder_loads_the_saved_weights(sd_folder: Path) -> None:
    import torch

    local, rnd = LocalSdWeights(sd_folder), RandomSdWeights(TINY, 3)
    assert local.dims() == rnd.dims() and local.name == sd_folder.name and not local.random
    x = torch.randn(2, 4, 8, 8)
    t, e = torch.tensor([999.0, 1.0]), torch.randn(2, 77, 32)
    with torch.no_grad():
        np.testing.assert_array_equal(local.load("unet")(x, t, e).numpy(),
                                      rnd.load("unet")(x, t, e).numpy())
        ids = torch.zeros(1, 77, dtype=torch.int64)
        np.testing.assert_array_equal(local.load("text_encoder")(ids).numpy(),
                                      rnd.load("text_encoder")(ids).numpy())
        assert local.load("vae")(x).shape == (2, 64, 64, 3)
    assert isinstance(local.tokenizer(), ClipTokenizer)


@needs_sd
def test_local_identity_is_stable_and_follows_the_weight_bytes(sd_folder: Path,
                                                               tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sd_folder, copy)
    a, b = LocalSdWeights(sd_folder), LocalSdWeights(copy)
    assert a.identity("unet") == b.identity("unet")  # content, not path or mtime
    weights = next((copy / "unet").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a change in the tensor data at the end of the file
    weights.write_bytes(bytes(data))
    assert LocalSdWeights(copy).identity("unet") != a.identity("unet")
    assert LocalSdWeights(copy).identity("vae") == a.identity("vae")


@needs_sd
def test_torch_engine_from_a_local_folder_through_the_cache(sd_folder: Path,
                                                           tmp_path: Path) -> None:
    opts = SdEngineOptions(backend="torch", precision="fp32", device="cpu", unet_sizes=(2,),
                           text_sizes=(2,), vae_sizes=(1,))
    engines = make_sd_engines(LocalSdWeights(sd_folder), (Resolution(64, 64),), opts,
                              EngineCache(tmp_path))
    engines.activate()
    try:
        rng = np.random.default_rng(0)
        feeds = {"sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
                 "timestep": np.array([500, 500], np.float32),
                 "encoder_hidden_states": rng.standard_normal((2, 77, 32)).astype(np.float32)}
        out = engines.runners["unet"].infer(feeds).result()["noise_pred"]
        import torch

        with torch.no_grad():
            ref = LocalSdWeights(sd_folder).load("unet")(
                *(torch.from_numpy(feeds[k]) for k in feeds)).numpy()
        np.testing.assert_array_equal(out, ref)
    finally:
        engines.deactivate()


@pytest.mark.parametrize("remove", ["unet", "tokenizer", "vae/config.json"])
@needs_sd
def test_incomplete_folder_is_model_not_found(sd_folder: Path, tmp_path: Path,
                                              remove: str) -> None:
    import shutil

    copy = tmp_path / "sd"
    shutil.copytree(sd_folder, copy)
    target = copy / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(ModelNotFound, match=r"never downloaded|config\.json|missing"):
        LocalSdWeights(copy)


def test_missing_folder_says_nothing_is_downloaded(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="never downloaded"):
        LocalSdWeights(tmp_path / "nope")
