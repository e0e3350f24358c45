"""torchvision's JPEG decoders loaded without importing torchvision (it costs seconds)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("torchvision", reason="torchvision is not installed")

PHOTOS = ("astronaut.jpg", "camera.jpg", "rocket.jpg")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_decodes_like_torchvision_io_without_importing_torchvision() -> None:
    # A fresh process: the parent test session may have imported torchvision already.
    _run(f"""
        import sys, torch
        from worker.bundled import samples_dir
        from worker.tasks.moderation.images.jpeg_ops import decode_jpegs, image_library
        assert image_library() is not None
        datas = [torch.frombuffer(bytearray((samples_dir() / n).read_bytes()), dtype=torch.uint8)
                 for n in {PHOTOS!r}]
        ours = decode_jpegs(datas, torch.device("cpu"))
        assert "torchvision" not in sys.modules, "the decoder imported torchvision"
        from torchvision.io import ImageReadMode, decode_jpeg
        for data, mine in zip(datas, ours, strict=True):
            ref = decode_jpeg(data, mode=ImageReadMode.RGB)
            assert mine.shape == ref.shape and mine.shape[0] == 3, (mine.shape, ref.shape)
            assert torch.equal(mine, ref)
    """)


def test_falls_back_to_torchvision_io_when_the_library_is_not_found() -> None:
    _run("""
        import sys, torch
        from worker.bundled import samples_dir
        from worker.tasks.moderation.images import jpeg_ops
        jpeg_ops.image_library = lambda: None
        data = torch.frombuffer(bytearray((samples_dir() / "camera.jpg").read_bytes()),
                                dtype=torch.uint8)
        (img,) = jpeg_ops.decode_jpegs([data], torch.device("cpu"))
        assert "torchvision.io" in sys.modules and img.shape[0] == 3 and img.dtype == torch.uint8
    """)


def test_a_file_that_does_not_decode_raises_runtime_error() -> None:
    # decode_all relies on it to find the bad file of a batch and ask the CPU decoder.
    import torch

    from worker.tasks.moderation.images.jpeg_ops import decode_jpegs

    with pytest.raises(RuntimeError):
        decode_jpegs([torch.frombuffer(bytearray(b"\xff\xd8\xff\xe0 nope"), dtype=torch.uint8)],
                     torch.device("cpu"))
