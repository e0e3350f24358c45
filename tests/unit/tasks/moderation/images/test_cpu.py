"""worker.tasks.moderation.images.cpu: guarded decoding."""

from __future__ import annotations

import io
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()



def _png_bomb(width: int, height: int) -> bytes:
    """A real, tiny PNG whose IHDR declares width x height RGB pixels (8 bit)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    # Two rows of zeros (filter byte + pixels) is all the IDAT holds: the file stays tiny.
    idat = zlib.compress(b"\x00" * (1 + 3 * width) * 2, 9)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat)
            + png_chunk(b"IEND", b""))


# --- decoding -----------------------------------------------------------------------------------


def test_every_sample_decodes_to_rgb_at_its_own_size(sample_path: Path) -> None:
    data = sample_path.read_bytes()
    original = Image.open(io.BytesIO(data))
    img = decode_image(data)
    assert img.mode == "RGB"
    assert img.size == original.size


def test_samples_cover_jpeg_png_webp_and_greyscale(sample_paths: list[Path]) -> None:
    seen = {(im.format, im.mode) for im in (Image.open(p) for p in sample_paths)}
    assert {fmt for fmt, _ in seen} == {"JPEG", "PNG", "WEBP"}
    assert ("JPEG", "L") in seen and ("PNG", "L") in seen


@pytest.mark.parametrize("name", ["camera.jpg", "clock.png", "coins.png"])
def test_greyscale_sample_decodes_to_equal_rgb_channels(
    sample_paths: list[Path], name: str
) -> None:
    (path,) = [p for p in sample_paths if p.name == name]
    assert Image.open(path).mode == "L"
    arr = np.asarray(decode_image(path.read_bytes()))
    assert arr.shape[2] == 3
    assert np.array_equal(arr[..., 0], arr[..., 1]) and np.array_equal(arr[..., 1], arr[..., 2])


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("RGBA", "PNG"), ("LA", "PNG"), ("P", "PNG"), ("1", "PNG"), ("I;16", "PNG"),
     ("CMYK", "JPEG"), ("RGBA", "WEBP")],
)
def test_other_pixel_modes_are_converted_to_rgb(mode: str, fmt: str) -> None:
    if mode == "I;16":
        img = Image.fromarray((np.arange(32 * 32, dtype=np.uint16) * 60).reshape(32, 32))
    else:
        img = Image.new(mode, (32, 24), 1 if mode in ("1", "P") else (10,) * len(mode))
    decoded = decode_image(_encode(img, fmt))
    assert decoded.mode == "RGB" and decoded.size == img.size


def test_zero_bytes_are_rejected() -> None:
    with pytest.raises(ImageRejected, match="empty"):
        decode_image(b"")


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_jpeg_is_rejected(sample_paths: list[Path], fraction: float) -> None:
    data = next(p for p in sample_paths if p.suffix == ".jpg").read_bytes()
    with pytest.raises(ImageRejected, match=r"(?i)corrupt|truncated"):
        decode_image(data[: int(len(data) * fraction)])


def test_truncated_sample_of_every_format_is_rejected(sample_path: Path) -> None:
    data = sample_path.read_bytes()
    with pytest.raises(ImageRejected, match="corrupt"):
        decode_image(data[: len(data) // 2])


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_are_rejected(seed: int) -> None:
    with pytest.raises(ImageRejected, match="not a JPEG, PNG or WebP"):
        decode_image(random.Random(seed).randbytes(4096))


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "PPM", "ICO"])
def test_formats_outside_jpeg_png_webp_are_rejected(fmt: str) -> None:
    data = _encode(Image.new("RGB", (16, 16), (200, 10, 10)), fmt)
    assert Image.open(io.BytesIO(data)).format == fmt  # PIL itself would read it
    with pytest.raises(ImageRejected, match="not a JPEG, PNG or WebP"):
        decode_image(data)


def test_png_bomb_declaring_50000x50000_is_rejected_before_decoding() -> None:
    bomb = _png_bomb(50_000, 50_000)
    assert len(bomb) < 1024
    with pytest.raises(ImageRejected, match=r"(?i)bomb|maximum side"):
        decode_image(bomb)


def test_png_bomb_within_max_side_but_over_the_pixel_budget_is_rejected() -> None:
    bomb = _png_bomb(10_000, 10_000)  # sides under 16384, 100 M pixels over the 40 M budget
    assert len(bomb) < 1024
    with pytest.raises(ImageRejected, match="100000000 pixels exceeds the budget 40000000"):
        decode_image(bomb)


def test_hand_built_png_is_a_real_png() -> None:
    """The bomb builder writes valid PNG structure: at a size its IDAT fills, it decodes."""
    img = decode_image(_png_bomb(4, 2))
    assert img.size == (4, 2)
    assert np.asarray(img).max() == 0


def test_png_with_fewer_rows_than_declared_is_rejected() -> None:
    # Pillow decodes it, the missing rows black (worker/tasks/moderation/images/png_rows.py).
    with pytest.raises(ImageRejected, match="corrupt"):
        decode_image(_png_bomb(2000, 2000))  # two rows of data for 2000 declared


@pytest.mark.parametrize("size", [(65, 10), (10, 65)], ids=["wide", "tall"])
def test_image_over_max_side_is_rejected(size: tuple[int, int]) -> None:
    data = _encode(Image.new("RGB", size), "PNG")
    with pytest.raises(ImageRejected, match="exceeds the maximum side 64"):
        decode_image(data, ImageLimits(max_pixels=10**6, max_side=64))


def test_image_at_max_side_is_accepted() -> None:
    data = _encode(Image.new("RGB", (64, 64)), "PNG")
    assert decode_image(data, ImageLimits(max_pixels=64 * 64, max_side=64)).size == (64, 64)


def test_image_over_max_pixels_is_rejected() -> None:
    data = _encode(Image.new("RGB", (50, 40)), "JPEG")
    with pytest.raises(ImageRejected, match="2000 pixels exceeds the budget 1999"):
        decode_image(data, ImageLimits(max_pixels=1999, max_side=1000))


def test_rejections_keep_the_underlying_cause() -> None:
    with pytest.raises(ImageRejected) as info:
        decode_image(b"GIF89a not really")
    assert info.value.__cause__ is not None
    assert info.value.reason == "bad_image"

