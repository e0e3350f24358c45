"""The bundle's weights read onto the GPU through the pinned double buffer, over many chunks."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from engines.backends.aoti import weights as w

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


def test_weights_read_onto_the_gpu_in_chunks_equal_the_stored_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "CHUNK", 4096)  # dozens of chunks, both buffers reused many times
    g = torch.Generator().manual_seed(1)
    tensors = {f"layer{i}.weight": torch.randn(64, 3 + i, 3, 3, generator=g).half()
               .to(memory_format=torch.channels_last) for i in range(12)}
    tensors["bias"] = torch.randn(1001, generator=g)
    path = tmp_path / "engine.aoti.zip"
    with zipfile.ZipFile(path, "w") as z:
        w.write_weights(z, tensors)
    # The stream is held up first, so every copy is still queued when the loop comes back to
    # its buffer: without the wait for that buffer's last copy, the data would be overwritten.
    torch.cuda._sleep(200_000_000)
    got = w.read_weights(path, "cuda:0")
    for name, t in tensors.items():
        assert got[name].is_cuda and got[name].stride() == t.stride(), name
        assert torch.equal(got[name].cpu(), t), name
