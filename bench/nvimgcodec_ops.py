"""JPEG batches decoded by NVIDIA nvImageCodec, one decoder per thread (bench/nvimgcodec_probe.py).

Tried in the worker's GPU preprocessing at fd76ea4 (``model.gpu_jpeg_decoder``) and taken out
again: inside the task it was slower than torchvision's decoder (bench/NOTES.md, 2026-12-01,
night). Kept here so the probe can be re-run on other GPUs and versions.

Why: torchvision's CUDA decoder (:mod:`worker.tasks.moderation.images.jpeg_ops`) is one nvJPEG
decoder per process behind one mutex (``decoderMutex``) and each call synchronises its stream.
On the H200 a batch of 128 ~16 KB 256x256 JPEGs took 6.7 ms from one thread, ~28 ms per call
with four threads decoding:
the GPU task stopped near 13k img/s while the engine did 23k+ (bench/NOTES.md). Here each
thread owns its own decoder (``threading.local``): no decoder or lock is shared, the GIL is
released while decoding, and a batch goes in one call to the NVJPG hardware engines (A100,
H100, H200); what they refuse (progressive, some subsamplings) goes to nvJPEG's CUDA decoder.

Streams (nvImageCodec's python/decoder.cpp, src/image_generic_codec.h, device_buffer.cpp):
``decode(..., cuda_stream=S)`` returns when the host work is done and makes S wait on the
decoder's own streams; each buffer is cudaMallocAsync'd on S and cudaFreeAsync'd on S when its
tensor is released. So the tensors are ready for work queued on S (the caller's current
stream); another stream must wait on S first. A file that does not decode comes back as None.

Imports (nvimgcodec, numpy, torch) are lazy. Wheels: nvidia-nvimgcodec-cu13, nvidia-nvjpeg.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Sequence
from typing import Any

CPU_THREADS = 2  # per decoder: header parsing and the CUDA fallback's CPU Huffman step
# nvimgcodec.BackendKind names, preferred first: the NVJPG engines, then nvJPEG's CUDA decoder.
# No CPU backend on CUDA: what the GPU refuses, the caller's own CPU decoder judges.
GPU_BACKENDS: tuple[str, ...] = ("HW_GPU_ONLY", "HYBRID_CPU_GPU")
_local = threading.local()  # .decoders: {device id: (Decoder, DecodeParams)}
_lock = threading.Lock()
_state: tuple[bool, str] | None = None  # (usable, why not), found once by available()


def _nvimgcodec() -> Any:
    # The library logs each file it cannot decode to stderr, outside the worker's logs. None
    # is enough: the caller's CPU decoder gives the reason. PYNVIMGCODEC_VERBOSITY=2 shows them.
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    from nvidia import nvimgcodec

    return nvimgcodec


def _decoder(device_id: int) -> tuple[Any, Any]:
    """This thread's decoder for ``device_id`` (a CUDA index, or nvImageCodec's CPU id)."""
    decoders: dict[int, tuple[Any, Any]] = _local.__dict__.setdefault("decoders", {})
    if device_id not in decoders:
        nv = _nvimgcodec()
        kinds = GPU_BACKENDS if device_id >= 0 else ("CPU_ONLY",)
        decoder = nv.Decoder(device_id=device_id, max_num_cpu_threads=CPU_THREADS,
                             backends=[nv.Backend(getattr(nv.BackendKind, k)) for k in kinds])
        # As torchvision's mode RGB: no EXIF rotation (callers check orientation 1), 8-bit RGB.
        params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                 allow_any_depth=False)
        decoders[device_id] = (decoder, params)
    return decoders[device_id]


def decode_jpegs(datas: Sequence[bytes | memoryview], device: Any) -> list[Any | None]:
    """RGB uint8 [3, H, W] tensors on ``device`` (CUDA: one batched call, ordered on the
    caller's current stream; CPU: libjpeg-turbo), None where a file did not decode. Each is a
    channels-last view of the decoded HWC buffer (no copy)."""
    import numpy as np
    import torch
    from torch.utils.dlpack import from_dlpack

    if not datas:
        return []
    cuda = device.type == "cuda"
    nv = _nvimgcodec()
    dev_id = ((torch.cuda.current_device() if device.index is None else device.index) if cuda
              else nv.NVIMGCODEC_DEVICE_CPU_ONLY)
    decoder, params = _decoder(dev_id)
    # bytes are referenced, not copied; other buffers go in as zero-copy uint8 arrays (the
    # binding refuses a memoryview, and would open a str as a file name).
    srcs = [d if isinstance(d, bytes) else np.frombuffer(d, dtype=np.uint8) for d in datas]
    stream = torch.cuda.current_stream(device).cuda_stream if cuda else 0
    out: list[Any | None] = []
    for img in decoder.decode(srcs, params=params, cuda_stream=stream):
        # Zero-copy, the tensor holds the buffer; to_dlpack(-1): no event wait (same stream).
        hwc = (None if img is None else from_dlpack(img.to_dlpack(-1)) if cuda
               else torch.from_numpy(np.asarray(img)))
        out.append(hwc.permute(2, 0, 1) if hwc is not None and hwc.shape[-1] == 3 else None)
    return out


def available() -> bool:
    """Whether nvImageCodec decodes a JPEG on the current CUDA device in this process (checked
    once, never raises); :func:`unavailable_reason` says why not."""
    global _state
    with _lock:
        if _state is None:
            _state = _check()
    return _state[0]


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True)."""
    return "" if available() else (_state or (False, ""))[1]


def _check() -> tuple[bool, str]:
    try:
        _nvimgcodec()
        import torch
        from PIL import Image

        if not torch.cuda.is_available():
            return False, "no CUDA device"
        buf = io.BytesIO()  # a real 16x16 JPEG: the GPU decoder must load and run
        Image.new("RGB", (16, 16), (200, 30, 60)).save(buf, format="JPEG")
        (img,) = decode_jpegs([buf.getvalue()], torch.device("cuda"))
        torch.cuda.current_stream().synchronize()
        ok = img is not None and tuple(img.shape) == (3, 16, 16)
    except Exception as exc:  # noqa: BLE001 - any failure (import, dlopen, CUDA): not usable
        return False, f"{type(exc).__name__}: {exc}"
    # nvimgcodec dlopens libnvjpeg.so.13 from nvidia/cu13/lib beside it (wheel nvidia-nvjpeg).
    return (True, "") if ok else (False, "nvImageCodec has no GPU JPEG decoder (libnvjpeg?)")
