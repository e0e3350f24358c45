"""How fast Pillow decodes the bench's JPEGs on this machine, per thread and with N threads in
one process and in N processes: is CPU decoding bounded by the cores, by one process's GIL, or
by the build? Prints one JSON line (and writes it under --out)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, write
from bench.corpus import jpeg_photos


def decode_crop(data: bytes) -> int:
    """What CPU preprocessing does per image (decode, resize, crop; no JPEG round trip)."""
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    return int(crop_pixels(decode_image(data), jpeg_roundtrip=False)[0, 0, 0])


def _plain(data: bytes) -> int:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return im.size[0]


def rate(pool: Executor, fn: Callable[[bytes], object], photos: list[bytes]) -> int:
    """Images/s of ``fn`` over ``photos`` on ``pool`` (after a warm-up; chunks matter only to
    process pools)."""
    list(pool.map(fn, photos[:64]))
    t0 = time.perf_counter()
    n = sum(1 for _ in pool.map(fn, photos, chunksize=16))
    return round(n / (time.perf_counter() - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--images", type=int, default=2048)
    args = ap.parse_args()
    import PIL
    from PIL import features

    photos = jpeg_photos(args.images)
    rec: dict[str, object] = {
        "benchmark": "cpu_decode_probe", "env": environment(), "pillow": PIL.__version__,
        "libjpeg_turbo": features.check_feature("libjpeg_turbo"),
        "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
        "cpu_max": Path("/sys/fs/cgroup/cpu.max").read_text().strip()
        if Path("/sys/fs/cgroup/cpu.max").exists() else None,
        "mean_jpeg_bytes": round(sum(map(len, photos)) / len(photos))}
    threads: dict[str, dict[int, int]] = {"decode_crop": {}, "decode_only": {}}
    for n in (1, 2, 4, 8, 16):
        for name, fn in (("decode_crop", decode_crop), ("decode_only", _plain)):
            with ThreadPoolExecutor(n) as ex:
                threads[name][n] = rate(ex, fn, photos)
    rec["threads_img_s"] = threads
    procs: dict[int, int] = {}
    for n in (1, 4, 16):
        with ProcessPoolExecutor(n) as ex:
            procs[n] = rate(ex, decode_crop, photos)
    rec["processes_img_s"] = procs
    print(json.dumps(rec), flush=True)
    if args.out is not None:
        print("wrote", write("cpu-decode-probe", rec, args.out))


if __name__ == "__main__":
    main()
