"""The peer's decode stage: NVIDIA DALI's own image decoder on the HD frame corpus
(bench/frames.py), as a user who assembles the pipeline from NVIDIA's parts would run it, beside
the project's stages (bench/moderation/frames_gpu.py, whose ``dali_*`` columns configure
nvImageCodec as DALI does and stood in while DALI's wheel was not carried to the GPU machine).

Per class: a DALI pipeline fed batches of encoded frames from Python (``fn.external_source``,
the way frames arrive from Kafka), ``fn.decoders.image`` (``--device mixed``: the hardware JPEG
engines for part of each batch, CUDA for the rest, DALI's defaults; ``cpu``: libjpeg-turbo,
any machine) and, for ``dali_prep``, open_nsfw's geometry as the worker computes it: bilinear
with antialiasing to 256x256, centre crop 224 (``fn.resize`` + ``fn.crop``). Images/s over
``--iters`` batches after a warm-up, ``--reps`` times (every rate kept, with the median).
Parity: DALI's 224x224 rows against the worker's CPU path (Pillow) on 16 frames.

    python bench/moderation/dali_stage.py --cache /tmp/frames --out DIR       (GPU machine)
    python bench/moderation/dali_stage.py --device cpu --classes thumb --iters 4  (a smoke run)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import frames as frame_corpus
from bench.common import environment, write

RESIZE, CROP = 256, 224
PARITY_FRAMES = 16


def batches(frames: list[bytes], batch: int) -> Iterator[list[Any]]:
    """Endless batches of ``batch`` encoded frames (uint8 arrays), cycling through ``frames``
    so that consecutive batches hold different frames."""
    import numpy as np

    arrays = [np.frombuffer(f, dtype=np.uint8) for f in frames]
    i = 0
    while True:
        yield [arrays[(i + j) % len(arrays)] for j in range(batch)]
        i = (i + batch) % len(arrays)


def pipeline(source: Callable[[], list[Any]], batch: int, threads: int, device: str,
             prep: bool) -> Any:
    """A built DALI pipeline: ``source`` -> decode (-> resize 256 -> crop 224), RGB HWC uint8."""
    from nvidia.dali import fn, pipeline_def, types

    def graph() -> Any:
        jpegs = fn.external_source(source=source, dtype=types.UINT8, no_copy=False)
        images = fn.decoders.image(jpegs, device=device, output_type=types.RGB)
        if prep:
            images = fn.resize(images, resize_x=RESIZE, resize_y=RESIZE,
                               interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.crop(images, crop=(CROP, CROP), out_of_bounds_policy="error")
        return images

    build = pipeline_def(batch_size=batch, num_threads=threads,
                         device_id=0 if device == "mixed" else None,
                         prefetch_queue_depth=2)(graph)
    pipe = build()
    pipe.build()
    return pipe


def rate(frames: list[bytes], batch: int, threads: int, device: str, prep: bool, iters: int,
         reps: int) -> dict[str, Any]:
    """Images/s of the pipeline over ``iters`` batches, ``reps`` times after one warm-up pass;
    the clock stops when the last batch is on the host (CPU) or ready on the device (mixed)."""
    feed = batches(frames, batch)
    pipe = pipeline(lambda: next(feed), batch, threads, device, prep)
    try:
        for _ in range(min(iters, 4)):  # warm: decoders, kernels, buffers
            _wait(pipe.run())
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(iters):
                out = pipe.run()
            _wait(out)
            rates.append(round(iters * batch / (time.perf_counter() - t0)))
        return {"median": statistics.median(rates), "rates": rates, "threads": threads,
                "batch": batch, "iters": iters}
    finally:
        del pipe


def _wait(outputs: Any) -> None:
    """Block until a run's output exists where it lives (a GPU TensorList: its stream done)."""
    (images,) = outputs
    if hasattr(images, "as_cpu"):
        images.as_cpu()  # copies and synchronises: the device work of the batch is done


def parity(frames: list[bytes], device: str) -> dict[str, Any]:
    """DALI's prep rows against the worker's CPU path (decode_image + crop_pixels)."""
    import numpy as np

    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    sample = frames[:PARITY_FRAMES]
    it = iter([[np.frombuffer(f, dtype=np.uint8) for f in sample]])
    pipe = pipeline(lambda: next(it), len(sample), 2, device, prep=True)
    (images,) = pipe.run()
    if hasattr(images, "as_cpu"):
        images = images.as_cpu()
    diffs = []
    for k, data in enumerate(sample):
        ours = crop_pixels(decode_image(data), jpeg_roundtrip=False).astype(np.int16)
        theirs = np.asarray(images.at(k)).astype(np.int16)
        diffs.append(np.abs(ours - theirs))
    d = np.stack(diffs)
    return {"frames": len(sample), "max_abs": int(d.max()), "mean_abs": round(float(d.mean()), 3),
            "p99_abs": float(np.percentile(d, 99))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="thumb,720p,1080p")
    ap.add_argument("--quality", type=int, default=85)
    ap.add_argument("--device", choices=("mixed", "cpu"), default="mixed")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=4, help="DALI's CPU threads")
    ap.add_argument("--iters", type=int, default=16, help="batches per timed pass")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=frame_corpus.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    record: dict[str, Any] = {"benchmark": "dali_stage", "env": environment(),
                              "params": {k: str(v) for k, v in vars(args).items()},
                              "frames_manifest": frame_corpus.build(args.cache), "classes": {}}
    for cls in args.classes.split(","):
        frames = frame_corpus.load(cls, args.quality, args.cache)
        c: dict[str, Any] = {"frames": frame_corpus.stream_record(frames)}
        print(f"{cls}: {c['frames']}", flush=True)
        for name, prep in (("dali_decode", False), ("dali_prep", True)):
            c[name] = rate(frames, args.batch, args.threads, args.device, prep, args.iters,
                           args.reps)
            print(f"  {name}: {c[name]}", flush=True)
        c["parity"] = parity(frames, args.device)
        print(f"  parity: {c['parity']}", flush=True)
        record["classes"][cls] = c
    path = write(f"dali-stage-{args.device}", record, args.out)
    print("wrote", path, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
