"""A PNG (or APNG frame) with fewer pixel rows than its header declares is refused before it is
decoded: Pillow would show the missing rows black (worker/tasks/moderation/images/png_rows.py)."""

from __future__ import annotations

import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import decode_views
from worker.tasks.moderation.images.png_rows import (
    SIGNATURE,
    expected_bytes,
    short_image_data,
)


def _png(width: int, height: int, raw: bytes, *, interlace: int = 0, colour: int = 2,
         depth: int = 8) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    return (SIGNATURE + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw))
            + png_chunk(b"IEND", b""))


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, i = [], len(SIGNATURE)
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        out.append((data[i + 4:i + 8], data[i + 8:i + 8 + n]))
        i += 12 + n
    return out


def _rebuild(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return SIGNATURE + b"".join(png_chunk(k, b) for k, b in chunks)


# The spec's Adam7 table, written out again on purpose: taking the module's would let a wrong
# table agree with itself.
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


# --- what Pillow decodes whole must pass; nothing past the declared rows is inflated ----------

_W, _H = 8, 4
_RAW = b"".join(b"\x00" + bytes(range(_W * 3)) for _ in range(_H))


def _ihdr(w: int = _W, h: int = _H, depth: int = 8, colour: int = 2) -> bytes:
    return png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0))


def _fctl(seq: int, w: int, h: int, x: int = 0, y: int = 0) -> bytes:
    return png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", seq, w, h, x, y, 1, 10, 0, 0))


def _actl(frames: int) -> bytes:
    return png_chunk(b"acTL", struct.pack(">II", frames, 0))


def _idat(raw: bytes = _RAW) -> bytes:
    return png_chunk(b"IDAT", zlib.compress(raw))


_IEND = png_chunk(b"IEND", b"")

PILLOW_DECODES_WHOLE = {
    "a chunk before IHDR": SIGNATURE + png_chunk(b"tEXt", b"a\x00b") + _ihdr() + _idat() + _IEND,
    # An fcTL before IDAT: Pillow decodes the default image at the fcTL's size.
    "frame 0 smaller than the canvas": SIGNATURE + _ihdr() + _actl(1) + _fctl(0, _W, 2)
    + _idat(_RAW[:2 * 25]) + _IEND,
    "an empty IDAT after another chunk": SIGNATURE + _ihdr() + _idat()
    + png_chunk(b"tEXt", b"a\x00b") + png_chunk(b"IDAT", b"") + _IEND,
    "a frame past acTL's count": SIGNATURE + _ihdr() + _actl(1) + _fctl(0, _W, _H) + _idat()
    + _fctl(1, _W, _H) + png_chunk(b"fdAT", struct.pack(">I", 2) + zlib.compress(_RAW[:10]))
    + _IEND,
    "a frame at an offset": SIGNATURE + _ihdr() + _actl(2) + _fctl(0, _W, _H) + _idat()
    + _fctl(1, 4, 2, 4, 2) + png_chunk(b"fdAT", struct.pack(">I", 2)
                                    + zlib.compress(bytes(13) * 2)) + _IEND,
    # The rows are whole; the adler32 after them is wrong: Pillow never reads that far.
    "an error after the rows": SIGNATURE + _ihdr() + png_chunk(
        b"IDAT", zlib.compress(_RAW + bytes(4000))[:-4] + b"\x00\x00\x00\x00") + _IEND,
}


@pytest.mark.parametrize("case", sorted(PILLOW_DECODES_WHOLE))
def test_what_pillow_decodes_whole_passes(case: str) -> None:
    data = PILLOW_DECODES_WHOLE[case]
    img = Image.open(io.BytesIO(data))
    img.load()  # Pillow reads it without an error
    assert short_image_data(data) is None
    assert decode_views(data)


def test_rows_held_back_by_the_output_cap_are_counted() -> None:
    # 16-bit RGBA, 8 rows of 1 + 8 * 16384 bytes: 1 MiB + 8, one cap's worth and a little more,
    # in a stream that ends without its adler32 (the rows are all there; Pillow decodes it).
    w, h = 16384, 8
    raw = bytes(h * (1 + 8 * w))
    assert len(raw) == expected_bytes(w, h, 64, interlaced=False) == (1 << 20) + 8
    data = SIGNATURE + _ihdr(w, h, 16, 6) + png_chunk(
        b"IDAT", zlib.compress(raw, 9)[:-4]) + _IEND
    Image.open(io.BytesIO(data)).load()
    assert short_image_data(data) is None


def test_a_frame_larger_than_its_canvas_is_refused_without_inflating_it() -> None:
    # A 1x1 APNG whose second frame declares 60000x60000 and carries 256 MiB of zeros in a
    # few hundred KB: Pillow refuses it at once; the check must not inflate it first.
    zeros = zlib.compressobj(9)
    blob = b"".join(zeros.compress(bytes(1 << 24)) for _ in range(16)) + zeros.flush()
    data = (SIGNATURE + _ihdr(1, 1) + _actl(2) + _fctl(0, 1, 1) + _idat(b"\x00\x01\x02\x03")
            + _fctl(1, 60_000, 60_000) + png_chunk(b"fdAT", struct.pack(">I", 2) + blob) + _IEND)
    started = time.perf_counter()
    reason = short_image_data(data)
    assert time.perf_counter() - started < 0.5
    assert reason is not None and "outside its 1x1 canvas" in reason
    with pytest.raises(ImageRejected, match="corrupt image data"):
        decode_views(data)
