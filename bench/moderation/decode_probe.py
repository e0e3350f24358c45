"""Does torchvision's CUDA JPEG decode scale with threads? Decodes the bench's JPEGs in batches
of 128 from 1, 2 and 4 threads (each on its own stream) and prints images/s per thread count.

python bench/moderation/decode_probe.py   (GPU machine)
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any


def _photos(n: int) -> list[bytes]:
    """Smooth colour fields with noise, 320x240, quality 85: ~15 KB, like the bench's frames."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320]
    out = []
    for _ in range(n):
        base = np.stack([(xx * rng.uniform(0.2, 0.8) + yy * rng.uniform(0.2, 0.8)) % 256
                         for _ in range(3)], axis=-1)
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(noisy).save(buf, "JPEG", quality=85)
        out.append(buf.getvalue())
    return out


def decode_rate(batches: list[list[Any]], threads: int) -> int:
    """Images/s of torchvision's CUDA decode when ``threads`` threads (one stream each) split
    ``batches`` (lists of JPEG byte tensors) between them."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    def run(mine: list[list[Any]]) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for b in mine:
                decode_jpeg(b, mode=ImageReadMode.RGB, device="cuda")
        stream.synchronize()

    ts = [threading.Thread(target=run, args=(batches[i::threads],)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return round(sum(map(len, batches)) / (time.perf_counter() - t0))


def main() -> None:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    photos = _photos(2048)
    tensors = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in photos]
    batches = [tensors[i:i + 128] for i in range(0, len(tensors), 128)]
    decode_jpeg(batches[0], mode=ImageReadMode.RGB, device="cuda")  # warm
    torch.cuda.synchronize()
    out: dict[str, int] = {}
    for threads in (1, 2, 4):
        # every thread decodes all batches once
        out[f"{threads}_threads_img_s"] = decode_rate(batches * threads, threads)
    out["mean_jpeg_bytes"] = round(sum(map(len, photos)) / len(photos))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
