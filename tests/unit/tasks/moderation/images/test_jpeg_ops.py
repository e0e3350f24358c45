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


def test_dali_pipelines_are_taken_from_the_pool_and_given_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A pipeline runs one batch at a time; the worker prepares batches on several threads.
    from worker.tasks.moderation.images import jpeg_ops

    built: list[tuple[int, int]] = []

    def build(device: int, capacity: int) -> object:
        built.append((device, capacity))
        return object()

    monkeypatch.setattr(jpeg_ops, "_dali_build", build)
    monkeypatch.setattr(jpeg_ops, "_dali_pool", [])
    a = jpeg_ops._dali_take(0, 8)
    b = jpeg_ops._dali_take(0, 8)  # a is out: a second pipeline
    assert a[2] is not b[2] and built == [(0, jpeg_ops.DALI_MIN_BATCH)] * 2
    jpeg_ops._dali_give(a)
    assert jpeg_ops._dali_take(0, jpeg_ops.DALI_MIN_BATCH) is a
    jpeg_ops._dali_give(a)
    big = jpeg_ops._dali_take(0, 4 * jpeg_ops.DALI_MIN_BATCH)  # a is too small for it
    other = jpeg_ops._dali_take(1, 8)  # a is another device's
    assert big[1] == 4 * jpeg_ops.DALI_MIN_BATCH and other[0] == 1
    assert len(built) == 4 and jpeg_ops._dali_pool == [a]


def test_a_dali_pipeline_that_cannot_be_built_fails_the_batch_as_runtime_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # images/gpu.py decodes such a batch with nvJPEG instead; any other exception type would
    # reach the batch thread and stop the worker.
    import torch

    from worker.tasks.moderation.images import jpeg_ops

    def build(device: int, capacity: int) -> object:
        raise MemoryError("cudaMalloc failed while building the pipeline")

    monkeypatch.setattr(jpeg_ops, "_dali_build", build)
    monkeypatch.setattr(jpeg_ops, "_dali_pool", [])
    with pytest.raises(RuntimeError, match="DALI did not decode the batch"):
        jpeg_ops.decode_jpegs_dali([b"\xff\xd8"], torch.device("cpu"))
    assert jpeg_ops._dali_pool == []
