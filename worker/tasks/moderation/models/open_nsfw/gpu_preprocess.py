"""open_nsfw's preprocessing on the GPU: decoded images resized, cropped and written into a
device batch.

Images are decoded on the device (:func:`worker.tasks.moderation.images.gpu.decode_all`:
nvJPEG for JPEGs, Pillow for the rest, headers checked first). Images of one size are resized
together (bilinear with antialiasing, PIL's BILINEAR semantics), centre-cropped to 224 and
written as uint8 RGB rows into the pipeline slot's device input; normalisation happens inside
the engine's graph. Reference's JPEG re-encode step is not reproduced on this path (config
refuses gpu + jpeg_roundtrip). torch is imported lazily; everything runs on whatever device
``out`` lives on, so the same code is tested on the CPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from worker.exceptions import JobRejected
from worker.tasks.moderation.images import gpu as images_gpu
from worker.tasks.moderation.images.cpu import ImageLimits
from worker.tasks.moderation.models.open_nsfw.preprocess import CROP, RESIZE


def prepare_batch(datas: list[bytes], out: Any, limits: ImageLimits | None = None,
                  decoder: str = "torchvision", *, plain: bool = False
                  ) -> list[JobRejected | None]:
    """Decode ``datas`` and write row i of ``out`` (uint8 [N, 224, 224, 3]) for each good
    image. Returns, per input, None or the rejection; bad rows are left untouched.
    ``decoder``: "torchvision" or "nvimgcodec"
    (:mod:`worker.tasks.moderation.images.jpeg_ops`); ``plain``: see
    :func:`~worker.tasks.moderation.images.gpu.decode_all`."""
    import torch

    limits = limits or ImageLimits()
    images: list[Any] = images_gpu.decode_all(datas, out.device, limits, decoder, plain=plain)
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

    images_gpu.warm_jpeg_decoder(data, device, decoder)
    out = torch.empty((1, CROP, CROP, 3), dtype=torch.uint8, device=device)
    (rejected,) = prepare_batch([data], out, limits, decoder)
    if rejected is not None:
        raise RuntimeError(f"the warm-up image was refused: {rejected}")
