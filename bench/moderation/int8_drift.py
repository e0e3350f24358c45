"""How far the CPU int8 engine's open_nsfw scores move from fp32, and which verdicts flip.

There is no labelled NSFW set here, and the bundled photos all score near 0, where a drift
cannot flip a verdict. So besides the photos (and variants of them: crops, flips, rotations,
brightness, contrast, JPEG quality), this pushes inputs across the whole score range: starting
from the photos' rows, a few signed-gradient steps on the float32 torch network (built from the
same ONNX weights) move each row toward a target nsfw score (0.2, 0.5, 0.8, 0.95), staying on
the uint8 pixel grid. These are synthetic inputs, not images a person would send; they say how
the int8 engine behaves near the policy thresholds (review 0.2, block 0.8 by default), where
its drift matters.

Both engines are built the way the worker builds them (``EnginePlan`` with the onnxruntime
backend; int8 calibrated on the bundled photos, the worker's fallback) and score every row in
the same batches. Reported: |int8 - fp32| of the nsfw score (median, p99, max) overall and per
fp32 score band, and the verdicts that differ at the default thresholds.

python bench/moderation/int8_drift.py [--steps 25] [--variants 24] [--out DIR]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
from PIL import Image, ImageEnhance

from bench.common import environment, write

REVIEW, BLOCK = 0.2, 0.8  # worker.config.model's defaults
TARGETS = (0.2, 0.5, 0.8, 0.95)
MEAN_BGR = np.array([104.0, 117.0, 123.0], np.float32)


def photo_rows(variants: int, seed: int) -> np.ndarray:
    """The bundled photos as the worker preprocesses them, and ``variants`` random variants of
    each (crop, flip, rotation, brightness, contrast, JPEG quality)."""
    import worker
    from worker.tasks.moderation.images.cpu import decode_views
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    rng = np.random.default_rng(seed)
    rows = []
    for path in sorted((Path(worker.__file__).parent / "samples").iterdir()):
        if path.suffix.lower() not in (".jpg", ".png", ".webp"):
            continue
        for view in decode_views(path.read_bytes()):
            rows.append(preprocess_open_nsfw(view))
            for _ in range(variants):
                rows.append(preprocess_open_nsfw(_variant(view, rng)))
    return np.stack(rows)


def _variant(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    w, h = img.size
    scale = rng.uniform(0.5, 1.0)
    cw, ch = max(32, int(w * scale)), max(32, int(h * scale))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out = img.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out = out.rotate(float(rng.choice([0, 90, 180, 270])), expand=True)
    out = ImageEnhance.Brightness(out).enhance(rng.uniform(0.6, 1.4))
    out = ImageEnhance.Contrast(out).enhance(rng.uniform(0.6, 1.4))
    buf = io.BytesIO()
    out.convert("RGB").save(buf, format="JPEG", quality=int(rng.integers(40, 96)))
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def pushed_rows(start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows moved toward each target nsfw score by signed-gradient steps of one pixel level on
    the float32 torch network; (rows, the target of each)."""
    import torch

    from engines.models.open_nsfw import open_nsfw_spec
    from engines.models.open_nsfw.net import build_module

    torch.manual_seed(0)
    net = build_module(open_nsfw_spec().onnx().data).float().eval()
    mean = torch.from_numpy(MEAN_BGR)
    out, targets = [], []
    for target in TARGETS:
        x = torch.from_numpy(start.copy())
        for _ in range(steps):
            x.requires_grad_(True)
            p = net(x)[:, 1]  # the network ends with its softmax, as the ONNX graph does
            loss = ((p - target) ** 2).sum()
            (grad,) = torch.autograd.grad(loss, x)
            with torch.no_grad():
                # One level per step, back onto the uint8 grid (pixels = row + mean).
                pixels = (x + mean - grad.sign()).round().clamp(0, 255)
                x = pixels - mean
        out.append(x.detach().numpy())
        targets += [target] * len(start)
    return np.concatenate(out), np.array(targets)


def runners(cache: Path) -> dict[str, Any]:
    """Both engines exactly as the worker plans them (int8 on its fallback calibration)."""
    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw.engine import engine_plan

    return {p: engine_plan(load_config(model={"precision": p}, engines={"cache_dir": cache},
                                       log={"level": "WARNING"})).runner()
            for p in ("fp32", "int8")}


def scores(runner: Any, rows: np.ndarray, batch: int = 16) -> np.ndarray:
    name = runner.spec.inputs[0].name
    got = [runner.infer({name: rows[i:i + batch]}).result() for i in range(0, len(rows), batch)]
    key = runner.spec.outputs[0].name
    return np.concatenate([g[key] for g in got])[:, 1]


def verdict(p: np.ndarray) -> np.ndarray:
    return np.where(p >= BLOCK, 2, np.where(p >= REVIEW, 1, 0))


def summary(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    d = np.abs(a - b)
    return {"rows": len(d), "median": float(np.median(d)) if len(d) else None,
            "p99": float(np.quantile(d, 0.99)) if len(d) else None,
            "max": float(d.max()) if len(d) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--variants", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    photos = photo_rows(args.variants, args.seed)
    originals = photo_rows(0, args.seed)
    pushed, targets = pushed_rows(originals, args.steps)
    with tempfile.TemporaryDirectory() as cache:
        rs = runners(Path(cache))
        for r in rs.values():
            r.activate()
        try:
            got = {k: {"photos": scores(r, photos), "pushed": scores(r, pushed)}
                   for k, r in rs.items()}
        finally:
            for r in rs.values():
                r.deactivate()
    fp32 = np.concatenate([got["fp32"]["photos"], got["fp32"]["pushed"]])
    int8 = np.concatenate([got["int8"]["photos"], got["int8"]["pushed"]])
    bands = {f"{lo:.2f}-{hi:.2f}": (lo, hi)
             for lo, hi in ((0, 0.1), (0.1, 0.3), (0.3, 0.7), (0.7, 0.9), (0.9, 1.01))}
    flips = np.nonzero(verdict(fp32) != verdict(int8))[0]
    record = {
        "bench": "int8-drift", "env": environment(),
        "params": {"steps": args.steps, "variants": args.variants, "seed": args.seed,
                   "targets": TARGETS, "thresholds": {"review": REVIEW, "block": BLOCK},
                   "calibration": "the bundled sample photos (the worker's fallback)"},
        "photos": summary(got["fp32"]["photos"], got["int8"]["photos"]),
        "pushed": summary(got["fp32"]["pushed"], got["int8"]["pushed"]),
        "pushed_fp32_scores": {str(t): [float(x) for x in np.quantile(
            got["fp32"]["pushed"][targets == t], [0, 0.5, 1])] for t in TARGETS},
        "by_fp32_band": {k: summary(fp32[(fp32 >= lo) & (fp32 < hi)],
                                    int8[(fp32 >= lo) & (fp32 < hi)])
                         for k, (lo, hi) in bands.items()},
        "verdict_flips": {"count": len(flips), "of": len(fp32),
                          "examples": [{"fp32": float(fp32[i]), "int8": float(int8[i])}
                                       for i in flips[:20]]},
    }
    print(f"photos: {record['photos']}")
    print(f"pushed: {record['pushed']}")
    by_band: dict[str, Any] = record["by_fp32_band"]  # type: ignore[assignment]
    for band, s in by_band.items():
        print(f"fp32 nsfw in {band}: {s}")
    print(f"verdict flips at review {REVIEW} / block {BLOCK}: {len(flips)} of {len(fp32)}")
    print("wrote", write("int8-drift", record, args.out))


if __name__ == "__main__":
    main()
