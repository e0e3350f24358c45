"""decode_views: an image as a person may see it (issue: moderation bypasses).

Each case builds its own image. Before decode_views, every case here was scored on one view:
the stored orientation, alpha dropped (RGB of a transparent picture), the first frame (or an
APNG's hidden default image), 16-bit grey clipped to white.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from worker.exceptions import ImageRejected
from worker.tasks.moderation.images import cpu
from worker.tasks.moderation.images.cpu import decode_image, decode_views, jpeg_plain


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _tall_marker() -> Image.Image:
    """40 wide, 20 high; the left half red, the right half blue."""
    img = Image.new("RGB", (40, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 20, 20))
    return img


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_is_applied(fmt: str) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown turned 90 degrees clockwise
    data = _save(_tall_marker(), fmt, exif=exif.tobytes(), **({"quality": 95}
                                                             if fmt == "JPEG" else {}))
    (view,) = decode_views(data)
    assert view.size == (20, 40)
    assert decode_image(data).size == (20, 40)  # (before: the stored 40x20)
    top, bottom = np.asarray(view)[2, 10], np.asarray(view)[37, 10]
    assert top[0] > 200 and top[2] < 60  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 60


def test_alpha_drawn_over_black_shows_on_white() -> None:
    # RGB all black; the picture lives in the alpha channel (a white page shows it).
    alpha = Image.new("L", (32, 32), 0)
    alpha.paste(255, (8, 8, 24, 24))
    img = Image.merge("RGBA", (*Image.new("RGB", (32, 32)).split(), alpha))
    on_white, on_black = decode_views(_save(img, "PNG"))
    assert np.asarray(on_white)[0, 0].tolist() == [255, 255, 255]
    assert np.asarray(on_white)[16, 16].tolist() == [0, 0, 0]
    assert np.asarray(on_black).max() == 0
    # An opaque alpha channel is one view.
    assert len(decode_views(_save(Image.new("RGBA", (8, 8), (9, 9, 9, 255)), "PNG"))) == 1


def test_palette_transparency_is_alpha_too() -> None:
    img = Image.new("P", (8, 8), 0)
    img.putpalette([0, 0, 0, 250, 250, 250] + [0] * 762)
    img.paste(1, (0, 0, 4, 8))
    assert len(decode_views(_save(img, "PNG", transparency=0))) == 2


def test_animated_webp_scores_first_last_and_sampled_frames() -> None:
    colours = [(i * 12 % 256, 255 - i * 12 % 256, 40) for i in range(20)]
    frames = [Image.new("RGB", (16, 16), c) for c in colours]
    data = _save(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    views = decode_views(data)
    seen = [tuple(np.asarray(v)[8, 8].tolist()) for v in views]
    assert len(views) == cpu.MAX_SAMPLED_FRAMES
    assert seen[0] == colours[0] and seen[-1] == colours[-1]
    assert len(set(seen)) == cpu.MAX_SAMPLED_FRAMES


def test_apng_default_image_is_never_scored_alone() -> None:
    hidden = Image.new("RGB", (16, 16), (0, 0, 0))
    shown = [Image.new("RGB", (16, 16), (250, 10, 10)), Image.new("RGB", (16, 16), (10, 250, 10))]
    data = _save(hidden, "PNG", save_all=True, append_images=shown, default_image=True)
    seen = [tuple(np.asarray(v)[0, 0].tolist()) for v in decode_views(data)]
    assert (250, 10, 10) in seen and (10, 250, 10) in seen


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    grey = Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16))
    (view,) = decode_views(_save(grey, "PNG"))
    assert np.asarray(view)[0, 0].tolist() == [128, 128, 128]


def test_too_many_frames_is_rejected_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "MAX_FRAMES", 3)
    frames = [Image.new("RGB", (8, 8), (i, i, i)) for i in range(5)]
    data = _save(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    with pytest.raises(ImageRejected, match="5 frames exceeds the maximum 3"):
        decode_views(data)


def test_decode_image_is_the_first_view() -> None:
    alpha = Image.new("L", (4, 4), 0)
    img = Image.merge("RGBA", (*Image.new("RGB", (4, 4)).split(), alpha))
    assert np.asarray(decode_image(_save(img, "PNG")))[0, 0].tolist() == [255, 255, 255]


def test_jpeg_plain_sends_cmyk_and_rotated_jpegs_to_the_views_path() -> None:
    img = _tall_marker()
    rotated, upright = Image.Exif(), Image.Exif()
    rotated[0x0112], upright[0x0112] = 8, 1
    assert jpeg_plain(_save(img, "JPEG"))
    assert jpeg_plain(_save(img, "JPEG", exif=upright.tobytes()))
    assert jpeg_plain(_save(img.convert("L"), "JPEG"))
    assert not jpeg_plain(_save(img, "JPEG", exif=rotated.tobytes()))
    assert not jpeg_plain(_save(img.convert("CMYK"), "JPEG"))
    assert not jpeg_plain(_save(img, "PNG"))
    assert not jpeg_plain(b"\xff\xd8\xff\xe1\x00")  # truncated: the CPU decoder judges it
    whole = _save(img, "JPEG")
    assert not jpeg_plain(whole[: len(whole) * 2 // 3])  # cut in the scan data
