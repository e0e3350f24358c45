"""Image decoding on the GPU: nvJPEG for JPEGs, Pillow for the rest, each image on a device.

JPEGs are decoded in one batched nvJPEG call (torchvision's decoder on CUDA, loaded without
importing torchvision: :mod:`worker.tasks.moderation.images.jpeg_ops`); PNG and WebP
are decoded by Pillow on the CPU and uploaded. Headers are checked on the CPU first, so bombs
never reach the decoder, and a JPEG the GPU decoder refuses is decided by the CPU decoder, so
both paths accept and reject the same images. What a model makes of the decoded pixels is its
own (open_nsfw: :mod:`worker.tasks.moderation.models.open_nsfw.gpu_preprocess`).
torch/torchvision are imported lazily; everything runs on whatever device it is given, so the
same code is tested on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import structlog

from worker.exceptions import JobRejected, one_line
from worker.tasks.moderation.images.budgets import admit, default_guard
from worker.tasks.moderation.images.cpu import (
    MAX_FRAMES,
    MAX_SAMPLED_FRAMES,
    ImageLimits,
    check_dimensions,
    decode_image,
    jpeg_dimensions,
    open_checked,
)

log = structlog.get_logger("worker")


def _gpu_decode(datas: list[bytes], jpeg_idx: list[int], device: Any, decoder: str
                ) -> list[Any | None]:
    """The JPEGs at ``jpeg_idx`` decoded on ``device``; None for each the decoder refuses."""
    import torch

    from worker.tasks.moderation.images.jpeg_ops import (
        decode_jpegs,
        decode_jpegs_dali,
        decode_jpegs_nvimgcodec,
    )

    if decoder == "nvimgcodec":
        try:
            return decode_jpegs_nvimgcodec([datas[i] for i in jpeg_idx], device)
        except RuntimeError:  # the whole call failed: the CPU decides for each file
            return [None] * len(jpeg_idx)
    if decoder == "dali":
        try:
            return decode_jpegs_dali([datas[i] for i in jpeg_idx], device)
        except RuntimeError as exc:
            # One file failed DALI's batch (nvJPEG below finds it, the rest decode there), or
            # DALI itself is failing: said per batch, or a decoder that never works would
            # pass for a slow one.
            log.warning("gpu_decoder_batch_failed", decoder="dali", files=len(jpeg_idx),
                        error=one_line(exc, 300), fallback="nvjpeg")
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


def decode_all(datas: list[bytes], device: Any, limits: ImageLimits, decoder: str, *,
               plain: bool = False) -> list[Any | JobRejected]:
    """Each of ``datas`` decoded as uint8 RGB [3, H, W] on ``device``, or its rejection.
    ``decoder`` decodes the JPEGs: "torchvision", "nvimgcodec" or "dali" (:mod:`.jpeg_ops`).
    ``plain``: every JPEG among ``datas`` passed :func:`~.cpu.jpeg_plain`, whose walk over
    the markers already refused more scans than the limit, so they are not searched for
    again (a search through every byte with the GIL held, as long as the rest of the header
    checks together on HD frames)."""
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
                      guard=limits.guard or default_guard(), scans_checked=plain)
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



def warm_jpeg_decoder(data: bytes, device: Any, decoder: str = "torchvision") -> None:
    """Decode the JPEG ``data`` once on ``device`` with ``decoder`` itself (nvJPEG's first call
    creates its handles and loads its kernels). Raises what the decoder raises, where
    :func:`decode_all` would quietly decode on the CPU instead."""
    import torch

    from worker.tasks.moderation.images.jpeg_ops import (
        decode_jpegs,
        decode_jpegs_dali,
        decode_jpegs_nvimgcodec,
    )

    if decoder == "nvimgcodec":
        if decode_jpegs_nvimgcodec([data], device)[0] is None:
            raise RuntimeError("nvImageCodec decoded no image from the warm-up JPEG")
    elif decoder == "dali":
        decode_jpegs_dali([data], device)
    else:
        decode_jpegs([torch.frombuffer(bytearray(data), dtype=torch.uint8)], device)
