"""open_nsfw preprocessing on the GPU: nvJPEG decode, resize, crop, written into a device batch.

JPEGs are decoded in one batched nvJPEG call (torchvision's decoder on CUDA, loaded without
importing torchvision: :mod:`worker.tasks.moderation.images.jpeg_ops`); PNG and WebP
are decoded by Pillow on the CPU and uploaded. Images of one size are resized together
(bilinear with antialiasing, PIL's BILINEAR semantics), centre-cropped to 224 and written as
uint8 RGB rows into the pipeline slot's device input; normalisation happens inside the engine's
graph. Headers are checked on the CPU first, so bombs never reach the decoder. Reference's JPEG
re-encode step is not reproduced on this path (config refuses gpu + jpeg_roundtrip).
torch/torchvision are imported lazily; everything runs on whatever device ``out`` lives on, so
the same code is tested on the CPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from worker.exceptions import JobRejected
from worker.tasks.moderation.images.budgets import admit, default_guard
from worker.tasks.moderation.images.cpu import (
    CROP,
    MAX_FRAMES,
    MAX_SAMPLED_FRAMES,
    RESIZE,
    ImageLimits,
    check_dimensions,
    decode_image,
    jpeg_dimensions,
    open_checked,
)


def _gpu_decode(datas: list[bytes], jpeg_idx: list[int], device: Any, decoder: str
                ) -> list[Any | None]:
    """The JPEGs at ``jpeg_idx`` decoded on ``device``; None for each the decoder refuses."""
    import torch

    from worker.tasks.moderation.images.jpeg_ops import decode_jpegs, decode_jpegs_nvimgcodec

    if decoder == "nvimgcodec":
        try:
            return decode_jpegs_nvimgcodec([datas[i] for i in jpeg_idx], device)
        except RuntimeError:  # the whole call failed: the CPU decides for each file
            return [None] * len(jpeg_idx)
    raw = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in jpeg_idx]
    try:
        return decode_jpegs(raw, device)
    except RuntimeError:
        decoded: list[Any | None] = []
        for t in raw:  # one bad file fails the whole batch call: find it
            try:
                decoded.append(decode_jpegs([t], device)[0])
            except RuntimeError:
                decoded.append(None)  # the CPU decoder's verdict, in the caller
        return decoded


def _decode_all(datas: list[bytes], device: Any, limits: ImageLimits, decoder: str
                ) -> list[Any | JobRejected]:
    import torch

    out: list[Any | JobRejected] = [None] * len(datas)
    jpeg_idx: list[int] = []
    for i, data in enumerate(datas):
        try:
            dims = jpeg_dimensions(data)
            if dims is not None:
                check_dimensions(*dims, limits)
                # The CPU path's checks before decoding (scans, the decode budget's size):
                # nvJPEG must not take what the CPU refuses.
                admit(data, "JPEG", dims, 1, max_pixels=limits.max_pixels,
                      max_frames=MAX_FRAMES, sampled=MAX_SAMPLED_FRAMES,
                      guard=limits.guard or default_guard())
                jpeg_idx.append(i)
                continue
            open_checked(data, limits)  # not a clean JPEG header: let Pillow judge it
        except JobRejected as exc:
            out[i] = exc
            continue
        else:
            try:
                rgb = np.array(decode_image(data, limits))  # writable copy for torch
            except JobRejected as exc:
                out[i] = exc
                continue
            out[i] = torch.from_numpy(rgb).permute(2, 0, 1).to(device, non_blocking=True)
    if jpeg_idx:
        decoded: list[Any] = list(_gpu_decode(datas, jpeg_idx, device, decoder))
        for k, i in enumerate(jpeg_idx):
            if decoded[k] is None:
                # nvJPEG refuses some valid JPEGs (CMYK, rare subsamplings): the CPU decides,
                # so both paths accept and reject the same images (with one-line reasons).
                try:
                    rgb = np.array(decode_image(datas[i], limits))
                    decoded[k] = torch.from_numpy(rgb).permute(2, 0, 1).to(device)
                except JobRejected as exc:
                    decoded[k] = exc
        for i, img in zip(jpeg_idx, decoded, strict=True):
            out[i] = img
    return out


def prepare_batch(datas: list[bytes], out: Any, limits: ImageLimits | None = None,
                  decoder: str = "torchvision") -> list[JobRejected | None]:
    """Decode ``datas`` and write row i of ``out`` (uint8 [N, 224, 224, 3]) for each good
    image. Returns, per input, None or the rejection; bad rows are left untouched.
    ``decoder``: "torchvision" or "nvimgcodec" (:mod:`.jpeg_ops`)."""
    import torch

    limits = limits or ImageLimits()
    images: list[Any] = _decode_all(datas, out.device, limits, decoder)
    by_size: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, img in enumerate(images):
        if not isinstance(img, JobRejected):
            by_size[(int(img.shape[1]), int(img.shape[2]))].append(i)
    for idx in by_size.values():
        out[idx] = resize_crop(torch.stack([images[i] for i in idx]))
    return [img if isinstance(img, JobRejected) else None for img in images]


def resize_crop(x: Any) -> Any:
    """open_nsfw's geometry on torch: uint8 RGB [N, 3, H, W] (one size) -> uint8 RGB
    [N, 224, 224, 3] (bilinear with antialiasing to 256, PIL's BILINEAR semantics, centre
    crop 224), computed on the device ``x`` lives on."""
    import torch
    import torch.nn.functional as F

    off = (RESIZE - CROP) // 2
    y = F.interpolate(x.float(), size=(RESIZE, RESIZE), mode="bilinear", antialias=True,
                      align_corners=False)
    y = y[:, :, off:off + CROP, off:off + CROP].round_().clamp_(0, 255)
    return y.to(torch.uint8).permute(0, 2, 3, 1)


def crop_generated(pixels: Any) -> Any:
    """Generated images (uint8 RGB [N, H, W, 3], the VAE's layout) -> open_nsfw's uint8 rows
    [N, 224, 224, 3], on their device: the path a decoded job image takes, without an image
    file in between."""
    return resize_crop(pixels.permute(0, 3, 1, 2))


def warm_decoder(data: bytes, device: Any, limits: ImageLimits | None = None,
                 decoder: str = "torchvision") -> None:
    """Decode the JPEG ``data`` once on ``device`` as batches are decoded (nvJPEG's first call
    creates its handles and loads its kernels). Raises what the decoder raises, where
    :func:`prepare_batch` would quietly decode on the CPU instead: a decoder that cannot work
    must be known before batches are sent to it."""
    import torch

    from worker.tasks.moderation.images.jpeg_ops import decode_jpegs, decode_jpegs_nvimgcodec

    if decoder == "nvimgcodec":
        if decode_jpegs_nvimgcodec([data], device)[0] is None:
            raise RuntimeError("nvImageCodec decoded no image from the warm-up JPEG")
    else:
        decode_jpegs([torch.frombuffer(bytearray(data), dtype=torch.uint8)], device)
    out = torch.empty((1, CROP, CROP, 3), dtype=torch.uint8, device=device)
    (rejected,) = prepare_batch([data], out, limits, decoder)
    if rejected is not None:
        raise RuntimeError(f"the warm-up image was refused: {rejected}")
