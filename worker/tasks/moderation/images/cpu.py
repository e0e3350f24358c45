"""Safe image decoding on the CPU.

Decoding is guarded before pixels are touched: the container is sniffed, the header's size is
checked against a pixel budget (decompression bombs declare huge sizes in a tiny file), and only
then are the pixels decoded. Every failure is an :class:`ImageRejected` naming what was wrong.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from PIL import Image, UnidentifiedImageError

from worker.exceptions import ImageRejected, one_line
from worker.tasks.moderation.images.budgets import (
    DecodeGuard,
    TimedBytes,
    admit,
    check_time,
    default_guard,
)
from worker.tasks.moderation.images.jpeg_tables import MAX_SEGMENTS, sound_layout
from worker.tasks.moderation.images.png_rows import short_image_data

# PIL's own bomb guard warns or raises at 89M/179M pixels; ours is checked first and is
# configurable, so silence the warning (process-wide: catch_warnings is not thread-safe and
# decoding runs on a pool) and let DecompressionBombError still map below.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)

ALLOWED_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = 40_000_000
    max_side: int = 16_384
    # The decoded-pixel budget and time limit (budgets.py); None: the config's defaults.
    guard: DecodeGuard | None = None


@contextmanager
def _pillow_errors() -> Iterator[None]:
    """What Pillow raises on a malformed file, as the record's ImageRejected.

    Truncated or corrupt streams surface as OSError/SyntaxError/ValueError/EOFError depending
    on the plugin. Pillow raises others too: a fuzzer found TypeError (an interlaced PNG loaded
    twice), IndexError (a short iCCP chunk after the image data, an MPO index pointing nowhere)
    and struct.error (a short EXIF block). One escaping would stop the task on one record, so
    all but MemoryError become the record's rejection (a MemoryError fails the batch, which the
    task splits until the job fails alone and is dead-lettered as ``internal_error``)."""
    try:
        yield
    except ImageRejected:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageRejected(f"decompression bomb: {exc}") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageRejected(f"corrupt image data: {one_line(exc)}") from exc
    except MemoryError:
        raise
    except Exception as exc:
        raise ImageRejected(f"corrupt image data: {type(exc).__name__}: {one_line(exc)}"
                            ) from exc


def open_checked(data: bytes, limits: ImageLimits | None = None) -> Image.Image:
    """Open (header only) and check format, size and pixel budget; pixels are not decoded."""
    limits = limits or ImageLimits()
    if not data:
        raise ImageRejected("empty image")
    with _pillow_errors():
        try:
            img = Image.open(TimedBytes(data), formats=sorted(ALLOWED_FORMATS))
        except UnidentifiedImageError as exc:
            raise ImageRejected("not a JPEG, PNG or WebP image") from exc
    check_dimensions(*img.size, limits)
    return img


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers


_FILL = re.compile(rb"\xff+")


def _segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, position, length) of a JPEG's marker segments up to and including the frame
    header; stops early (yielding nothing more) where the stream is malformed, a scan starts
    before any frame header, or after :data:`MAX_SEGMENTS`."""
    if data[:2] != b"\xff\xd8":
        return
    i, n, seen = 2, len(data), 0
    while i + 4 <= n and seen < MAX_SEGMENTS:
        if data[i] != 0xFF:
            return
        marker = data[i + 1]
        if marker == 0xFF:  # fill bytes: a run of them at once (a regex, not a Python loop)
            run = _FILL.match(data, i + 1)
            i = run.end() - 1 if run is not None else i + 1
            continue
        seen += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker == 0xDA:  # scan before any frame header: malformed
            return
        length = int.from_bytes(data[i + 2:i + 4], "big")
        yield marker, i, length
        if marker in _SOF:
            return
        i += 2 + length


def _frame_header(data: bytes) -> int | None:
    """Where a JPEG's frame header (its marker) is, by walking the markers; None when the
    stream is not a well-formed JPEG up to that header."""
    return next((i for marker, i, _length in _segments(data) if marker in _SOF), None)


def jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header by walking its markers, or None when the
    stream is not a well-formed JPEG up to that header. Used by the GPU path to check limits
    for a whole batch cheaply (PIL's header parse costs ~20-40 us per image)."""
    i = _frame_header(data)
    if i is None or i + 9 > len(data):
        return None
    return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")


def jpeg_components(data: bytes) -> int | None:
    """The number of components the frame header declares (1 grey, 3 YCbCr, 4 CMYK), or None
    when the stream is not a well-formed JPEG up to that header."""
    i = _frame_header(data)
    return data[i + 9] if i is not None and i + 9 < len(data) else None


def jpeg_plain(data: bytes) -> bool:
    """True for a JPEG the GPU decoder shows as a person would see it: RGB or grey (not CMYK:
    nvJPEG refuses it), no EXIF orientation other than 1, ending with its end-of-image marker
    (nvJPEG decodes a truncated file that the CPU decoder rejects), and with tables and scan
    headers libjpeg accepts (nvJPEG checks less: a file the CPU refuses must not count as
    plain). One walk over the markers (:func:`~.jpeg_tables.sound_layout`: a few microseconds
    plus a search over the entropy-coded data) answers all but the end marker; anything else
    is decoded by :func:`decode_views`, so both paths accept and reject the same images."""
    if data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        return False
    layout = sound_layout(data)  # grey or YCbCr, tables and scan headers libjpeg accepts
    return layout is not None and all(_exif_orientation(tiff) in (None, 1)
                                      for tiff in layout.exif)


def _exif_orientation(tiff: bytes) -> int | None:
    """Tag 0x0112 of IFD0 in a TIFF block (EXIF), or None."""
    if tiff[:2] not in (b"II", b"MM") or len(tiff) < 8:
        return None
    order: Literal["little", "big"] = "little" if tiff[:2] == b"II" else "big"
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    for k in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
        entry = tiff[ifd + 2 + 12 * k: ifd + 14 + 12 * k]
        if len(entry) < 12:
            return None
        if int.from_bytes(entry[:2], order) == 0x0112:
            return int.from_bytes(entry[8:10], order)
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


def decode_image(data: bytes, limits: ImageLimits | None = None, *,
                 draft_side: int | None = None) -> Image.Image:
    """Decode JPEG/PNG/WebP bytes into one RGB image as displayed (see :func:`decode_views`:
    the first view), refusing bombs and oversized images."""
    return decode_views(data, limits, draft_side=draft_side)[0]


def decode_views(data: bytes, limits: ImageLimits | None = None, *,
                 draft_side: int | None = None) -> list[Image.Image]:
    """What a person can be shown of an image, as RGB images to score (keep the worst score):

    - EXIF orientation applied (browsers and phones honour it);
    - 16-bit samples scaled to 8 bits, not clipped (a 16-bit grey PNG would be all white);
    - transparency composited on white *and* on black (a page may show either; content drawn
      only in the alpha channel shows on one of them), one view when the alpha is opaque;
    - animated WebP/APNG: the first and the last frame and up to ``MAX_SAMPLED_FRAMES`` - 2
      evenly spaced between; an APNG's default image (shown only by viewers that do not
      animate) counts as a frame too, never as the only one.

    ``draft_side``: a JPEG is decoded at a reduced size where libjpeg can (:func:`draft`),
    never below this many pixels on either side; for callers that resize to that size or less.
    """
    limits = limits or ImageLimits()
    img = open_checked(data, limits)
    # An MPO (a JPEG with more pictures appended, e.g. a stereo camera's) shows as its first
    # picture in browsers and viewers, as on the GPU path; the others are not looked at (nor
    # checked against the limits, which only the first one's header was).
    frames = 1 if img.format == "MPO" else getattr(img, "n_frames", 1)
    if frames > MAX_FRAMES:
        raise ImageRejected(f"animated image with {frames} frames exceeds the maximum "
                            f"{MAX_FRAMES}")
    if frames * img.size[0] * img.size[1] > limits.max_pixels * 4:
        raise ImageRejected(f"animated image: {frames} frames of {img.size[0]}x{img.size[1]} "
                            "exceed the pixel budget")
    # Counted from the headers (PNG frame controls, JPEG scans) before anything is decoded;
    # then the decode holds its pixels of the process's budget, under the time limit.
    guard = limits.guard or default_guard()
    pixels = admit(data, img.format, img.size, frames, max_pixels=limits.max_pixels,
                   max_frames=MAX_FRAMES, sampled=MAX_SAMPLED_FRAMES, guard=guard)
    views: list[Image.Image] = []
    with _pillow_errors(), guard.decoding(pixels):
        if img.format == "PNG":  # (APNG too) Pillow shows missing rows black: refuse them first
            short = short_image_data(data, check_time)
            if short is not None:
                raise ImageRejected(short)
        if draft_side is not None:
            draft(img, draft_side)
        img.load()  # before the EXIF read: for a PNG, getexif() decodes the pixels itself
        orientation = _orientation(img)
        for index in _sampled(frames):
            if frames > 1:
                img.seek(index)
                img.load()
            frame = img.copy() if frames > 1 else img  # (seek() reuses img's pixels)
            views.extend(_as_displayed(_oriented(_eight_bit(frame), orientation)))
    return views


def draft(img: Image.Image, side: int) -> None:
    """Have libjpeg decode a not yet loaded JPEG at the smallest DCT scale (1/2, 1/4 or 1/8)
    that still leaves at least ``side`` pixels on each side (Pillow picks it: the largest of
    8, 4, 2 not above either side's ratio to ``side``). Scaling in the DCT skips most of the
    inverse transform and the upsampling: a 1080p frame decodes at 480x270, ~4x faster, and
    the resize that follows has less to average. Other formats are left alone. The mode is
    kept (grey stays grey, CMYK stays CMYK), orientation is applied after decoding as usual.
    """
    if img.format in ("JPEG", "MPO"):
        img.draft(img.mode, (side, side))


# Frames an animation may have, and how many of them are scored.
MAX_FRAMES = 2_000
MAX_SAMPLED_FRAMES = 8
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def _sampled(frames: int) -> list[int]:
    if frames <= MAX_SAMPLED_FRAMES:
        return list(range(frames))
    step = (frames - 1) / (MAX_SAMPLED_FRAMES - 1)
    return sorted({round(i * step) for i in range(MAX_SAMPLED_FRAMES)})


def _orientation(img: Image.Image) -> int:
    try:
        value = img.getexif().get(0x0112, 1)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - e.g. struct.error on a short block (_pillow_errors)
        return 1  # an unreadable EXIF block: shown as stored (viewers ignore it too)
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _oriented(img: Image.Image, orientation: int) -> Image.Image:
    return img.transpose(_TRANSPOSE[orientation]) if orientation != 1 else img


def _eight_bit(img: Image.Image) -> Image.Image:
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit grey: PIL's convert() clips at 255; scale instead (I holds 0..65535 here).
        return img.convert("I").point(lambda v: v / 256).convert("L")
    return img


def _as_displayed(img: Image.Image) -> list[Image.Image]:
    check_time()  # per sampled frame: between the decoder's calls, before the conversions
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if not has_alpha:
        return [img if img.mode == "RGB" else img.convert("RGB")]
    rgba = img.convert("RGBA")
    low, _high = rgba.getchannel("A").getextrema()
    if low == 255:  # declared but opaque everywhere
        return [rgba.convert("RGB")]
    return [Image.alpha_composite(Image.new("RGBA", rgba.size, background), rgba).convert("RGB")
            for background in ((255, 255, 255, 255), (0, 0, 0, 255))]

