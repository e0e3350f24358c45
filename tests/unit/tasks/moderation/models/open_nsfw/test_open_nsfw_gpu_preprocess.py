"""open_nsfw's GPU preprocessing, run on the CPU device: same geometry as the Pillow path."""

from __future__ import annotations

import numpy as np
import pytest

from worker.bundled import samples_dir
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("torchvision", reason="torchvision is not installed")


def test_matches_pillow_within_one_level_and_rejects_bad_rows() -> None:
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    datas = [p.read_bytes() for p in files] + [b"\xff\xd8\xff\xe0 truncated", b""]
    out = torch.full((len(datas), 224, 224, 3), 7, dtype=torch.uint8)
    rejects = prepare_batch(datas, out)
    assert [r is None for r in rejects] == [True] * len(files) + [False, False]
    assert all(isinstance(r, ImageRejected) for r in rejects[len(files):])
    assert bool((out[len(files):] == 7).all()), "rows of rejected images stay untouched"
    for i, path in enumerate(files):
        ref = crop_pixels(decode_image(path.read_bytes()), jpeg_roundtrip=False).astype(int)
        diff = np.abs(out[i].numpy().astype(int) - ref)
        assert diff.max() <= 1 and diff.mean() < 0.25, path.name


def test_header_limits_apply_before_decoding() -> None:
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

    data = (samples_dir() / "astronaut.jpg").read_bytes()
    out = torch.zeros((1, 224, 224, 3), dtype=torch.uint8)
    (rej,) = prepare_batch([data], out, ImageLimits(max_pixels=1000))
    assert isinstance(rej, ImageRejected) and "budget" in str(rej)


def test_warm_decoder_raises_what_the_decoder_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_batch decodes on the CPU where the batched decoder fails (one bad file must
    not fail its batch); the warm-up must see the failure, or a decoder that cannot start
    would be taken for a warm one and batches sent to it (review of 74dc511)."""
    from worker.tasks.moderation.images import jpeg_ops
    from worker.tasks.moderation.models.open_nsfw import gpu_preprocess as gpu

    data = (samples_dir() / "astronaut.jpg").read_bytes()
    gpu.warm_decoder(data, torch.device("cpu"))  # the CPU decoder stands in for nvJPEG

    def broken(*_a: object, **_k: object) -> object:
        raise RuntimeError("Failed to initialize nvjpeg")

    monkeypatch.setattr(jpeg_ops, "decode_jpegs", broken)
    out = torch.zeros((1, 224, 224, 3), dtype=torch.uint8)
    assert gpu.prepare_batch([data], out) == [None]  # falls back: the failure is hidden here
    with pytest.raises(RuntimeError, match="nvjpeg"):
        gpu.warm_decoder(data, torch.device("cpu"))
