"""The torch module runner on CUDA: MiniLM with graphs per (batch, tokens), CLIP towers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.loaders import OnnxModel
from engines.profiles import StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec

BUCKETS, SIZES = (16, 32), (1, 8)


def _no_onnx() -> OnnxModel:
    raise AssertionError("the torch runner never reads ONNX")


TEXT_SPEC = EngineSpec("minilm_l6_v2", _no_onnx,
                       (TensorSpec("input_ids", (-1, -1), "int64"),
                        TensorSpec("attention_mask", (-1, -1), "int64")),
                       (TensorSpec("embedding", (-1, 384)),))


def _with_net(spec: EngineSpec, build: Callable[[], Any], identity: str) -> EngineSpec:
    """``spec`` whose native network (what the torch runner runs) is ``build()``."""
    return dataclasses.replace(spec, native=NativeNet(lambda device: (build(), identity)))


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    from engines.models import minilm

    if not minilm.available():
        pytest.skip(f"{minilm.PACKAGE} is not installed ({minilm.EXTRA_HINT})")
    return minilm.bundled_model_dir()


def _feeds(folder: Path, length: int, n: int) -> dict[str, np.ndarray]:
    from engines.tokens import TextTokenizer

    tok = TextTokenizer(folder / "tokenizer.json", buckets=(length,))
    texts = [f"sentence number {i} about a knife fight in the street" for i in range(n)]
    feeds = tok.pad([tok.first_chunk(t) for t in texts], length)
    feeds["attention_mask"][::2, length // 2:] = 0  # half the rows padded: masks matter
    return feeds


def _reference(folder: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    from engines.models.minilm import build_encoder

    with torch.no_grad():
        return np.asarray(build_encoder(folder)(
            *(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))).numpy())


@pytest.mark.parametrize(("precision", "tol"), [("fp32", 1e-4), ("fp16", 5e-3)])
def test_graphs_per_batch_and_tokens_match_cpu_fp32(minilm_dir: Path, precision: str,
                                                    tol: float) -> None:
    from engines.backends.torch.runner import TorchRunner
    from engines.models.minilm import build_encoder

    profiles = tuple(StaticProfile(f"tok{b}", (b,), SIZES) for b in BUCKETS)
    runner = TorchRunner(_with_net(TEXT_SPEC, lambda: build_encoder(minilm_dir), "test"),
                         profiles=profiles, precision=precision, slots=2)
    with runner:
        assert runner.graph_keys == [(b, (n,)) for b in SIZES for n in BUCKETS]
        for n in BUCKETS:
            for rows in (1, 5, 8):  # 5 runs in the 8-graph, padded
                feeds = _feeds(minilm_dir, n, rows)
                got = runner.infer(feeds).result()["embedding"]
                assert got.shape == (rows, 384)
                assert np.abs(got - _reference(minilm_dir, feeds)).max() < tol


def test_many_batches_in_flight_keep_their_outputs(minilm_dir: Path) -> None:
    from engines.backends.torch.runner import TorchRunner
    from engines.models.minilm import build_encoder

    runner = TorchRunner(_with_net(TEXT_SPEC, lambda: build_encoder(minilm_dir), "test"),
                         profiles=(StaticProfile("tok32", (32,), (8,)),), precision="fp16",
                         slots=2)
    batches = [_feeds(minilm_dir, 32, 8) for _ in range(5)]
    for i, b in enumerate(batches):
        b["input_ids"][:, 1] = 2000 + i  # every batch differs
    with runner:
        handles = [runner.infer(b) for b in batches]  # more in flight than slots
        got = [h.result()["embedding"] for h in handles]
    for b, g in zip(batches, got, strict=True):
        assert np.abs(g - _reference(minilm_dir, b)).max() < 5e-3


def test_clip_image_tower_vit_b32_shapes() -> None:
    import torch

    from engines.backends.torch.runner import TorchRunner
    from engines.models.clip import vit_b32_vision
    from engines.models.clip.net import ClipImageEncoder

    torch.manual_seed(0)
    net: Any = ClipImageEncoder(vit_b32_vision(), 512).eval()
    spec = EngineSpec("clip_image", _no_onnx, (TensorSpec("pixel_values", (-1, 3, 224, 224)),),
                      (TensorSpec("embedding", (-1, 512)),))
    x = np.random.default_rng(0).standard_normal((4, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    runner = TorchRunner(_with_net(spec, lambda: net, "random"),
                         profiles=(StaticProfile("px", (3, 224, 224), (1, 4)),))
    with runner:
        got = runner.infer({"pixel_values": x}).result()["embedding"]
    assert got.shape == (4, 512)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-2)
    assert np.abs(got - want).max() < 2e-2
