"""Shared inputs for runner conformance: real sample photos plus varied synthetic images.

Random noise alone is a poor probe (open_nsfw scores it ~0.999 sfw whatever the runner), so the
synthetic images are shaded skin-toned shapes, which move the scores across the whole range;
every input goes through the real preprocessing.
"""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image

from worker.bundled import samples_dir
from worker.tasks.moderation.images.cpu import decode_image, jpeg_components
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw


def synthetic_images(seed: int, n: int, fmt: str = "PNG") -> list[bytes]:
    """PNG bytes of skin-toned shaded blobs on dark backgrounds: open_nsfw scores them anywhere
    from ~0.002 to ~0.9, so they separate runners far better than noise does."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:256, 0:256].astype(np.float64)
    out = []
    for _ in range(n):
        skin = np.array([rng.uniform(180, 240), rng.uniform(120, 180), rng.uniform(90, 150)])
        img = np.zeros((256, 256, 3)) + rng.uniform(0, 80, size=3)
        for _ in range(int(rng.integers(1, 4))):
            cy, cx = rng.uniform(40, 216, 2)
            ry, rx = rng.uniform(30, 110, 2)
            d = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
            mask = np.clip(1.2 - d, 0, 1)[..., None]
            shade = (0.7 + 0.3 * np.sqrt(np.clip(1 - d, 0, 1)))[..., None]
            img = img * (1 - mask) + mask * skin * shade
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


def synthetic_photo(seed: int = 5) -> Image.Image:
    """One of :func:`synthetic_images` as an RGB image, having been a JPEG once (its
    artefacts), for tests that re-encode it in several ways."""
    return Image.open(io.BytesIO(synthetic_images(seed, 1, fmt="JPEG")[0])).convert("RGB")


def _synthetic(seed: int, n: int) -> list[np.ndarray]:
    return [preprocess_open_nsfw(decode_image(b)) for b in synthetic_images(seed, n)]


def conformance_batch(n_synthetic: int = 24, seed: int = 11) -> np.ndarray:
    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    real = [preprocess_open_nsfw(decode_image(p.read_bytes())) for p in files]
    return np.stack(real + _synthetic(seed, n_synthetic)).astype(np.float32)


def mutated_jpegs(n: int = 48, seed: int = 7) -> dict[str, bytes]:
    """Complete baseline JPEGs (a grey or YCbCr frame, ending with the end-of-image marker) of one
    photo with 1-4 bytes changed, in the headers (tables, frame, scan) or the entropy-coded
    data, half and half. The CPU decoder refuses about a third of them; which of those nvJPEG
    also refuses is what the parity tests ask (two with a bad DC Huffman table it
    decoded)."""
    buf = io.BytesIO()
    synthetic_photo().save(buf, "JPEG", quality=90)
    base = buf.getvalue()
    scan = base.find(b"\xff\xda")
    rnd = random.Random(seed)
    out: dict[str, bytes] = {}
    while len(out) < n:
        data = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            at = rnd.randrange(2, scan + 12) if rnd.random() < 0.5 else \
                rnd.randrange(scan + 12, len(data) - 2)
            data[at] = rnd.randrange(256)
        if data[-2:] == b"\xff\xd9" and jpeg_components(bytes(data)) in (1, 3):
            out[f"mutated-{len(out)}"] = bytes(data)
    return out
