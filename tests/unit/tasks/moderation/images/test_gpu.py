"""The GPU path's decode step (images/gpu.py) with model.gpu_jpeg_decoder = "dali", run on the
CPU device: DALI itself needs a GPU (tests/gpu/test_views_gpu.py runs it there), so a stand-in
decodes with libjpeg-turbo; what is tested here is which files reach DALI and what happens when
DALI fails a batch."""

from __future__ import annotations

import io

import pytest
from structlog.testing import capture_logs

from worker.bundled import samples_dir
from worker.exceptions import JobRejected
from worker.tasks.moderation.images.cpu import ImageLimits

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("torchvision", reason="torchvision is not installed")


def _batch() -> list[bytes]:
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(png, "PNG")
    jpegs = [(samples_dir() / n).read_bytes() for n in ("astronaut.jpg", "camera.jpg")]
    return [jpegs[0], png.getvalue(), jpegs[1], b"\xff\xd8\xff\xe0 truncated"]


def _by_torchvision(datas: list[bytes]) -> list[object]:
    from worker.tasks.moderation.images.gpu import decode_all

    return decode_all(datas, torch.device("cpu"), ImageLimits(), "torchvision")


def test_dali_decodes_the_jpegs_and_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.tasks.moderation.images import jpeg_ops
    from worker.tasks.moderation.images.gpu import decode_all

    datas = _batch()
    seen: list[list[bytes]] = []

    def dali(files: list[bytes], device: object) -> list[object]:
        seen.append(list(files))
        raw = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
        return [jpeg_ops.decode_jpegs([t], torch.device("cpu"))[0] for t in raw]

    monkeypatch.setattr(jpeg_ops, "decode_jpegs_dali", dali)
    got = decode_all(datas, torch.device("cpu"), ImageLimits(), "dali")
    # One call for the batch's JPEGs: the PNG goes to Pillow, the truncated file is refused
    # by the header checks before any decoder sees it.
    assert seen == [[datas[0], datas[2]]]
    ref = _by_torchvision(datas)
    for k in (0, 1, 2):
        assert torch.equal(got[k], ref[k])
    assert isinstance(got[3], JobRejected) and isinstance(ref[3], JobRejected)


def test_a_batch_dali_fails_is_decoded_file_by_file_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.tasks.moderation.images import jpeg_ops
    from worker.tasks.moderation.images.gpu import decode_all

    calls = []

    def failing(files: list[bytes], device: object) -> list[object]:
        calls.append(len(files))
        raise RuntimeError("DALI did not decode the batch: nvImageCodec failure")

    monkeypatch.setattr(jpeg_ops, "decode_jpegs_dali", failing)
    datas = _batch()
    with capture_logs() as logs:
        got = decode_all(datas, torch.device("cpu"), ImageLimits(), "dali")
    ref = _by_torchvision(datas)
    assert calls == [2]
    # Said, so that a DALI that fails every batch does not pass for a slow decoder.
    (warning,) = [e for e in logs if e["event"] == "gpu_decoder_batch_failed"]
    assert warning["decoder"] == "dali" and warning["files"] == 2
    assert "nvImageCodec failure" in warning["error"]
    for k in (0, 1, 2):
        assert torch.equal(got[k], ref[k])
    assert isinstance(got[3], JobRejected)
