"""A PNG (or APNG frame) with fewer pixel rows than its header declares is refused before it is
decoded: Pillow would show the missing rows black (worker/tasks/moderation/images/png_rows.py)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import decode_views
from worker.tasks.moderation.images.png_rows import (
    SIGNATURE,
    expected_bytes,
    short_image_data,
)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, raw: bytes, *, interlace: int = 0, colour: int = 2,
         depth: int = 8) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    return (SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw))
            + _chunk(b"IEND", b""))


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, i = [], len(SIGNATURE)
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        out.append((data[i + 4:i + 8], data[i + 8:i + 8 + n]))
        i += 12 + n
    return out


def _rebuild(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return SIGNATURE + b"".join(_chunk(k, b) for k, b in chunks)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def _last_pixel(w: int, h: int) -> tuple[int, int]:
    """Where the last byte of an interlaced image's data lands: the last pixel of the last
    pass that has any."""
    for x0, y0, dx, dy in reversed(_ADAM7):
        if w > x0 and h > y0:
            return x0 + dx * ((w - x0 - 1) // dx), y0 + dy * ((h - y0 - 1) // dy)
    raise AssertionError("empty image")


@pytest.mark.parametrize(("size", "bits"), [((7, 5), 24), ((1, 1), 8), ((17, 3), 1),
                                             ((9, 9), 64), ((2, 1), 24)])
def test_interlaced_sizes_are_what_pillow_reads(size: tuple[int, int], bits: int) -> None:
    # Data of exactly the computed size whose last pixel is set: Pillow shows that pixel set
    # (a count too low would leave it black) and the check passes (one too high would fail).
    w, h = size
    colour, depth = {24: (2, 8), 8: (0, 8), 1: (0, 1), 64: (6, 16)}[bits]
    want = expected_bytes(w, h, bits, interlaced=True)
    last = max(1, bits // 8)
    whole = _png(w, h, b"\x00" * (want - last) + b"\xff" * last, interlace=1, colour=colour,
                 depth=depth)
    assert short_image_data(whole) is None
    img = Image.open(io.BytesIO(whole))
    img.load()
    pixel = img.getpixel(_last_pixel(w, h))
    assert pixel not in (0, (0, 0, 0), (0, 0, 0, 0)), (pixel, img.mode)
    assert short_image_data(_png(w, h, b"\x00" * (want - 1), interlace=1, colour=colour,
                                 depth=depth)) is not None


def test_a_complete_png_passes_and_a_short_one_names_the_missing_bytes() -> None:
    raw = b"".join(b"\x00" + bytes(range(30)) for _ in range(10))  # 10 rows of 10 RGB pixels
    assert short_image_data(_png(10, 10, raw)) is None
    reason = short_image_data(_png(10, 10, raw[:31 * 4]))
    assert reason == ("corrupt image data: the PNG's image holds 124 of the 310 bytes of pixel "
                      "rows its header declares")
    with pytest.raises(ImageRejected, match="holds 124 of the 310 bytes"):
        decode_views(_png(10, 10, raw[:31 * 4]))


def test_image_data_that_does_not_inflate_is_refused_with_zlib_s_reason() -> None:
    good = _png(4, 4, b"\x00" * 52)
    chunks = _chunks(good)
    chunks[1] = (b"IDAT", b"\x78\x9c not deflate at all")
    assert "corrupt image data" in (short_image_data(_rebuild(chunks)) or "")


def _apng(frames: int) -> bytes:
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
            for _ in range(frames)]
    buf = io.BytesIO()
    imgs[0].save(buf, format="PNG", save_all=True, append_images=imgs[1:], duration=100)
    return buf.getvalue()


def test_an_apng_frame_with_too_few_rows_is_refused_by_its_number() -> None:
    data = _apng(3)
    assert short_image_data(data) is None and len(decode_views(data)) == 3
    chunks = _chunks(data)
    fdats = [i for i, (k, _) in enumerate(chunks) if k == b"fdAT"]
    assert len(fdats) == 2
    seq = chunks[fdats[1]][1][:4]
    chunks[fdats[1]] = (b"fdAT", seq + zlib.compress(b"\x00" * (1 + 16 * 3) * 2))  # 2 of 12 rows
    short = _rebuild(chunks)
    assert short_image_data(short) == ("corrupt image data: the PNG's frame 2 holds 98 of the "
                                       "588 bytes of pixel rows its header declares")
    with pytest.raises(ImageRejected, match="frame 2"):
        decode_views(short)


def test_every_bundled_png_passes(sample_paths: list[Path]) -> None:
    pngs = [p for p in sample_paths if p.read_bytes()[:8] == SIGNATURE]
    assert pngs, "no PNG among the samples"
    for p in pngs:
        assert short_image_data(p.read_bytes()) is None, p.name
