"""Malformed images on which Pillow raises more than the errors it documents (found by a fuzzer
over the samples and generated images): each must come out as the record's ImageRejected, never
as another exception that would stop the task. And MPO files show their first picture only."""

from __future__ import annotations

import io
import struct
import time
import zlib

import pytest
from PIL import Image

from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import decode_views, jpeg_dimensions, jpeg_plain


def _saved(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


PNG = _saved(Image.new("RGB", (8, 8), (10, 200, 30)), "PNG")
IEND = png_chunk(b"IEND", b"")


def test_a_cut_interlaced_png_is_rejected_not_a_type_error() -> None:
    # Reading EXIF decoded the pixels once (failing), and the load that followed passed the
    # interlace flag to the decoder twice: TypeError.
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 1))
    data = b"\x89PNG\r\n\x1a\n" + ihdr + png_chunk(b"IDAT", zlib.compress(bytes(1000))[:8]) + IEND
    with pytest.raises(ImageRejected, match="corrupt image data"):
        decode_views(data)


def test_a_short_chunk_after_the_image_data_is_rejected_not_an_index_error() -> None:
    data = PNG[:-len(IEND)] + png_chunk(b"iCCP", b"a\x00") + IEND
    with pytest.raises(ImageRejected, match="corrupt image data: IndexError"):
        decode_views(data)


@pytest.mark.parametrize("fmt", ["WEBP", "PNG"])
def test_a_short_exif_block_is_shown_as_stored(fmt: str) -> None:
    # struct.error from the EXIF parser: viewers ignore such a block, and so does the worker.
    data = _saved(Image.new("RGB", (8, 6)), fmt, exif=b"MM\x00*")
    assert [v.size for v in decode_views(data)] == [(8, 6)]


def _mpo(second: Image.Image) -> bytes:
    return _saved(Image.new("RGB", (16, 12), (200, 0, 0)), "MPO", save_all=True,
                  append_images=[second])


def test_an_mpo_shows_its_first_picture_only() -> None:
    data = _mpo(Image.new("RGB", (16, 12), (0, 0, 200)))
    assert Image.open(io.BytesIO(data)).format == "MPO"
    views = decode_views(data)
    assert len(views) == 1 and views[0].getpixel((8, 6))[0] > 150  # the red first picture


@pytest.mark.parametrize("tail", [b"\xff\xd8\xff\xd9", b"\xff\xd8\xff\xdb"],
                         ids=["empty", "cut"])
def test_an_mpo_with_a_broken_second_picture_shows_its_first(tail: bytes) -> None:
    data = _mpo(Image.new("RGB", (16, 12)))
    second = data.find(b"\xff\xd8", 4)
    assert len(decode_views(data[:second] + tail)) == 1


def test_an_mpo_s_second_picture_cannot_slip_past_the_limits() -> None:
    # Its header declared 20000x8000; only the first picture's header was checked, and the
    # second was decoded at that size.
    data = bytearray(_mpo(Image.new("RGB", (16, 12))))
    sof = data.find(b"\xff\xc0", data.find(b"\xff\xd8", 4))
    data[sof + 5:sof + 9] = struct.pack(">HH", 8000, 20000)
    assert [v.size for v in decode_views(bytes(data))] == [(16, 12)]


@pytest.mark.parametrize("body", [b"\xff" * 20_000_000, b"\xff\xfe\x00\x02" * 5_000_000],
                         ids=["fill bytes", "tiny segments"])
def test_walking_a_jpeg_s_markers_stays_cheap(body: bytes) -> None:
    # 2-4 s of the loop's thread per such record before (a Python step per byte or segment).
    data = b"\xff\xd8" + body + b"\xff\xd9"
    started = time.perf_counter()
    assert jpeg_dimensions(data) is None and jpeg_plain(data) is False
    assert time.perf_counter() - started < 0.5


def test_fill_bytes_before_a_marker_are_still_skipped() -> None:
    jpeg = _saved(Image.new("RGB", (40, 30)), "JPEG")
    padded = jpeg[:2] + b"\xff" * 7 + jpeg[2:]  # fill bytes may precede any marker
    assert jpeg_dimensions(padded) == (40, 30) and jpeg_plain(padded)
