"""The text engine on every CPU path: ONNX export (cached) on onnxruntime vs the torch module."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.cache import EngineCache
from engines.exceptions import BackendUnavailable, ModelChecksumMismatch
from engines.loaders import OnnxModel
from engines.models import minilm
from engines.onnx_export import OnnxFromTorch
from engines.profiles import StaticProfile
from engines.spec import EngineSpec
from engines.tokens import TextTokenizer
from engines.weights import WeightsFromPath

TEXTS = ["He stabbed his neighbour with a kitchen knife.", "Fresh croissants every morning.",
         "Send your PIN to verify your account " * 6, "ok"]


def _torch(net: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return np.asarray(net(*(torch.from_numpy(feeds[k])
                                for k in ("input_ids", "attention_mask"))).numpy())


@pytest.mark.parametrize("bucket", [16, 32, 64, 128])
def test_onnxruntime_equals_torch_fp32(ort_text: Any, minilm_net: Any, tokenizer: TextTokenizer,
                                       bucket: int) -> None:
    chunks = [c for c in (tokenizer.first_chunk(t) for t in TEXTS) if len(c.ids) <= bucket]
    feeds = tokenizer.pad(chunks, bucket)
    got = ort_text.infer(feeds).result()["embedding"]
    assert got.shape == (len(chunks), minilm.DIM)
    assert np.abs(got - _torch(minilm_net, feeds)).max() < 1e-5


def test_padding_does_not_change_an_embedding(ort_text: Any, tokenizer: TextTokenizer) -> None:
    chunk = tokenizer.first_chunk(TEXTS[0])
    short = ort_text.infer(tokenizer.pad([chunk], 16)).result()["embedding"]
    long = ort_text.infer(tokenizer.pad([chunk], 128)).result()["embedding"]
    assert np.abs(short - long).max() < 1e-5


def test_torch_module_runner_cpu_mode(minilm_dir: Path, text_spec: EngineSpec, minilm_net: Any,
                                      tokenizer: TextTokenizer) -> None:
    from engines.backends.torch.runner import TorchRunner

    profiles = (StaticProfile("tok32", (32,), (1, 8)),)
    # The encoder comes from the spec (text_spec.native: the bundled folder's weights).
    runner = TorchRunner(text_spec, profiles=profiles, precision="fp32", device="cpu")
    feeds = tokenizer.pad([tokenizer.first_chunk(t) for t in TEXTS[:2]], 32)
    with runner:
        got = runner.infer(feeds).result()["embedding"]
        assert runner.engine_hash.endswith(minilm.WEIGHTS_SHA256[:12])
    assert np.abs(got - _torch(minilm_net, feeds)).max() < 1e-6


def test_export_is_cached_and_reused(text_spec: EngineSpec, text_cache: EngineCache,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first = text_spec.onnx()
    entries = [e for e in text_cache.entries() if e.sidecar["backend"] == "onnx-export"]
    assert len(entries) == 1 and entries[0].sidecar["onnx_sha256"] == minilm.WEIGHTS_SHA256

    def no_export(*_: Any, **__: Any) -> None:
        raise AssertionError("exported again despite a cached export")

    monkeypatch.setattr("engines.onnx_export.export_onnx", no_export)
    assert text_spec.onnx().sha256 == first.sha256


def test_without_torch_a_missing_export_names_the_extra_or_uses_a_fallback(
        minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def no_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "torch" else real_find_spec(name, *args, **kwargs)

    shipped = OnnxModel(b"onnx-bytes", "f" * 64, "shipped.onnx")
    loader = OnnxFromTorch(minilm.MODEL_ID, minilm.weights_loader(),
                           minilm.export_spec(minilm_dir), EngineCache(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    with pytest.raises(BackendUnavailable, match=r"torch \(needed to make one\).*"
                                                 r"kafka-trt-worker\[text\]"):
        loader()
    assert dataclasses.replace(loader, fallback=lambda: shipped)() is shipped


def test_pinned_weights_digest_refuses_another_file(tmp_path: Path) -> None:
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(b"not the MiniLM weights")
    with pytest.raises(ModelChecksumMismatch, match="expected 53aa5117"):
        WeightsFromPath(fake, minilm.WEIGHTS_SHA256)()
