"""How far DCT-domain scaling (``decode_views(..., draft_side=256)``: libjpeg decodes a JPEG
at 1/2, 1/4 or 1/8 scale before the resize to 256) moves open_nsfw's scores from a full decode,
and how much decode + resize time it saves.

Inputs, every one scored both ways with the real open_nsfw weights through the worker's own
CPU engine (``engine_plan``, onnxruntime fp32), each image's worst view as the worker scores:

- ``frames``: the HD frame corpus (bench/frames.py): thumbnails, 720p, 1080p and 4K stills at
  JPEG quality 75/85/95, from real photographs;
- ``int8_drift_photos``: the inputs of bench/int8_drift.py (the bundled photos and random
  variants of them: crop, flip, rotation, brightness, contrast, JPEG quality), as JPEG bytes;
  at 384 pixels or less they are below twice the resize target, so scaling must leave them
  untouched (a check that it does);
- ``pushed_hd``: bench/int8_drift.py's rows pushed toward nsfw 0.2/0.5/0.8/0.95 by signed
  gradient steps, scaled up to 1920x1080 and saved as JPEG quality 95: HD inputs whose scores
  are spread over the thresholds, where a drift can flip a verdict. Synthetic, not images a
  person would send.

Reported per set: |delta nsfw| (median, p99, max) and the verdicts that differ at the default
thresholds (review 0.2, block 0.8); per frame class: median decode + resize ms both ways.

``--draft-precision int8``: the scaled side runs on the int8 CPU engine (both opt-ins at once)
against the default (fp32, full decode).

python bench/draft_drift.py [--variants 24] [--steps 25] [--draft-precision int8] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
import io
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from PIL import Image, ImageEnhance

from bench import frames as frame_corpus
from bench.common import environment, write


def _int8_drift() -> Any:
    """bench/int8_drift.py, in its folder (bench/moderation/) or where it was before."""
    try:
        return importlib.import_module("bench.moderation.int8_drift")
    except ModuleNotFoundError:
        return importlib.import_module("bench.int8_drift")


_drift = _int8_drift()
BLOCK, REVIEW = _drift.BLOCK, _drift.REVIEW
photo_rows, pushed_rows, scores = _drift.photo_rows, _drift.pushed_rows, _drift.scores
summary, verdict = _drift.summary, _drift.verdict

DRAFT_SIDE = 256  # worker.tasks.moderation.models.open_nsfw.preprocess.RESIZE


def int8_drift_photos(variants: int, seed: int) -> list[bytes]:
    """bench/int8_drift.py's photo inputs as the bytes a job would carry: the bundled photos as
    shipped and ``variants`` random variants of each, JPEG-encoded at quality 40-95."""
    import worker
    from worker.tasks.moderation.images.cpu import decode_views

    rng = np.random.default_rng(seed)
    out = []
    for path in sorted((Path(worker.__file__).parent / "samples").iterdir()):
        if path.suffix.lower() not in (".jpg", ".png", ".webp"):
            continue
        data = path.read_bytes()
        out.append(data)
        view = decode_views(data)[0]
        for _ in range(variants):
            w, h = view.size
            scale = rng.uniform(0.5, 1.0)
            cw, ch = max(32, int(w * scale)), max(32, int(h * scale))
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            img = view.crop((x, y, x + cw, y + ch))
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            img = img.rotate(float(rng.choice([0, 90, 180, 270])), expand=True)
            img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.6, 1.4))
            img = ImageEnhance.Contrast(img).enhance(rng.uniform(0.6, 1.4))
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="JPEG", quality=int(rng.integers(40, 96)))
            out.append(buf.getvalue())
    return out


def pushed_hd(steps: int, seed: int) -> tuple[list[bytes], list[float]]:
    """int8_drift's pushed rows as 1080p JPEGs (quality 95), and each one's target score."""
    rows, targets = pushed_rows(photo_rows(0, seed), steps)
    out = []
    for row in rows:
        rgb = np.clip(row + np.array([104.0, 117.0, 123.0], np.float32), 0, 255)[..., ::-1]
        img = Image.fromarray(np.ascontiguousarray(rgb).round().astype(np.uint8), "RGB")
        buf = io.BytesIO()
        img.resize((1920, 1080), Image.Resampling.BICUBIC).save(buf, format="JPEG", quality=95)
        out.append(buf.getvalue())
    return out, [float(t) for t in targets]


def rows_of(data: bytes, draft_side: int | None) -> np.ndarray:
    from worker.tasks.moderation.images.cpu import decode_views
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    return np.stack([preprocess_open_nsfw(v)
                     for v in decode_views(data, draft_side=draft_side)])


def worst(runner: Any, images: list[bytes], draft_side: int | None) -> np.ndarray:
    """Each image's worst nsfw score over its views, as the worker scores a job."""
    per = [rows_of(d, draft_side) for d in images]
    flat = scores(runner, np.concatenate(per))
    bounds = np.cumsum([0] + [len(p) for p in per])
    return np.array([flat[a:b].max() for a, b in itertools.pairwise(bounds)])


def decode_ms(images: list[bytes], draft_side: int | None, repeat: int = 3) -> float:
    """Median ms per image of decode + resize + crop (no JPEG round trip), best of ``repeat``."""
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    per = []
    for data in images:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            crop_pixels(decode_image(data, draft_side=draft_side), jpeg_roundtrip=False)
            best = min(best, time.perf_counter() - t0)
        per.append(best)
    return round(float(np.median(per)) * 1e3, 2)


def compare(full: np.ndarray, draft: np.ndarray) -> dict[str, Any]:
    flips = np.nonzero(verdict(full) != verdict(draft))[0]
    return {"abs_delta_nsfw": summary(full, draft),
            "full_nsfw_range": [float(full.min()), float(full.max())],
            "verdict_flips": {"count": len(flips), "of": len(full),
                              "examples": [{"full": float(full[i]), "draft": float(draft[i])}
                                           for i in flips[:20]]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=24)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-side", type=int, default=DRAFT_SIDE,
                    help="the least side libjpeg may scale to (256: the resize target; 512 "
                         "keeps twice its pixels, a smaller scale for HD frames)")
    ap.add_argument("--draft-precision", choices=("fp32", "int8"), default="fp32",
                    help="the scaled side's engine precision (the full side's is fp32)")
    ap.add_argument("--cache", type=Path, default=frame_corpus.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    manifest = frame_corpus.build(args.cache)
    sets: dict[str, list[bytes]] = {}
    for name, meta in manifest["sets"].items():
        sets[f"frames/{name}"] = frame_corpus.load(meta["class"], meta["quality"], args.cache)
    sets["int8_drift_photos"] = int8_drift_photos(args.variants, args.seed)
    sets["pushed_hd"], targets = pushed_hd(args.steps, args.seed)

    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw.engine import engine_plan

    got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as cache:
        def runner_of(precision: str) -> Any:
            r = engine_plan(load_config(model={"precision": precision},
                                        engines={"cache_dir": cache},
                                        log={"level": "WARNING"})).runner()
            r.activate()
            return r

        full = runner_of("fp32")
        scaled = full if args.draft_precision == "fp32" else runner_of(args.draft_precision)
        try:
            for name, images in sets.items():
                got[name] = (worst(full, images, None), worst(scaled, images, args.draft_side))
                print(f"{name}: {compare(*got[name])['abs_delta_nsfw']}", flush=True)
        finally:
            full.deactivate()
            if scaled is not full:
                scaled.deactivate()
    frames_all = [np.concatenate([got[k][i] for k in got if k.startswith("frames/")])
                  for i in (0, 1)]
    everything = [np.concatenate([g[i] for g in got.values()]) for i in (0, 1)]
    timing = {}
    for cls in frame_corpus.CLASSES:
        images = frame_corpus.load(cls, 85, args.cache)[:24]
        timing[cls] = {"full_ms": decode_ms(images, None),
                       "draft_ms": decode_ms(images, args.draft_side)}
    record: dict[str, Any] = {
        "bench": "draft-drift", "env": environment(),
        "params": {"draft_side": args.draft_side, "variants": args.variants, "steps": args.steps,
                   "seed": args.seed, "thresholds": {"review": REVIEW, "block": BLOCK},
                   "engine": "worker engine_plan, onnxruntime, real open_nsfw weights: fp32 "
                             f"for the full decode, {args.draft_precision} for the scaled one",
                   "draft_precision": args.draft_precision,
                   "preprocess": "decode_views + preprocess_open_nsfw (JPEG round trip on), "
                                 "worst view per image",
                   "pushed_targets": sorted(set(targets))},
        "frames_manifest": manifest,
        "sets": {k: compare(*v) for k, v in got.items()},
        "all_frames": compare(*frames_all),
        "all": compare(*everything),
        "decode_resize_ms_q85_median": timing,
        "machine_shared": "2-core VM shared with other engineers: timings are noisy",
    }
    print(f"all frames: {record['all_frames']['abs_delta_nsfw']}, flips "
          f"{record['all_frames']['verdict_flips']['count']}")
    print(f"all inputs: {record['all']['abs_delta_nsfw']}, flips "
          f"{record['all']['verdict_flips']['count']} of {len(everything[0])}")
    print(f"decode+resize ms (q85 median): {timing}")
    print("wrote", write("draft-drift", record, args.out))


if __name__ == "__main__":
    main()
