"""HD frame corpus from real photographs: thumbnails, 720p and 1080p frames (and 4K stills) at
several JPEG qualities, cached on disk, with a manifest of their sizes.

Source: the 2560x1600 JPEG photographs of Debian's ``plasma-workspace-wallpapers`` package,
fetched once with ``apt-get download`` (``apt-get update`` first when the package index does
not know it) and unpacked with ``dpkg-deb -x`` into the cache; nothing else is downloaded.
Each frame is its own crop (position, scale, photo, mirror) encoded on its own, with a JPEG
comment naming it, so no two frames share bytes or header. 4K stills are 16:9 crops of the
2560x1600 photos scaled up to 3840x2160 (the package has no 4K photographs), so they are
smoother, hence smaller, than a camera's 4K frame; the manifest says so.

Classes: ``thumb`` 256x256, ``720p`` 1280x720, ``1080p`` 1920x1080, ``4k`` 3840x2160; each at
the qualities in :data:`QUALITIES`. :func:`mixed_stream` interleaves 720p frames with an
occasional 4K still. The cache (default ``.cache/frames`` at the repository root, ignored by
git) is rebuilt when its parameters change.

python bench/frames.py [--cache DIR] [--per-class 48]   # build and print the manifest
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO / ".cache" / "frames"
PACKAGE = "plasma-workspace-wallpapers"
SOURCE_GLOB = "usr/share/wallpapers/*/contents/images/2560x1600.jpg"
CLASSES: dict[str, tuple[int, int]] = {"thumb": (256, 256), "720p": (1280, 720),
                                       "1080p": (1920, 1080), "4k": (3840, 2160)}
QUALITIES = (75, 85, 95)
PER_CLASS = 48  # frames per (class, quality); 4K stills: a quarter of that
LAYOUT = 1  # bump when the way frames are made changes: the cache is rebuilt


class CorpusError(RuntimeError):
    """The source package could not be fetched or unpacked."""


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=600)


def source_photos(cache: Path = DEFAULT_CACHE) -> tuple[list[Path], str]:
    """The package's 2560x1600 JPEG photographs (fetched and unpacked once) and the .deb's
    file name (its version)."""
    root = cache / "package"
    found = sorted(root.glob(SOURCE_GLOB))
    debs = sorted((cache / "deb").glob(f"{PACKAGE}_*.deb"))
    if found and debs:
        return found, debs[-1].name
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise CorpusError("apt-get and dpkg-deb are needed to fetch the source photographs")
    (cache / "deb").mkdir(parents=True, exist_ok=True)
    if not debs:
        got = _run(["apt-get", "download", PACKAGE], cache / "deb")
        if got.returncode != 0:  # an empty or stale package index: refresh it once
            _run(["apt-get", "update"], cache / "deb")
            got = _run(["apt-get", "download", PACKAGE], cache / "deb")
        debs = sorted((cache / "deb").glob(f"{PACKAGE}_*.deb"))
        if got.returncode != 0 or not debs:
            raise CorpusError(f"apt-get download {PACKAGE} failed: {got.stderr.strip()[-400:]}")
    root.mkdir(parents=True, exist_ok=True)
    got = _run(["dpkg-deb", "-x", str(debs[-1]), str(root)], cache)
    if got.returncode != 0:
        raise CorpusError(f"dpkg-deb -x failed: {got.stderr.strip()[-400:]}")
    found = sorted(root.glob(SOURCE_GLOB))
    if not found:
        raise CorpusError(f"no {SOURCE_GLOB} in {debs[-1].name}")
    return found, debs[-1].name


def _frame(photo: Image.Image, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A random crop of ``photo`` with ``size``'s aspect, scaled to ``size``, maybe mirrored."""
    w, h = photo.size
    tw, th = size
    aspect = tw / th
    max_w = min(w, h * aspect)
    # Each frame shows a different part at a different scale: thumbnails from a third of the
    # photo's width up to all of it; frames from their own width (no upscaling) up to all of
    # it; 4K stills (larger than the photo) from three quarters of it.
    if tw <= 256:
        lo = w / 3
    elif tw <= max_w:
        lo = float(tw)
    else:
        lo = 0.75 * max_w
    cw = float(rng.uniform(lo, max_w))
    ch = cw / aspect
    x0, y0 = float(rng.uniform(0, w - cw)), float(rng.uniform(0, h - ch))
    out = photo.resize(size, Image.Resampling.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch))
    return ImageOps.mirror(out) if rng.random() < 0.5 else out


def _params(per_class: int) -> dict[str, Any]:
    return {"layout": LAYOUT, "classes": {k: list(v) for k, v in CLASSES.items()},
            "qualities": list(QUALITIES), "per_class": per_class}


def build(cache: Path = DEFAULT_CACHE, per_class: int = PER_CLASS) -> dict[str, Any]:
    """Make the frames (unless the cache already holds them with these parameters) and
    return the manifest."""
    manifest_path = cache / "manifest.json"
    params = _params(per_class)
    if manifest_path.is_file():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if manifest.get("params") == params:
            return manifest
    sources, deb = source_photos(cache)
    photos = [Image.open(p).convert("RGB") for p in sources]
    frames_dir = cache / "frames"
    shutil.rmtree(frames_dir, ignore_errors=True)
    classes: dict[str, Any] = {}
    for ci, (cls, size) in enumerate(CLASSES.items()):
        n = max(4, per_class // 4) if cls == "4k" else per_class
        for qi, quality in enumerate(QUALITIES):
            rng = np.random.default_rng([LAYOUT, ci, qi])
            folder = frames_dir / f"{cls}-q{quality}"
            folder.mkdir(parents=True)
            sizes = []
            for i in range(n):
                k = int(rng.integers(len(photos)))
                img = _frame(photos[k], size, rng)
                buf = io.BytesIO()
                note = f"ktw bench frame {cls} q{quality} #{i} from {sources[k].parts[-4]}"
                img.save(buf, format="JPEG", quality=quality, comment=note)
                (folder / f"{i:04d}.jpg").write_bytes(buf.getvalue())
                sizes.append(len(buf.getvalue()))
            classes[f"{cls}-q{quality}"] = {"class": cls, "size": list(size),
                                            "quality": quality, **size_stats(sizes)}
    manifest = {"params": params, "source_package": deb,
                "source_photos": [p.parts[-4] for p in sources],
                "source_size": [2560, 1600],
                "notes": "random crops (position, scale, photo, mirror) resized with Pillow "
                         "bicubic, 4:2:0 JPEG; 4K stills are upscaled from 16:9 crops of the "
                         "2560x1600 photos (smoother, so smaller, than camera 4K)",
                "sets": classes}
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def size_stats(sizes: list[int]) -> dict[str, Any]:
    return {"n": len(sizes), "min_bytes": min(sizes), "median_bytes": statistics.median(sizes),
            "max_bytes": max(sizes)}


def load(cls: str, quality: int, cache: Path = DEFAULT_CACHE,
         per_class: int = PER_CLASS) -> list[bytes]:
    """The frames of one class at one quality, in order (built first when needed)."""
    build(cache, per_class)
    folder = cache / "frames" / f"{cls}-q{quality}"
    return [p.read_bytes() for p in sorted(folder.glob("*.jpg"))]


def mixed_stream(n: int, quality: int = 85, still_every: int = 30, cache: Path = DEFAULT_CACHE,
                 per_class: int = PER_CLASS) -> list[bytes]:
    """``n`` frames: 720p frames with a 4K still in place of every ``still_every``-th."""
    frames, stills = load("720p", quality, cache, per_class), load("4k", quality, cache, per_class)
    return [stills[(i // still_every) % len(stills)] if i % still_every == still_every - 1
            else frames[i % len(frames)] for i in range(n)]


def stream_record(frames: list[bytes]) -> dict[str, Any]:
    """What a bench record says about the frames it sent: sizes and a digest of the set."""
    digest = hashlib.sha256()
    for f in frames:
        digest.update(hashlib.sha256(f).digest())
    return {**size_stats([len(f) for f in frames]), "distinct": len(set(frames)),
            "sha256_of_sha256s": digest.hexdigest()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--per-class", type=int, default=PER_CLASS)
    args = ap.parse_args()
    manifest = build(args.cache, args.per_class)
    print(f"{manifest['source_package']}: {len(manifest['source_photos'])} photos; "
          f"cache {args.cache}")
    print(f"{'set':12} {'n':>4} {'min B':>9} {'median B':>9} {'max B':>9}")
    for name, s in manifest["sets"].items():
        print(f"{name:12} {s['n']:>4} {s['min_bytes']:>9} {s['median_bytes']:>9.0f} "
              f"{s['max_bytes']:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
