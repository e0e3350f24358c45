"""The GPU path's JPEG decoders: torchvision's (nvJPEG batched on CUDA, libjpeg-turbo on the CPU),
loaded without importing torchvision, nvImageCodec's (``model.gpu_jpeg_decoder =
"nvimgcodec"``: the hardware JPEG engines first, nvJPEG's CUDA decoder for what they refuse)
and DALI's image decoder (``"dali"``: built pipelines pooled, one per batch in flight, DALI's
own split of each batch between the hardware engines and CUDA).

``import torchvision`` imports its models, datasets, ops and, through them, torch._dynamo: it
took 5-11 s of a GPU worker's 12 s warm start on the H200 (py-spy), for two
operators. Both live in torchvision's image extension library, which is loaded here by path
with ``torch.ops.load_library``, as torchvision itself loads it. Where that library cannot be
found or loaded (another layout, a future torchvision), the decoders come from
``torchvision.io`` as before: slower to import, same results.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

RGB = 3  # torchvision.io.ImageReadMode.RGB
DECODERS = ("decode_jpegs_cuda", "decode_jpeg")  # the operators this module calls
_lock = threading.Lock()
_ops: Any = None


def image_library() -> Path | None:
    """The path of torchvision's image extension library, or None (torchvision missing or laid
    out otherwise). Found without importing torchvision."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in map(Path, spec.submodule_search_locations):
        # image.so up to torchvision 0.2x, image_stable.so in the stable-ABI builds after it.
        libs = sorted(folder.glob("image*.so")) + sorted(folder.glob("image*.pyd"))
        if libs:
            return libs[0]
    return None


def _load() -> Any:
    """``torch.ops.image`` with the decoders registered (loaded once per process)."""
    global _ops
    with _lock:
        if _ops is None:
            import torch

            ops: Any = torch.ops  # (its load_library is unannotated)
            lib = image_library()
            if lib is not None:
                try:
                    ops.load_library(str(lib))
                except (OSError, RuntimeError):
                    lib = None
            if lib is None or not all(hasattr(ops.image, name) for name in DECODERS):
                import torchvision.io  # noqa: F401  (registers the same operators, slowly)
            _ops = ops.image
    return _ops


def decode_jpegs(datas: list[Any], device: Any) -> list[Any]:
    """RGB uint8 [3, H, W] tensors on ``device`` for JPEG byte tensors (uint8, CPU): one
    batched nvJPEG call on CUDA, one libjpeg-turbo call per image on the CPU (like
    ``torchvision.io.decode_jpeg(datas, mode=RGB, device=device)``). Raises RuntimeError
    when a file does not decode (on CUDA: the whole batch)."""
    ops = _load()
    if device.type == "cuda":
        return list(ops.decode_jpegs_cuda(datas, RGB, device))
    return [ops.decode_jpeg(t, RGB, False) for t in datas]


# nvImageCodec: one Decoder per thread (NVIDIA's own multi-engine pattern; sharing one across
# threads at once is undocumented). Backends in order: the hardware engines (baseline JPEGs),
# then nvJPEG's CUDA and hybrid decoders for the rest; no CPU backend: a file no GPU backend
# takes comes back as None and the caller's CPU decoder judges it, as with torchvision.
_local = threading.local()


def _installed(module: str) -> bool:
    """Whether ``module`` (under the "nvidia" namespace) is installed, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # no "nvidia" namespace package at all
        return False


def nvimgcodec_available() -> bool:
    """Whether nvImageCodec's Python package is installed (not whether a GPU can run it)."""
    return _installed("nvidia.nvimgcodec")


def _nvimgcodec_decoder(device: Any) -> Any:
    dec = getattr(_local, "decoder", None)
    if dec is None or _local.device != device.index:
        from nvidia import nvimgcodec as nvc

        backends = [nvc.Backend(nvc.BackendKind.HW_GPU_ONLY),
                    nvc.Backend(nvc.BackendKind.GPU_ONLY),
                    nvc.Backend(nvc.BackendKind.HYBRID_CPU_GPU)]
        dec = nvc.Decoder(device_id=device.index or 0, max_num_cpu_threads=1,
                          backends=backends)
        _local.params = nvc.DecodeParams(apply_exif_orientation=False,
                                         color_spec=nvc.ColorSpec.SRGB,
                                         sample_format=nvc.SampleFormat.P_RGB)
        _local.decoder, _local.device = dec, device.index
    return dec


def decode_jpegs_nvimgcodec(datas: list[bytes], device: Any) -> list[Any | None]:
    """RGB uint8 [3, H, W] CUDA tensors for JPEG bytes, decoded by nvImageCodec on the current
    torch stream (the work is queued on it; nothing waits for the GPU here); None where no GPU
    backend decodes a file."""
    import torch

    dec = _nvimgcodec_decoder(device)
    from nvidia import nvimgcodec as nvc

    stream = torch.cuda.current_stream(device).cuda_stream
    images = dec.decode([nvc.CodeStream(d) for d in datas], params=_local.params,
                        cuda_stream=stream)
    out: list[Any | None] = []
    for img in images:
        t = None if img is None else torch.utils.dlpack.from_dlpack(img)
        if t is not None and t.shape[0] != RGB and t.shape[-1] == RGB:  # interleaved after all
            t = t.permute(2, 0, 1)
        out.append(t)
    return out


# DALI: ``fn.decoders.image`` on the "mixed" device as DALI configures it by default (part of
# each batch on the hardware JPEG engines, the rest on nvJPEG's CUDA decoder, Huffman decoding
# on DALI's own CPU threads). A pipeline runs one batch at a time and the worker prepares its
# batches in flight on several threads, so built pipelines wait in a pool: a call takes one (or
# builds one) and gives it back. DALI_THREADS is each pipeline's CPU threads, as in the stage
# bench that picked this decoder (bench/moderation/dali_stage.py: 4 threads, batches of 128).
DALI_THREADS = 4
DALI_MIN_BATCH = 128  # a pipeline's batch capacity, so that one serves every batch size below
_dali_pool: list[tuple[int, int, Any]] = []  # (device index, capacity, pipeline)
_dali_lock = threading.Lock()


def dali_available() -> bool:
    """Whether DALI's Python package (nvidia-dali-cuda130) is installed."""
    return _installed("nvidia.dali")


def _dali_take(device: int, batch: int) -> tuple[int, int, Any]:
    """A built pipeline for ``device`` taking ``batch`` files: one from the pool, or a new one
    (of capacity ``max(batch, DALI_MIN_BATCH)``)."""
    with _dali_lock:
        for k, (dev, capacity, _) in enumerate(_dali_pool):
            if dev == device and capacity >= batch:
                return _dali_pool.pop(k)
    capacity = max(batch, DALI_MIN_BATCH)
    return device, capacity, _dali_build(device, capacity)


def _dali_give(entry: tuple[int, int, Any]) -> None:
    with _dali_lock:
        _dali_pool.append(entry)


def _dali_build(device: int, capacity: int) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    def graph() -> Any:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, no_copy=False)
        # The caller checked each file's EXIF orientation is 1 or absent (jpeg_plain), as
        # for the other decoders: nothing to turn.
        return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB,
                                 adjust_orientation=False)

    # exec_dynamic: outputs bound to the caller's CUDA stream (run(cuda_stream)), no host
    # wait; prefetch depth 1: inputs given to run() itself, one batch in, the same batch out.
    pipe = pipeline_def(batch_size=capacity, num_threads=DALI_THREADS, device_id=device,
                        prefetch_queue_depth=1, exec_dynamic=True)(graph)()
    pipe.build()
    return pipe


def decode_jpegs_dali(datas: list[bytes], device: Any) -> list[Any]:
    """RGB uint8 [3, H, W] CUDA tensors for JPEG bytes, decoded by DALI with its output
    ordered on the current torch stream (nothing waits for the GPU here). Raises RuntimeError
    when the batch does not decode (DALI fails a batch for one bad file); that pipeline is
    dropped, since DALI leaves a failed one unusable."""
    import numpy as np
    import torch

    try:
        # Inside: a pipeline that cannot be built (out of memory, no DALI) fails this batch
        # like a file DALI refuses; the caller decodes it another way.
        entry = _dali_take(device.index or 0, len(datas))
        stream = torch.cuda.current_stream(device)
        (images,) = entry[2].run(stream,
                                 jpegs=[np.frombuffer(d, dtype=np.uint8) for d in datas])
        # A contiguous copy of each image, made on this stream: the tensors the caller keeps
        # are torch's own memory, not buffers DALI reuses for its next batch.
        out = [torch.utils.dlpack.from_dlpack(images[k]).permute(2, 0, 1).contiguous()
               for k in range(len(datas))]
    except Exception as exc:  # DALI raises RuntimeError and, for some inputs, others
        raise RuntimeError(f"DALI did not decode the batch: {exc}") from exc
    _dali_give(entry)
    return out
