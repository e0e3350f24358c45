"""Benchmark inputs: ~256x256 JPEG photos made from the bundled sample photos (random crops,
flips and scales), so decoders see real photographic content, never zeros."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from worker.bundled import samples_dir


def jpeg_photos(n: int, seed: int = 0, side: int = 256, quality: int = 90) -> list[bytes]:
    rng = np.random.default_rng(seed)
    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    photos = [Image.open(p).convert("RGB") for p in files]
    out = []
    for i in range(n):
        img = photos[i % len(photos)]
        w, h = img.size
        crop = int(min(w, h) * rng.uniform(0.6, 1.0))
        x0, y0 = int(rng.integers(0, w - crop + 1)), int(rng.integers(0, h - crop + 1))
        tile = img.crop((x0, y0, x0 + crop, y0 + crop)).resize((side, side),
                                                                Image.Resampling.BICUBIC)
        if rng.random() < 0.5:
            tile = ImageOps.mirror(tile)
        buf = io.BytesIO()
        tile.save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out
