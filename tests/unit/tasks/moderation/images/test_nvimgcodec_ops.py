"""nvImageCodec's JPEG decoder (:mod:`worker.tasks.moderation.images.nvimgcodec_ops`).

Three layers, each skipped with its reason where it cannot run:

- always: the module imports without nvimgcodec or torch, and ``available()`` is False, with a
  reason, instead of raising;
- nvimgcodec installed, no GPU needed: its libjpeg-turbo backend through the same function is
  bit-equal to torchvision's CPU decoder (same library, same fancy upsampling), bad files give
  None, and threads never share a decoder;
- CUDA: parity with torchvision's CPU decode of the same files, None for bad files in a batch,
  results ordered on the caller's stream, and from several threads.

GPU parity bounds: mean absolute difference < 2 levels, as torchvision's own CUDA-vs-CPU test
(test_image.py::test_decode_jpegs_cuda); largest difference <= 48 levels. IDCTs differ by a
few levels; the rest is chroma upsampling of 4:2:0 files: libjpeg-turbo interpolates ("fancy"),
and nvImageCodec's libjpeg-turbo backend with fancy_upsampling=0 differed from it by up to 36
levels (mean 0.35) on the bench corpus. 48 is that plus a margin; a swapped channel, a rotation
or a corrupt block exceeds it (and the mean bound).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

from worker.bundled import samples_dir

PHOTOS = ("astronaut.jpg", "camera.jpg", "rocket.jpg")  # 4:2:0 colour, greyscale, 4:2:0
MEAN_BOUND, MAX_BOUND = 2.0, 48


def _no_nvimgcodec() -> str | None:
    try:
        found = importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "nvimgcodec is not installed (wheel nvidia-nvimgcodec-cu13)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the gpu extra)"
    return None


def _no_gpu_decoder() -> str | None:
    why = _no_nvimgcodec()
    if why:
        return why
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    from worker.tasks.moderation.images import nvimgcodec_ops

    return None if nvimgcodec_ops.available() else nvimgcodec_ops.unavailable_reason()


needs_nvimgcodec = pytest.mark.skipif(_no_nvimgcodec() is not None,
                                      reason=str(_no_nvimgcodec()))


@pytest.fixture(scope="module")
def gpu_decoder() -> None:
    """Skips with the reason unless nvImageCodec decodes on this machine's GPU (checked when a
    GPU test runs, not at collection)."""
    why = _no_gpu_decoder()
    if why:
        pytest.skip(why)



def _datas() -> list[bytes]:
    from bench.corpus import jpeg_photos

    return [(samples_dir() / n).read_bytes() for n in PHOTOS] + jpeg_photos(32)


def _torchvision_cpu(datas: list[bytes]) -> list[Any]:
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    import torch

    from worker.tasks.moderation.images.jpeg_ops import decode_jpegs

    return decode_jpegs([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas],
                        torch.device("cpu"))


def test_imports_without_nvimgcodec_or_torch_and_is_then_unavailable() -> None:
    # A fresh process where both imports fail, whatever this machine has installed.
    code = """
        import sys
        sys.modules["torch"] = sys.modules["nvidia.nvimgcodec"] = None
        from worker.tasks.moderation.images import nvimgcodec_ops as m
        assert sys.modules["torch"] is None and sys.modules["nvidia.nvimgcodec"] is None
        assert m.available() is False and m.available() is False
        print(m.unavailable_reason())
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nvimgcodec" in out.stdout, out.stdout


def test_available_is_false_and_cached_when_the_import_fails(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from worker.tasks.moderation.images import nvimgcodec_ops as m

    calls = []

    def missing() -> Any:
        calls.append(1)
        raise ModuleNotFoundError("No module named 'nvidia.nvimgcodec'")

    monkeypatch.setattr(m, "_nvimgcodec", missing)
    monkeypatch.setattr(m, "_state", None)
    assert m.available() is False and m.available() is False
    assert "ModuleNotFoundError" in m.unavailable_reason() and len(calls) == 1


@needs_nvimgcodec
def test_cpu_backend_is_bit_equal_to_torchvision_cpu() -> None:
    import torch

    from worker.tasks.moderation.images.nvimgcodec_ops import decode_jpegs

    datas = _datas()
    ref = _torchvision_cpu(datas)
    # bytes, memoryview and bytearray inputs alike
    mixed: list[Any] = [d if i % 3 == 0 else memoryview(d) if i % 3 == 1 else bytearray(d)
                        for i, d in enumerate(datas)]
    ours = decode_jpegs(mixed, torch.device("cpu"))
    for i, (mine, theirs) in enumerate(zip(ours, ref, strict=True)):
        assert mine is not None and mine.dtype == torch.uint8 and mine.shape == theirs.shape, i
        assert torch.equal(mine, theirs), i


@needs_nvimgcodec
def test_bad_files_give_none_on_the_cpu_not_an_exception() -> None:
    import torch

    from worker.tasks.moderation.images.nvimgcodec_ops import decode_jpegs

    good = (samples_dir() / "astronaut.jpg").read_bytes()
    out = decode_jpegs([b"\xff\xd8\xff\xe0 nope", good[: len(good) // 2], good, b""],
                       torch.device("cpu"))
    assert [o is None for o in out] == [True, True, False, True]
    assert decode_jpegs([], torch.device("cpu")) == []


@needs_nvimgcodec
def test_threads_never_share_a_decoder() -> None:
    from worker.tasks.moderation.images import nvimgcodec_ops as m

    cpu = m._nvimgcodec().NVIMGCODEC_DEVICE_CPU_ONLY
    seen: list[Any] = []  # the decoders themselves: ids of dead objects can be reused

    def grab() -> None:
        first = m._decoder(cpu)[0]
        assert m._decoder(cpu)[0] is first  # one per thread, kept
        seen.append(first)

    threads = [threading.Thread(target=grab) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    grab()
    assert len(seen) == 3 and len({id(d) for d in seen}) == 3, "threads shared a decoder"


def _diffs(ours: list[Any], ref: list[Any]) -> list[tuple[int, float]]:
    out = []
    for i, (mine, theirs) in enumerate(zip(ours, ref, strict=True)):
        assert mine is not None, f"file {i} did not decode on the GPU"
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, i
        d = (mine.cpu().int() - theirs.int()).abs()
        out.append((int(d.max()), float(d.float().mean())))
    return out


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_decoder")
def test_gpu_decode_is_close_to_torchvision_cpu() -> None:
    import torch

    from worker.tasks.moderation.images.nvimgcodec_ops import decode_jpegs

    datas = _datas()
    ours = decode_jpegs(datas, torch.device("cuda"))
    assert all(o is None or o.device.type == "cuda" for o in ours)
    for i, (worst, mean) in enumerate(_diffs(ours, _torchvision_cpu(datas))):
        assert worst <= MAX_BOUND and mean < MEAN_BOUND, (i, worst, mean)


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_decoder")
def test_gpu_bad_files_give_none_and_the_rest_decode() -> None:
    import torch

    from worker.tasks.moderation.images.nvimgcodec_ops import decode_jpegs

    good = (samples_dir() / "rocket.jpg").read_bytes()
    out = decode_jpegs([good, b"\xff\xd8\xff\xe0 nope", good[:4000], b"", good],
                       torch.device("cuda"))
    assert [o is None for o in out] == [False, True, True, True, False]
    assert torch.equal(out[0], out[4])


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_decoder")
def test_gpu_results_are_ordered_on_the_callers_stream_from_several_threads() -> None:
    import torch

    from worker.tasks.moderation.images.nvimgcodec_ops import decode_jpegs

    datas = _datas()
    ref = [t.cpu() for t in decode_jpegs(datas, torch.device("cuda"))]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                torch.cuda._sleep(20_000_000)  # the stream is busy: a wrong order shows
                out = decode_jpegs(datas, torch.device("cuda"))
                # Read on the same stream with no synchronisation in between.
                sums = torch.stack([o.int().sum() for o in out]).cpu()
            results[k] = sums.tolist()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected = [int(r.int().sum()) for r in ref]
    assert all(results[k] == expected for k in range(4))
