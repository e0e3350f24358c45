"""DCT-domain scaling (decode_views(..., draft_side=...)): libjpeg decodes a large JPEG at 1/2,
1/4 or 1/8 size, never below the resize target on either side, and the image is otherwise the
one a full decode shows (orientation, grey, CMYK, other formats untouched)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from worker.tasks.moderation.images.cpu import decode_image, decode_views
from worker.tasks.moderation.models.open_nsfw.preprocess import RESIZE


def _save(img: Image.Image, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _quadrants(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right white (so a rotation or
    a flip shows), converted to ``mode``."""
    w, h = size
    img = Image.new("RGB", size, (255, 255, 255))
    img.paste((255, 0, 0), (0, 0, w // 2, h // 2))
    img.paste((0, 255, 0), (w // 2, 0, w, h // 2))
    img.paste((0, 0, 255), (0, h // 2, w // 2, h))
    return img.convert(mode)


def _small(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR), np.int16)


@pytest.mark.parametrize(("size", "scale"), [
    ((1920, 1080), 4),  # 1080p: 480x270 (1/8 would be 240x135, under 256)
    ((1280, 720), 2),   # 720p: 640x360
    ((3840, 2160), 8),  # 4K: 480x270
    ((2048, 2048), 8),  # exactly 256 at 1/8
    ((2047, 2047), 4),  # one pixel short of 1/8
    ((1080, 1920), 4),  # portrait
    ((4000, 300), 1),   # the short side is what bounds it
    ((511, 511), 1),    # under twice the target: decoded as is
    ((256, 256), 1),
])
def test_smallest_scale_that_stays_at_or_above_the_target(size: tuple[int, int],
                                                           scale: int) -> None:
    data = _save(_quadrants(size), quality=90)
    full = decode_image(data)
    drafted = decode_image(data, draft_side=RESIZE)
    assert full.size == size
    assert drafted.size == (-(-size[0] // scale), -(-size[1] // scale))
    assert min(drafted.size) >= RESIZE
    assert drafted.mode == "RGB"
    # the same picture, only smaller
    assert np.abs(_small(drafted) - _small(full)).max() <= 24


def test_without_draft_side_the_full_size_is_decoded() -> None:
    data = _save(_quadrants((1920, 1080)))
    assert decode_views(data)[0].size == (1920, 1080)
    assert decode_views(data, draft_side=None)[0].size == (1920, 1080)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_kept(orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _save(_quadrants((1920, 1080)), quality=95, exif=exif.tobytes())
    full = decode_image(data)
    drafted = decode_image(data, draft_side=RESIZE)
    turned = orientation in (6, 8)
    assert full.size == ((1080, 1920) if turned else (1920, 1080))
    assert drafted.size == ((270, 480) if turned else (480, 270))
    assert np.abs(_small(drafted) - _small(full)).max() <= 24
    # and not the stored orientation
    assert np.abs(_small(drafted) - _small(_quadrants((1920, 1080)))).max() > 100


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_grey_and_cmyk_jpegs_decode_as_a_full_decode_shows_them(mode: str) -> None:
    data = _save(_quadrants((1920, 1080), mode), quality=95)
    with Image.open(io.BytesIO(data)) as stored:
        assert stored.mode == mode
    full = decode_image(data)
    drafted = decode_image(data, draft_side=RESIZE)
    assert drafted.size == (480, 270)
    assert drafted.mode == full.mode == "RGB"
    assert np.abs(_small(drafted) - _small(full)).max() <= 24


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_other_formats_are_decoded_at_full_size(fmt: str) -> None:
    data = _save(_quadrants((1920, 1080)), fmt)
    assert decode_image(data, draft_side=RESIZE).size == (1920, 1080)

