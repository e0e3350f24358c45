"""Shared inputs for runner conformance: real sample photos plus varied synthetic images.

Random noise alone is a poor probe (open_nsfw scores it ~0.999 sfw whatever the runner), so the
synthetic images are shaded skin-toned shapes, which move the scores across the whole range;
every input goes through the real preprocessing.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from worker.bundled import samples_dir
from worker.tasks.moderation.images.cpu import decode_image, preprocess_open_nsfw


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


def _synthetic(seed: int, n: int) -> list[np.ndarray]:
    return [preprocess_open_nsfw(decode_image(b)) for b in synthetic_images(seed, n)]


def conformance_batch(n_synthetic: int = 24, seed: int = 11) -> np.ndarray:
    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    real = [preprocess_open_nsfw(decode_image(p.read_bytes())) for p in files]
    return np.stack(real + _synthetic(seed, n_synthetic)).astype(np.float32)
